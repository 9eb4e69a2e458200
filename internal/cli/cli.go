// Package cli implements the pgquota command. Run is the whole program:
// main only wires it to the process, so tests call Run with buffers.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/pgquota/pgquota/internal/errtext"
	"github.com/pgquota/pgquota/quota/voucher"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"
	"go.opentelemetry.io/otel/metric"

	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/fence"
	"github.com/pgquota/pgquota/quota/lease"
)

// Exit statuses.
const (
	ExitOK     = 0 // success, or granted
	ExitError  = 1 // any other error
	ExitUsage  = 2 // usage error or bad input
	ExitDenied = 3 // denied: limit reached, sold out, lease held, lease lost, stale token
	// ExitOutcomeUnknown: the request was sent and no reply said how it
	// ended (quota.ErrOutcomeUnknown): it may have been applied. Do not
	// repeat it blindly; stderr says how to learn the outcome.
	ExitOutcomeUnknown = 4
)

// app is the state shared by every command of one Run.
type app struct {
	stdout, stderr io.Writer

	databaseURL    string
	json           bool
	connectTimeout time.Duration
	// poolSize, when above 4, is the size of the pool connect opens.
	poolSize int
	// pooler is --pooler as given (else $PGQUOTA_POOLER); poolerMode is
	// what connect parsed it to.
	pooler     string
	poolerMode quota.PoolerMode

	pool   *pgxpool.Pool
	client *quota.Client
	// leases is client's lease client (leaseClient).
	leases *lease.Client
	// meterProvider, set by --metrics-addr (startMetrics), is the client's
	// Config.MeterProvider.
	meterProvider metric.MeterProvider
	// target is where pool connects, once connect configured it.
	target *target
}

// usageError marks an error that exits with ExitUsage.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error {
	return usageError{fmt.Errorf(format, args...)}
}

// errDenied makes a command exit with ExitDenied after it printed its
// result.
var errDenied = errors.New("denied")

// Run runs the pgquota command line args (without the program name),
// writing output to stdout and errors to stderr, and returns the exit
// status.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	a := &app{stdout: stdout, stderr: stderr}
	defer func() {
		if a.pool != nil {
			a.pool.Close()
		}
	}()
	root := a.rootCommand()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return ExitOK
	}
	if errors.Is(err, errDenied) {
		return ExitDenied
	}
	if errors.Is(err, quota.ErrOutcomeUnknown) {
		a.printError(err, ExitOutcomeUnknown, outcomeUnknownLine(cmd)+" ("+oneLine(strings.TrimPrefix(a.placeError(err).Error(), "pgquota: "))+")")
		return ExitOutcomeUnknown
	}
	msg := a.placeError(err).Error() + hint(err)
	code := ExitError
	var ue usageError
	switch {
	case errors.As(err, &ue), isCobraUsageError(err), isBadInput(err):
		code = ExitUsage
	}
	a.printError(err, code, oneLine(strings.TrimPrefix(msg, "pgquota: ")))
	return code
}

// errorJSON is the one object `--json` prints on stderr for a failed
// command. Code names the exit status (usage, error, outcome_unknown);
// SQLState is quota.SQLState's code: the PostgreSQL error code when the
// failure came from the server, PQ010 for an unknown quota (as
// pgquota.grant raises in SQL) also when the library learnt it from an
// empty read, else null.
type errorJSON struct {
	Code       string  `json:"code"`
	ExitStatus int     `json:"exit_status"`
	Message    string  `json:"message"`
	SQLState   *string `json:"sqlstate"`
}

// printError prints a failed command's one line on stderr: "pgquota: msg",
// or with --json one errorJSON object.
func (a *app) printError(err error, code int, msg string) {
	// One "pgquota: " prefix: the line's own, none from the wrapped errors.
	msg = strings.TrimPrefix(errtext.OnePrefix(errtext.Prefix+msg), errtext.Prefix)
	if !a.json {
		fmt.Fprintln(a.stderr, "pgquota: "+msg)
		return
	}
	e := errorJSON{Code: "error", ExitStatus: code, Message: msg}
	switch code {
	case ExitUsage:
		e.Code = "usage"
	case ExitOutcomeUnknown:
		e.Code = "outcome_unknown"
	}
	if code := quota.SQLState(err); code != "" {
		e.SQLState = &code
	}
	b, _ := jsonValue(e, "")
	_, _ = a.stderr.Write(b)
}

