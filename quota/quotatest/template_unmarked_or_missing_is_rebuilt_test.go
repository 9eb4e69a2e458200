package quotatest

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pgquota/pgquota/internal/testdb"
)

// recordingTB records Fatalf and stops the calling goroutine, as testing.T does.
type recordingTB struct {
	testing.TB
	mu       sync.Mutex
	fatal    string
	cleanups []func()
}

func (f *recordingTB) Helper() {}
func (f *recordingTB) Fatalf(format string, args ...any) {
	f.mu.Lock()
	f.fatal = fmt.Sprintf(format, args...)
	f.mu.Unlock()
	runtime.Goexit()
}
func (f *recordingTB) Errorf(format string, args ...any) { f.Fatalf(format, args...) }
func (f *recordingTB) Cleanup(fn func()) {
	f.mu.Lock()
	f.cleanups = append(f.cleanups, fn)
	f.mu.Unlock()
}
func (f *recordingTB) end() {
	for i := len(f.cleanups) - 1; i >= 0; i-- {
		f.cleanups[i]()
	}
}

func (f *recordingTB) newDatabase() *Database {
	var db *Database
	done := make(chan struct{})
	go func() { defer close(done); db = NewDatabase(f, WithMaxConns(1)) }()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		panic("NewDatabase did not return")
	}
	return db
}

func adminExec(t *testing.T, sql string) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, os.Getenv(EnvURL))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// The state a process killed between ensureTemplate's RENAME and its ALTER
// DATABASE ... IS_TEMPLATE true leaves, and the state of a server where
// someone ran the first of the two statements the package documentation
// gives for dropping a template ("ALTER DATABASE ... IS_TEMPLATE false
// first") but not the DROP: a database of the template's name that is not
// marked a template. Every later NewDatabase, in every run, should still
// get a database; it fails instead ("database ... already exists" at the
// rename), and the migrated _build copy is left behind each time.
func TestNewDatabaseSurvivesATemplateThatIsNotMarkedTemplate(t *testing.T) {
	f := &recordingTB{}
	if f.newDatabase() == nil {
		t.Fatalf("first NewDatabase: %s", f.fatal)
	}
	f.end()
	hash, err := testdb.MigrationsHash()
	if err != nil {
		t.Fatal(err)
	}
	tpl := pgx.Identifier{"pgquotatest_tpl_" + hash}.Sanitize()
	adminExec(t, `ALTER DATABASE `+tpl+` WITH IS_TEMPLATE false`)
	t.Cleanup(func() {
		// put the server back as it was for the other tests
		adminExec(t, `ALTER DATABASE `+tpl+` WITH IS_TEMPLATE true ALLOW_CONNECTIONS false`)
	})

	f = &recordingTB{}
	db := f.newDatabase()
	defer f.end()
	if db == nil {
		t.Fatalf("NewDatabase after the template lost its template mark: %s", f.fatal)
	}
}

// Many callers at once on a server without the template (the first run of
// a CI job that runs its tests in parallel): each gets a database, and the
// template is built once.
func TestNewDatabaseConcurrentFirstCallsAllSucceed(t *testing.T) {
	hash, err := testdb.MigrationsHash()
	if err != nil {
		t.Fatal(err)
	}
	tpl := pgx.Identifier{"pgquotatest_tpl_" + hash}.Sanitize()
	adminExec(t, `DO $$ BEGIN IF EXISTS (SELECT FROM pg_database WHERE datname = 'pgquotatest_tpl_`+hash+`') THEN
		EXECUTE 'ALTER DATABASE `+tpl+` WITH IS_TEMPLATE false'; END IF; END $$`)
	adminExec(t, `DROP DATABASE IF EXISTS `+tpl+` WITH (FORCE)`)

	const n = 12
	tbs := make([]*recordingTB, n)
	var wg sync.WaitGroup
	for i := range tbs {
		tbs[i] = &recordingTB{}
		wg.Add(1)
		go func(f *recordingTB) { defer wg.Done(); f.newDatabase() }(tbs[i])
	}
	wg.Wait()
	for i, f := range tbs {
		f.end()
		if f.fatal != "" {
			t.Errorf("caller %d: %s", i, f.fatal)
		}
	}
}
