package cli

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgquota/pgquota/quota"
)

// locationVars are the libpq variables that decide where a connection
// goes (the others, PGSSLMODE say, only decide how).
var locationVars = []string{"PGHOST", "PGHOSTADDR", "PGPORT", "PGDATABASE", "PGUSER", "PGSERVICE"}

// settingsSource returns the connection string to parse (empty for the
// PG* variables and libpq's defaults), the name of its source for a parse
// error, and where the settings came from, in words: --database-url, else
// DATABASE_URL, else the libpq PG* variables, else libpq's defaults.
func settingsSource(flagURL string) (dsn, name, settings string) {
	if flagURL != "" {
		return flagURL, "--database-url", "from --database-url"
	}
	if dsn := os.Getenv("DATABASE_URL"); dsn != "" {
		return dsn, "DATABASE_URL", "from DATABASE_URL"
	}
	var set []string
	for _, v := range locationVars {
		if os.Getenv(v) != "" {
			set = append(set, v)
		}
	}
	const pgVars = "the PG* environment variables"
	if len(set) == 0 {
		return "", pgVars, "libpq defaults: no --database-url, DATABASE_URL or PG* variables"
	}
	return "", pgVars, "from " + strings.Join(set, ", ") + ", libpq defaults for the rest"
}

// target describes the database a connection goes to, for the errors that
// depend on it. It never holds a password.
type target struct {
	Database string `json:"database"`
	Host     string `json:"host"`
	User     string `json:"user"`
	// Settings says where the settings came from (settingsSource).
	Settings string `json:"settings"`
}

func newTarget(cfg *pgconn.Config, settings string) target {
	host := cfg.Host
	switch {
	case strings.HasPrefix(host, "/"):
		// A Unix socket directory; the port names the socket file.
		if cfg.Port != 5432 {
			host += " port " + strconv.Itoa(int(cfg.Port))
		}
	default:
		host = net.JoinHostPort(host, strconv.Itoa(int(cfg.Port)))
	}
	database := cfg.Database
	if database == "" {
		// The server's default: the database named like the user.
		database = cfg.User
	}
	return target{Database: database, Host: host, User: cfg.User, Settings: settings}
}

// String reads `database "d" on host:port as user u (from --database-url)`.
func (t target) String() string { return "database " + t.brief() }

// brief is String without the leading "database".
func (t target) brief() string {
	return fmt.Sprintf("%q on %s as user %s (%s)", t.Database, t.Host, t.User, t.Settings)
}

// placeError rewrites the errors whose meaning depends on where pgquota
// connected (a missing or outdated schema, a failed connection) so that
// they name the database, host, user and where those settings came from.
// Other errors, and any error before a connection was configured, come
// back unchanged.
func (a *app) placeError(err error) error {
	if a.target == nil {
		return err
	}
	t := *a.target
	var sv *quota.SchemaVersionError
	switch {
	case errors.As(err, &sv) && len(sv.Missing)+len(sv.Unknown) > 0:
		return fmt.Errorf("%s: %w", t, err)
	case errors.As(err, &sv) && sv.Have == 0:
		return errors.New("schema is missing in " + t.String() + ": run pgquota migrate up there, or point --database-url at your database")
	case errors.As(err, &sv) && sv.Have < sv.Want:
		return fmt.Errorf("schema in %s is at version %d, this build needs %d: run pgquota migrate up", t, sv.Have, sv.Want)
	case errors.Is(err, quota.ErrSchemaMissing):
		return fmt.Errorf("%w (in %s)", err, t)
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		return fmt.Errorf("cannot connect to %s: %s", t, connectReason(ce))
	}
	return err
}

// connectReason is why a connection failed, without pgx's prefix (which
// names user and database again) and without the repeats of a connection
// tried twice (with and without TLS, say).
func connectReason(ce *pgconn.ConnectError) string {
	var pgErr *pgconn.PgError
	if errors.As(ce, &pgErr) {
		return fmt.Sprintf("the server said %s: %s (SQLSTATE %s)", pgErr.Severity, pgErr.Message, pgErr.Code)
	}
	var opErr *net.OpError
	if errors.As(ce, &opErr) {
		return opErr.Error()
	}
	inner := errors.Unwrap(ce)
	if inner == nil {
		return ce.Error()
	}
	var lines []string
	seen := map[string]bool{}
	for _, l := range strings.Split(inner.Error(), "\n") {
		if l = strings.TrimSpace(l); l != "" && !seen[l] {
			seen[l] = true
			lines = append(lines, l)
		}
	}
	return strings.Join(lines, "; ")
}

// urlFor is a URL for database name on the server cfg connects to, as the
// same user, without the password.
func urlFor(cfg *pgconn.Config, name string) string {
	u := url.URL{Scheme: "postgres", User: url.User(cfg.User), Path: "/" + name}
	q := url.Values{}
	if strings.HasPrefix(cfg.Host, "/") {
		q.Set("host", cfg.Host)
		if cfg.Port != 5432 {
			q.Set("port", strconv.Itoa(int(cfg.Port)))
		}
	} else {
		u.Host = net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port)))
	}
	if cfg.TLSConfig == nil {
		q.Set("sslmode", "disable")
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// serviceError explains a failure to read the connection service PGSERVICE
// names (libpq's pg_service.conf): which service, and which files were
// looked in, instead of pgx's "invalid connection string" wording.
func serviceError(err error) error {
	svc := os.Getenv("PGSERVICE")
	file := os.Getenv("PGSERVICEFILE")
	where := "$PGSERVICEFILE"
	if file == "" {
		where = "~/.pg_service.conf"
		if home, herr := os.UserHomeDir(); herr == nil {
			where = home + "/.pg_service.conf"
		}
		if dir := os.Getenv("PGSYSCONFDIR"); dir != "" {
			where += " or " + dir + "/pg_service.conf"
		}
	} else {
		where = file + " (PGSERVICEFILE)"
	}
	return fmt.Errorf("PGSERVICE=%s: the connection service could not be read from the service file %s: %v "+
		"(create the file with a [%s] section of libpq settings such as host=, port=, dbname=, user=, point PGSERVICEFILE at it, "+
		"or unset PGSERVICE and pass --database-url)", svc, where, unwrapAll(err), svc)
}