// outcomeUnknownLine says, for the command cmd that failed with
// quota.ErrOutcomeUnknown, what may have happened and how to learn it.
func outcomeUnknownLine(cmd *cobra.Command) string {
	path, key := "", ""
	if cmd != nil {
		path = strings.TrimPrefix(cmd.CommandPath(), "pgquota ")
		if f := cmd.Flags().Lookup("idempotency-key"); f != nil {
			key = f.Value.String()
		}
	}
	switch path {
	case "grant", "revoke":
		if key != "" {
			return "outcome unknown: the " + path + " may have been applied; repeat with --idempotency-key " + key + " (the same command) to learn its outcome"
		}
		return "outcome unknown: the " + path + " may have been applied; a repeat without --idempotency-key may apply it twice: read the counter with pgquota usage (next time, give --idempotency-key so that a repeat tells)"
	case "voucher claim":
		return "outcome unknown: the claim may have been applied; repeat it for the same member to learn its voucher (a member holds at most one)"
	case "lease acquire":
		return "outcome unknown: the lease may have been acquired; pgquota lease show tells who holds it"
	case "lease renew", "lease release":
		return "outcome unknown: the " + strings.TrimPrefix(path, "lease ") + " may have been applied; repeating it with the same token is harmless"
	case "fence write":
		return "outcome unknown: the write may have landed; pgquota fence show shows the row"
	case "outbox enqueue":
		return "outcome unknown: the event may have been enqueued; pgquota outbox list shows it (a repeat may enqueue it twice)"
	}
	return "outcome unknown: the command's change may have been applied; check the state before repeating it"
}

// hint returns what to do about an error that names something the
// database does not have, or "".
func hint(err error) string {
	switch {
	case errors.Is(err, quota.ErrQuotaNotFound):
		return " (define it with pgquota quota define; pgquota quota list shows the quotas)"
	case errors.Is(err, voucher.ErrCampaignNotFound):
		return " (create it with pgquota voucher create, or import codes into it with pgquota voucher import)"
	}
	return ""
}

// isBadInput reports errors that say the command named something wrong:
// they exit with ExitUsage like a malformed flag.
func isBadInput(err error) bool {
	for _, target := range []error{
		quota.ErrInvalidInput, quota.ErrQuotaNotFound, quota.ErrNoLimit, quota.ErrQuotaKindChange,
		voucher.ErrCampaignNotFound, voucher.ErrCampaignExists,
		lease.ErrNotFound,
		quota.ErrIdempotencyKeyReused, quota.ErrGrantNotFound,
	} {
		if errors.Is(err, target) {
			return true
		}
	}
	return false
}

// oneLine keeps error output to one line.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// isCobraUsageError recognises the errors cobra and pflag return for bad
// command lines, which carry no type of their own.
func isCobraUsageError(err error) bool {
	msg := err.Error()
	for _, prefix := range []string{
		"unknown command", "unknown flag", "unknown shorthand flag", "invalid argument",
		"required flag", "flag needs an argument", "accepts ", "requires at least", "bad flag syntax",
		"if any flags in the group",
	} {
		if strings.HasPrefix(msg, prefix) || strings.Contains(msg, " "+prefix) {
			return true
		}
	}
	return false
}

