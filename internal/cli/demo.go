package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"text/tabwriter"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/pgquota/pgquota/quota"
)

// demoServerURL is the server the demo uses when neither --database-url nor
// DATABASE_URL names one: PostgreSQL on this machine with trust auth, as a
// fresh install of the Debian/Ubuntu or Homebrew package has it for the
// postgres role.
const demoServerURL = "postgres://postgres@localhost:5432/postgres?sslmode=disable"

// demoDefaultURL is demoServerURL with the libpq variables PGHOST, PGPORT,
// PGUSER and PGDATABASE put in place of its host, port, user and database
// where they are set (as every other command honours them), and where the
// URL came from, in words. With PGSERVICE set, the service file decides:
// the URL is empty (libpq's own resolution).
func demoDefaultURL() (string, string) {
	if os.Getenv("PGSERVICE") != "" {
		return "", "PGSERVICE"
	}
	u, _ := url.Parse(demoServerURL)
	var from []string
	host, port := u.Hostname(), u.Port()
	if v := os.Getenv("PGHOST"); v != "" {
		host, from = v, append(from, "PGHOST")
	}
	if v := os.Getenv("PGPORT"); v != "" {
		port, from = v, append(from, "PGPORT")
	}
	u.Host = net.JoinHostPort(host, port)
	if v := os.Getenv("PGUSER"); v != "" {
		u.User, from = url.User(v), append(from, "PGUSER")
	}
	if v := os.Getenv("PGDATABASE"); v != "" {
		u.Path, from = "/"+v, append(from, "PGDATABASE")
	}
	if len(from) == 0 {
		return u.String(), "the demo's default"
	}
	return u.String(), "the demo's default with " + strings.Join(from, ", ")
}

// demoResult is what `pgquota demo --json` prints.
type demoResult struct {
	Database string `json:"database"`
	URL      string `json:"url"`
	Created  bool   `json:"created"`
	Quota    string `json:"quota"`
	Member   string `json:"member"`
	Limit    int64  `json:"limit"`
	Attempts int    `json:"attempts"`
	Granted  int    `json:"granted"`
	Denied   int    `json:"denied"`
	Used     int64  `json:"used"`
}

