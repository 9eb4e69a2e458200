// Package testdb holds what the two builders of migrated test databases,
// internal/pgtest (pgquota's own suite) and quota/quotatest (for
// applications), share. It depends on pgquota's migrations and the
// standard library only, so that quotatest keeps its small dependency
// surface.
package testdb

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"

	"github.com/pgquota/pgquota/migrations"
)

// MigrationsHash names this build's migrations, for the name of the
// template database they are migrated into: the first 16 hexadecimal
// digits of a SHA-256 over the names, lengths and contents of
// migrations.FS.
func MigrationsHash() (string, error) {
	h := sha256.New()
	err := fs.WalkDir(migrations.FS, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(migrations.FS, path)
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s\x00%d\x00", path, len(b))
		h.Write(b)
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("hash the migrations: %w", err)
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}
