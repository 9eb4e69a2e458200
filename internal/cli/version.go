package cli

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/pgquota/pgquota/migrations"
)

// buildVersion is the module version this binary was built from, as Go's
// build info records it (v1.2.3 for go install ...@v1.2.3, a pseudo-version
// for a build in a git checkout), or "devel" when it records none.
func buildVersion() string {
	info, ok := debug.ReadBuildInfo()
	if !ok || info.Main.Version == "" || info.Main.Version == "(devel)" {
		return "devel"
	}
	return info.Main.Version
}

// versionInfo is what `pgquota version` prints.
type versionInfo struct {
	Version string `json:"version"`
	Go      string `json:"go_version"`
	// Schema is the migration version this build needs (migrations.Latest).
	Schema int64 `json:"schema_version"`
}

func currentVersion() versionInfo {
	return versionInfo{Version: buildVersion(), Go: runtime.Version(), Schema: migrations.Latest()}
}

// versionLine is --version's output.
func versionLine() string {
	v := currentVersion()
	return fmt.Sprintf("pgquota %s (%s), needs schema version %d\n", v.Version, v.Go, v.Schema)
}

func (a *app) versionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print pgquota's version and the schema (migration) version it needs",
		Long: `Print the version of this pgquota build (from Go's build info: a release
tag, a pseudo-version for a build in a git checkout, or "devel") and the
migration version it needs. It does not connect: 'pgquota migrate version'
prints the database's.`,
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			v := currentVersion()
			return a.output(v, func(w *tabwriter.Writer) {
				row(w, "pgquota", v.Version)
				row(w, "go", v.Go)
				row(w, "schema version", fmt.Sprintf("%d (pgquota migrate up applies it)", v.Schema))
			})
		},
	}
}
