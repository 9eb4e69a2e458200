package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// PgbenchResult is what one pgbench run reported.
type PgbenchResult struct {
	// Transactions is pgbench's "number of transactions actually
	// processed"; TPS its tps (without initial connection time).
	Transactions int64   `json:"transactions"`
	TPS          float64 `json:"tps"`
	// Latency is computed from pgbench's per-transaction log (-l).
	Latency
	// Failed is pgbench's "number of failed transactions"; Retries its
	// "total number of retries".
	Failed  int64 `json:"failed"`
	Retries int64 `json:"retries"`
	// CPUMicrosPerOp is pgbench's CPU time (user + system) per
	// transaction, connection and log writing included.
	CPUMicrosPerOp float64 `json:"cpu_us_per_op"`
	// ConnectMS is pgbench's "initial connection time".
	ConnectMS float64 `json:"connect_ms"`
	// Command is the command line that ran (password not included).
	Command string `json:"command"`
	// Note says why the figures are missing or doubtful, when they are.
	Note string `json:"note"`
}

// PgbenchOptions say how to run pgbench.
type PgbenchOptions struct {
	// Path is the pgbench binary. Defaults to "pgbench" on $PATH.
	Path string
	// Clients is pgbench -c; Threads is -j (default min(Clients, NumCPU)).
	Clients int
	Threads int
	// Duration is pgbench -T, in whole seconds. Transactions, when not 0,
	// is -t (per client) instead.
	Duration     time.Duration
	Transactions int
	// Conn is where pgbench connects: host, port, user, password and
	// database are passed in the PG* environment variables.
	Conn *pgconn.Config
	// Dir holds the script and the logs. Defaults to a temporary directory
	// that is removed afterwards.
	Dir string
}

// LookPgbench returns the path of pgbench, or an error that says it is
// missing.
func LookPgbench(path string) (string, error) {
	if path == "" {
		path = "pgbench"
	}
	p, err := exec.LookPath(path)
	if err != nil {
		return "", fmt.Errorf("pgbench not found (%v): install PostgreSQL's client tools, or give --pgbench-path", err)
	}
	return p, nil
}

// pgbenchEnv returns the environment for a pgbench run against conn: the
// process's own, with the connection in PG* variables and the bench's
// session settings in PGOPTIONS.
func pgbenchEnv(conn *pgconn.Config) []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		switch name {
		case "PGHOST", "PGHOSTADDR", "PGPORT", "PGUSER", "PGPASSWORD", "PGDATABASE", "PGSSLMODE",
			"PGOPTIONS", "PGAPPNAME", "PGSERVICE", "PGCONNECT_TIMEOUT":
			continue
		}
		env = append(env, kv)
	}
	sslmode := "disable"
	if conn.TLSConfig != nil {
		sslmode = "require"
		for _, fb := range conn.Fallbacks {
			if fb.TLSConfig == nil {
				sslmode = "prefer"
			}
		}
	}
	var opts []string
	for k, v := range sessionParams {
		opts = append(opts, "-c "+k+"="+v)
	}
	env = append(env,
		"PGHOST="+conn.Host,
		"PGPORT="+strconv.Itoa(int(conn.Port)),
		"PGUSER="+conn.User,
		"PGDATABASE="+conn.Database,
		"PGSSLMODE="+sslmode,
		"PGOPTIONS="+strings.Join(opts, " "),
		"PGAPPNAME=pgquota bench (pgbench)",
	)
	if conn.Password != "" {
		env = append(env, "PGPASSWORD="+conn.Password)
	}
	return env
}

var (
	reProcessed = regexp.MustCompile(`(?m)^number of transactions actually processed: (\d+)`)
	reFailed    = regexp.MustCompile(`(?m)^number of failed transactions: (\d+)`)
	reRetries   = regexp.MustCompile(`(?m)^total number of retries: (\d+)`)
	reTPS       = regexp.MustCompile(`(?m)^tps = ([0-9.]+)`)
	reConnect   = regexp.MustCompile(`(?m)^initial connection time = ([0-9.]+) ms`)
)