func (a *app) demoCommand() *cobra.Command {
	var (
		dbName   string
		attempts int
		limit    int64
	)
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Race concurrent grants against a limit on a database of the demo's own, and show that the limit held",
		Long: `demo runs pgquota's main job end to end: it connects to the server of
--database-url, else $DATABASE_URL, else ` + demoServerURL + `
with PGHOST, PGPORT, PGUSER and PGDATABASE in place where they are set,
creates the database pgquota_demo there (or reuses it), applies the migrations,
defines the quota demo-api-calls (a lifetime cap of --limit units per member),
and races --attempts concurrent grants of one unit each for a new member from
two clients, as two replicas of a service would. It prints how many were
granted (exactly the limit) and the commands to go on with.

Remove it with: dropdb -h localhost -U postgres pgquota_demo`,
		Example: `  go run ./cmd/pgquota demo
  pgquota demo --database-url postgres://me@db.internal:5432/postgres --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if attempts < 1 || attempts > 1000 {
				return usagef("--attempts must be 1 to 1000, got %d", attempts)
			}
			if limit < 1 {
				return usagef("--limit must be at least 1, got %d", limit)
			}
			return a.runDemo(cmd.Context(), dbName, attempts, limit)
		},
	}
	cmd.Flags().StringVar(&dbName, "demo-database", "pgquota_demo", "name of the database the demo creates or reuses on the server")
	cmd.Flags().IntVar(&attempts, "attempts", 20, "concurrent grants to race")
	cmd.Flags().Int64Var(&limit, "limit", 5, "the quota's limit per member")
	return cmd
}

func (a *app) runDemo(ctx context.Context, dbName string, attempts int, limit int64) error {
	serverURL, source := a.databaseURL, "--database-url"
	if serverURL == "" {
		serverURL, source = os.Getenv("DATABASE_URL"), "DATABASE_URL"
	}
	if serverURL == "" {
		serverURL, source = demoDefaultURL()
	}
	admin, err := pgx.ParseConfig(serverURL)
	if err != nil {
		return usagef("invalid %s: %v (expected a URL like postgres://user@host:5432/dbname)", source, unwrapAll(err))
	}
	admin.ConnectTimeout = a.connectTimeout
	where := fmt.Sprintf("user %q on %s:%d (%s)", admin.User, admin.Host, admin.Port, source)
	conn, err := pgx.ConnectConfig(ctx, admin)
	if err != nil {
		return fmt.Errorf("demo: connect as %s: %w (the demo needs a PostgreSQL server it may create a database on: "+
			"start one on localhost with trust auth for the postgres role, or pass --database-url)", where, err)
	}
	created, err := ensureDatabase(ctx, conn, dbName)
	_ = conn.Close(context.WithoutCancel(ctx))
	if err != nil {
		return fmt.Errorf("demo: create database %q as %s: %w", dbName, where, err)
	}

	cfg, err := pgxpool.ParseConfig(serverURL)
	if err != nil {
		return usagef("invalid %s: %v", source, unwrapAll(err))
	}
	cfg.ConnConfig.Database = dbName
	cfg.ConnConfig.ConnectTimeout = a.connectTimeout
	cfg.MaxConns = 8
	if err := a.configurePooler(serverURL, cfg); err != nil {
		return err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("demo: connect to %q: %w", dbName, err)
	}
	defer pool.Close()

	var clients [2]*quota.Client
	for i := range clients {
		if clients[i], err = quota.New(pool, &quota.Config{Pooler: a.poolerMode}); err != nil {
			return err
		}
	}
	if err := clients[0].Migrate(ctx); err != nil {
		return fmt.Errorf("demo: migrate %q: %w", dbName, err)
	}
	const quotaName = "demo-api-calls"
	if _, err := clients[0].DefineQuota(ctx, quota.Definition{Name: quotaName, Window: quota.WindowNone, DefaultLimit: &limit}); err != nil {
		return fmt.Errorf("demo: define quota: %w", err)
	}
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	member := "customer-" + hex.EncodeToString(suffix)

	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		granted int
		errs    []error
		start   = make(chan struct{})
	)
	for i := range attempts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			res, err := clients[i%2].Grant(ctx, quota.GrantRequest{Quota: quotaName, Member: member, Amount: 1})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
			} else if res.Granted {
				granted++
			}
		}()
	}
	close(start)
	wg.Wait()
	if len(errs) > 0 {
		return fmt.Errorf("demo: %d of %d grants failed, the first: %w", len(errs), attempts, errs[0])
	}
	usage, err := clients[0].Usage(ctx, quotaName, member)
	if err != nil {
		return fmt.Errorf("demo: read usage: %w", err)
	}
	res := demoResult{
		Database: dbName, URL: redactedURL(serverURL, dbName), Created: created,
		Quota: quotaName, Member: member, Limit: limit,
		Attempts: attempts, Granted: granted, Denied: attempts - granted, Used: usage.Used,
	}
	if err := a.output(res, func(w *tabwriter.Writer) {
		verb := "reused"
		if created {
			verb = "created"
		}
		row(w, "database", fmt.Sprintf("%s (%s, migrated)", dbName, verb))
		row(w, "quota", fmt.Sprintf("%s, limit %d per member", quotaName, limit))
		row(w, "member", member)
		row(w, "concurrent grants", fmt.Sprintf("%d, of 1 unit each, from 2 clients", attempts))
		row(w, "granted", granted)
		row(w, "denied", attempts-granted)
		row(w, "counter", fmt.Sprintf("%d of %d", usage.Used, limit))
	}); err != nil {
		return err
	}
	if res.Granted != int(min(limit, int64(attempts))) || usage.Used != int64(res.Granted) {
		return fmt.Errorf("demo: the limit did not hold: %d granted, counter %d, limit %d", res.Granted, usage.Used, limit)
	}
	if !a.json {
		u := redactedURL(serverURL, dbName)
		fmt.Fprintf(a.stdout, `
The limit held: every grant was one conditional UPDATE, so no two callers
passed the same check. Go on with:

  export DATABASE_URL='%s'
  go run ./cmd/pgquota usage --quota %s --member %s
  go run ./cmd/pgquota grant --quota %s --member %s   # denied: exit status 3
  go run ./cmd/pgquota --help
  make test                                        # run the test suite
  dropdb -h %s -p %d -U %s %s   # remove the demo's database
`, u, quotaName, member, quotaName, member, admin.Host, admin.Port, admin.User, dbName)
	}
	return nil
}

// ensureDatabase creates database name unless it exists; created reports
// whether this call made it.
func ensureDatabase(ctx context.Context, conn *pgx.Conn, name string) (created bool, err error) {
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, name).Scan(&exists); err != nil {
		return false, err
	}
	if exists {
		return false, nil
	}
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P04" { // created meanwhile
		return false, nil
	}
	return err == nil, err
}

// redactedURL is serverURL with its database replaced by dbName and any
// password removed, for printing.
func redactedURL(serverURL, dbName string) string {
	u, err := url.Parse(serverURL)
	if err != nil || u.Scheme == "" {
		return "postgres:///" + dbName
	}
	if u.User != nil {
		u.User = url.User(u.User.Username())
	}
	u.Path = "/" + dbName
	return u.String()
}