func (a *app) rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "pgquota",
		Short: "Make check-then-act safe on PostgreSQL: quotas, vouchers, leases and fencing tokens",
		Long: `pgquota grants quota, hands out vouchers and issues fencing tokens on PostgreSQL,
so that a limit checked by one statement still holds when the write lands.

Connection: --database-url, else $DATABASE_URL, else the libpq PG* variables
(PGHOST, PGPORT, PGUSER, PGDATABASE, ...), else libpq's defaults (the local
socket, your OS user, the database named like it). Errors that depend on
where pgquota connected name the database, host and user it used.
Behind a pooler in transaction mode (PgBouncer's pool_mode = transaction)
pass --pooler transaction or set PGQUOTA_POOLER=transaction: no LISTEN, no
session state, pgx's exec mode.

Exit status: 0 success or granted; 3 denied (limit reached, sold out, lease
held, lease lost, stale token); 2 usage error or bad input; 4 outcome unknown
(the request was sent and no reply said how it ended: it may have been
applied); 1 any other error.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       buildVersion(),
	}
	root.SetVersionTemplate(versionLine())
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	pf := root.PersistentFlags()
	pf.StringVar(&a.databaseURL, "database-url", "", "PostgreSQL URL (default $DATABASE_URL, else the libpq PG* variables)")
	pf.BoolVar(&a.json, "json", false, "print JSON instead of aligned text")
	pf.DurationVar(&a.connectTimeout, "connect-timeout", 10*time.Second, "give up connecting after this long")
	pf.StringVar(&a.pooler, "pooler", "", "what sits in front of PostgreSQL: none, or transaction for a transaction-mode pooler such as PgBouncer (no LISTEN, no session state, pgx exec mode) (default $"+quota.EnvPooler+", else none)")
	// cobra prints versionLine for --version; declared here for its usage.
	root.Flags().Bool("version", false, "print pgquota's version and the schema version it needs, then exit")

	root.AddCommand(
		needsSubcommand(a.migrateCommand()),
		needsSubcommand(a.quotaCommand()),
		a.grantCommand(),
		a.revokeCommand(),
		a.compensateCommand(),
		a.usageCommand(),
		needsSubcommand(a.voucherCommand()),
		needsSubcommand(a.leaseCommand()),
		needsSubcommand(a.slotCommand()), // slot.go
		needsSubcommand(a.electionCommand()),
		needsSubcommand(a.fenceCommand()),
		a.labCommand(),
		a.benchCommand(),
		needsSubcommand(a.ledgerCommand()),
		needsSubcommand(a.outboxCommand()),
		a.demoCommand(),
		a.versionCommand(),
	)
	return root
}

// needsSubcommand makes a command group (migrate, quota, voucher) a usage
// error when it is run without a subcommand or with an unknown one. Left
// alone, cobra prints the group's help and exits 0 for both, so a mistyped
// `pgquota migrate upp` in a deploy script would pass silently.
func needsSubcommand(cmd *cobra.Command) *cobra.Command {
	cmd.Args = func(c *cobra.Command, args []string) error {
		if len(args) > 0 {
			return usagef("unknown command %q for %q", args[0], c.CommandPath())
		}
		return nil
	}
	cmd.RunE = func(c *cobra.Command, _ []string) error {
		var names []string
		for _, sub := range c.Commands() {
			if sub.IsAvailableCommand() {
				names = append(names, sub.Name())
			}
		}
		return usagef("%s needs a subcommand: %s (see %s --help)", c.Name(), strings.Join(names, ", "), c.CommandPath())
	}
	return cmd
}

// connect opens the pool on first use.
func (a *app) connect(ctx context.Context) (*pgxpool.Pool, error) {
	if a.pool != nil {
		return a.pool, nil
	}
	dsn, source, settings := settingsSource(a.databaseURL)
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil && dsn == "" && os.Getenv("PGSERVICE") != "" {
		return nil, usageError{serviceError(err)}
	}
	if err != nil {
		return nil, usagef("invalid %s: %v (expected a URL like postgres://user@host:5432/dbname, or libpq key=value settings)", source, unwrapAll(err))
	}
	if err := a.configurePooler(dsn, cfg); err != nil {
		return nil, err
	}
	if cfg.ConnConfig.ConnectTimeout == 0 || cfg.ConnConfig.ConnectTimeout > a.connectTimeout {
		cfg.ConnConfig.ConnectTimeout = a.connectTimeout
	}
	t := newTarget(&cfg.ConnConfig.Config, settings)
	a.target = &t
	cfg.MaxConns = int32(max(4, a.poolSize))
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	a.pool = pool
	return pool, nil
}

// configurePooler reads --pooler (else $PGQUOTA_POOLER). Behind a
// transaction pooler it sets pgx's exec mode (no prepared statements, one
// round trip per statement) unless the connection string chose a mode, and
// refuses a chosen mode that is unsafe there.
func (a *app) configurePooler(dsn string, cfg *pgxpool.Config) error {
	setting, source := a.pooler, "--pooler"
	if setting == "" {
		setting, source = os.Getenv(quota.EnvPooler), "$"+quota.EnvPooler
	}
	mode, err := quota.ParsePoolerMode(source, setting)
	if err != nil {
		return usageError{err}
	}
	a.poolerMode = mode
	if mode != quota.PoolerTransaction {
		return nil
	}
	if !strings.Contains(dsn, "default_query_exec_mode") {
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	}
	if err := mode.CheckExecMode(cfg.ConnConfig.DefaultQueryExecMode); err != nil {
		return usagef("%s=%s: %w (or leave default_query_exec_mode out of the connection string: pgquota then uses exec)", source, setting, err)
	}
	return nil
}

// quotaClient connects and checks that the schema is migrated.
func (a *app) quotaClient(ctx context.Context) (*quota.Client, error) {
	if a.client != nil {
		return a.client, nil
	}
	pool, err := a.connect(ctx)
	if err != nil {
		return nil, err
	}
	client, err := quota.New(pool, &quota.Config{Pooler: a.poolerMode, MeterProvider: a.meterProvider})
	if err != nil {
		return nil, err
	}
	if err := client.CheckSchema(ctx); err != nil {
		var sv *quota.SchemaVersionError
		if !errors.As(err, &sv) || errors.Is(err, quota.ErrSchemaMissing) || errors.Is(err, quota.ErrSchemaGap) {
			return nil, err
		}
		// A newer schema than this build knows still serves it.
		fmt.Fprintf(a.stderr, "pgquota: warning: schema in %s is at version %d, newer than this build of pgquota (%d): upgrade pgquota\n",
			a.target, sv.Have, sv.Want)
	}
	a.client = client
	return client, nil
}

// leaseClient is quotaClient's lease client (package lease).
func (a *app) leaseClient(ctx context.Context) (*lease.Client, error) {
	if a.leases != nil {
		return a.leases, nil
	}
	qc, err := a.quotaClient(ctx)
	if err != nil {
		return nil, err
	}
	if a.leases, err = lease.New(qc); err != nil {
		return nil, err
	}
	return a.leases, nil
}

// fenceClient is quotaClient's fence client (package fence).
func (a *app) fenceClient(ctx context.Context) (*fence.Client, error) {
	qc, err := a.quotaClient(ctx)
	if err != nil {
		return nil, err
	}
	return fence.New(qc)
}

// unwrapAll returns the innermost error's text: pgx's parse errors repeat
// the whole connection string, which may hold a password.
func unwrapAll(err error) error {
	for {
		next := errors.Unwrap(err)
		if next == nil {
			return err
		}
		err = next
	}
}