// RunPgbench runs script with pgbench -M prepared and returns its figures.
func RunPgbench(ctx context.Context, script *Script, opt PgbenchOptions) (PgbenchResult, error) {
	path, err := LookPgbench(opt.Path)
	if err != nil {
		return PgbenchResult{}, err
	}
	dir := opt.Dir
	if dir == "" {
		dir, err = os.MkdirTemp("", "pgquota-pgbench-")
		if err != nil {
			return PgbenchResult{}, err
		}
		defer os.RemoveAll(dir)
	}
	scriptPath := filepath.Join(dir, script.Strategy+".sql")
	if err := os.WriteFile(scriptPath, []byte(script.Text), 0o644); err != nil {
		return PgbenchResult{}, err
	}
	threads := opt.Threads
	if threads <= 0 {
		threads = min(opt.Clients, runtime.NumCPU())
	}
	logPrefix := filepath.Join(dir, "log-"+script.Strategy)
	args := []string{
		"--no-vacuum", "--protocol=prepared",
		"--client=" + strconv.Itoa(opt.Clients),
		"--jobs=" + strconv.Itoa(threads),
		"--file=" + scriptPath,
		"--log", "--log-prefix=" + logPrefix,
	}
	if opt.Transactions > 0 {
		args = append(args, "--transactions="+strconv.Itoa(opt.Transactions))
	} else {
		secs := opt.Duration.Seconds()
		if secs < 1 || secs != float64(int(secs)) {
			return PgbenchResult{}, fmt.Errorf("pgbench runs for whole seconds: %s is not one", opt.Duration)
		}
		args = append(args, "--time="+strconv.Itoa(int(secs)))
	}
	switch {
	case script.MaxTries < 0 && opt.Transactions > 0:
		// pgbench allows "without limit" only with a duration.
		args = append(args, "--max-tries=1000000")
	case script.MaxTries < 0:
		args = append(args, "--max-tries=0")
	case script.MaxTries > 1:
		args = append(args, "--max-tries="+strconv.Itoa(script.MaxTries))
	}
	for _, d := range script.Defines {
		args = append(args, "--define="+d)
	}
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Env = pgbenchEnv(opt.Conn)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	res := PgbenchResult{Command: "pgbench " + strings.Join(args, " ")}
	if err := cmd.Run(); err != nil {
		return res, fmt.Errorf("pgbench: %w: %s", err, lastLines(stderr.String(), 3))
	}
	out := stdout.String()
	m := reProcessed.FindStringSubmatch(out)
	if m == nil {
		return res, fmt.Errorf("pgbench printed no transaction count: %s", lastLines(out+stderr.String(), 3))
	}
	res.Transactions, _ = strconv.ParseInt(m[1], 10, 64)
	if m := reTPS.FindStringSubmatch(out); m != nil {
		res.TPS, _ = strconv.ParseFloat(m[1], 64)
	}
	if m := reFailed.FindStringSubmatch(out); m != nil {
		res.Failed, _ = strconv.ParseInt(m[1], 10, 64)
	}
	if m := reRetries.FindStringSubmatch(out); m != nil {
		res.Retries, _ = strconv.ParseInt(m[1], 10, 64)
	}
	if m := reConnect.FindStringSubmatch(out); m != nil {
		res.ConnectMS, _ = strconv.ParseFloat(m[1], 64)
	}
	if st := cmd.ProcessState; st != nil && res.Transactions > 0 {
		res.CPUMicrosPerOp = float64((st.UserTime() + st.SystemTime()).Microseconds()) / float64(res.Transactions)
	}
	if res.Transactions == 0 {
		run := "its run"
		if opt.Transactions == 0 {
			run = "its " + opt.Duration.String() + " run"
		}
		res.Note = fmt.Sprintf("pgbench completed no transaction in %s (opening its %d connections took %.0f ms of it): "+
			"the machine is likely overloaded; try a longer --duration, fewer --clients, or a quieter machine",
			run, opt.Clients, res.ConnectMS)
	}
	// pgbench aborts a client on an error it does not retry and still
	// exits 0 when others ran; say so instead of reporting a partial run.
	if strings.Contains(stderr.String(), "aborted") {
		return res, fmt.Errorf("pgbench: a client aborted: %s", lastLines(stderr.String(), 3))
	}
	lat, err := readPgbenchLogs(dir, filepath.Base(logPrefix))
	if err != nil {
		return res, err
	}
	res.Latency = percentiles(lat)
	return res, nil
}

// readPgbenchLogs reads the latencies (third field, microseconds) of the
// per-transaction logs pgbench wrote under dir with the given prefix;
// failed and skipped transactions are left out.
func readPgbenchLogs(dir, prefix string) ([]time.Duration, error) {
	files, err := filepath.Glob(filepath.Join(dir, prefix+".*"))
	if err != nil {
		return nil, err
	}
	var lat []time.Duration
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 3 {
				continue
			}
			us, err := strconv.ParseInt(fields[2], 10, 64)
			if err != nil {
				continue
			}
			lat = append(lat, time.Duration(us)*time.Microsecond)
		}
		err = sc.Err()
		fh.Close()
		if err != nil {
			return nil, err
		}
	}
	return lat, nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}
