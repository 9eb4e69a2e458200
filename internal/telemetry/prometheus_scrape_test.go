package telemetry_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/cli"
	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/internal/svcproc"
	"github.com/pgquota/pgquota/internal/telemetry"
	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/fence"
	"github.com/pgquota/pgquota/quota/lease"
	"github.com/pgquota/pgquota/quota/outbox"
)

// prometheusBin is Debian's prometheus (apt-get install prometheus), or
// $PGQUOTA_PROMETHEUS.
func prometheusBin(t *testing.T) string {
	t.Helper()
	bin := os.Getenv("PGQUOTA_PROMETHEUS")
	if bin == "" {
		bin = "/usr/bin/prometheus"
		if p, err := exec.LookPath("prometheus"); err == nil {
			bin = p
		}
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("prometheus is missing (%v): install Debian's package (apt-get install prometheus) or set PGQUOTA_PROMETHEUS to the binary", err)
	}
	return bin
}

// A real Prometheus scrapes, every second, a grant workload (an in-process
// Client with its /metrics server) and `pgquota outbox relay
// --metrics-addr` (the command, run in-process); its query API then shows
// exactly the workload: 300 granted and 200 denied of 500 grants on a limit
// of 300, 300 units, 3 stale writes refused and 2 written, 7 events
// delivered and none pending, and both targets up and healthy.
func TestPrometheusScrapesTheWorkloadExactly(t *testing.T) {
	bin := prometheusBin(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dbURL := pgtest.NewURL(t)
	pool := pgtest.Connect(t, dbURL, 16)

	// The grant workload, on a client recording into its own provider.
	p, err := telemetry.NewProvider()
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Shutdown(context.Background()) })
	c, err := quota.New(pool, &quota.Config{MeterProvider: p})
	require.NoError(t, err)
	grants, err := telemetry.Serve("127.0.0.1:0", p, c.CheckSchema)
	require.NoError(t, err)
	t.Cleanup(func() { _ = grants.Close() })

	_, err = c.DefineQuota(ctx, quota.Definition{Name: "api", Window: quota.WindowDay, DefaultLimit: ptr(int64(300))})
	require.NoError(t, err)
	var wg sync.WaitGroup
	for range 500 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := c.Grant(ctx, quota.GrantRequest{Quota: "api", Member: "m", Amount: 1}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	leases, err := lease.New(c)
	require.NoError(t, err)
	fences, err := fence.New(c)
	require.NoError(t, err)
	old, err := leases.Acquire(ctx, lease.AcquireRequest{Name: "job", Holder: "a", TTL: time.Minute})
	require.NoError(t, err)
	_, err = leases.Release(ctx, lease.Lease{Name: "job", Token: old.Token})
	require.NoError(t, err)
	cur, err := leases.Acquire(ctx, lease.AcquireRequest{Name: "job", Holder: "b", TTL: time.Minute})
	require.NoError(t, err)
	for range 3 {
		_, err := fences.WriteRow(ctx, fence.WriteRowRequest{Resource: "job", Key: "k", Value: "old", Token: old.Token})
		require.ErrorIs(t, err, fence.ErrStaleToken)
	}
	for range 2 {
		_, err := fences.WriteRow(ctx, fence.WriteRowRequest{Resource: "job", Key: "k", Value: "new", Token: cur.Token})
		require.NoError(t, err)
	}

	// The relay: the pgquota command with --metrics-addr, delivering 7
	// events as JSON lines.
	events, err := outbox.New(c)
	require.NoError(t, err)
	for i := range 7 {
		_, err := events.Enqueue(ctx, "t", []byte(strconv.Itoa(i)), nil)
		require.NoError(t, err)
	}
	relayPort, err := svcproc.FreePort()
	require.NoError(t, err)
	relayAddr := fmt.Sprintf("127.0.0.1:%d", relayPort)
	var relayOut, relayErr syncBuffer
	relayDone := make(chan int, 1)
	rctx, stopRelay := context.WithCancel(ctx)
	go func() {
		relayDone <- cli.Run(rctx, []string{"outbox", "relay", "--database-url", dbURL, "--metrics-addr", relayAddr, "--poll-interval", "50ms"}, &relayOut, &relayErr)
	}()
	t.Cleanup(func() {
		stopRelay()
		if code := <-relayDone; code != 0 {
			t.Errorf("relay exited with %d: %s", code, relayErr.String())
		}
	})

	promPort, err := svcproc.FreePort()
	require.NoError(t, err)
	promAddr := fmt.Sprintf("127.0.0.1:%d", promPort)
	dir := t.TempDir()
	cfg := fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: grants
    static_configs: [{targets: [%q]}]
  - job_name: relay
    static_configs: [{targets: [%q]}]
`, grants.Addr, relayAddr)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o644))
	svcproc.StartT(t, svcproc.Spec{
		Name: "prometheus",
		Path: bin,
		Args: []string{
			"--config.file=" + filepath.Join(dir, "prometheus.yml"),
			"--storage.tsdb.path=" + filepath.Join(dir, "data"),
			"--web.listen-address=" + promAddr,
		},
		Dir:   dir,
		Ready: httpReady("http://" + promAddr + "/-/ready"),
	})

	want := map[string]float64{
		`sum(pgquota_grant_requests_total{job="grants",pgquota_operation="grant",pgquota_outcome="granted"})`:    300,
		`sum(pgquota_grant_requests_total{job="grants",pgquota_operation="grant",pgquota_outcome="denied"})`:     200,
		`sum(pgquota_grant_requests_total{job="grants",pgquota_outcome="error"}) or vector(0)`:                   0,
		`sum(pgquota_grant_units_total{job="grants"})`:                                                           300,
		`sum(pgquota_fence_writes_total{job="grants",pgquota_outcome="stale_token"})`:                            3,
		`sum(pgquota_fence_writes_total{job="grants",pgquota_outcome="written"})`:                                2,
		`sum(pgquota_lease_requests_total{job="grants",pgquota_operation="acquire",pgquota_outcome="acquired"})`: 2,
		`sum(pgquota_outbox_enqueued_total{job="grants"})`:                                                       7,
		`sum(pgquota_outbox_deliveries_total{job="relay",pgquota_outcome="delivered"})`:                          7,
		`sum(pgquota_outbox_delivery_latency_seconds_count{job="relay"})`:                                        7,
		`pgquota_outbox_pending{job="relay"}`:                                                                    0,
		`sum(up)`:                                                                                                2,
	}
	got := map[string]string{}
	deadline := time.Now().Add(60 * time.Second)
	for {
		mismatch := 0
		for q, w := range want {
			v, err := promQuery(ctx, promAddr, q)
			got[q] = v
			if err != nil {
				got[q] = "error: " + err.Error()
			}
			if f, perr := strconv.ParseFloat(v, 64); err != nil || perr != nil || f != w {
				mismatch++
			}
		}
		if mismatch == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Prometheus's series do not match the workload after 60s:\n%s\nrelay stderr:\n%s", table(want, got), relayErr.String())
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Logf("Prometheus matched the workload:\n%s", table(want, got))

	for _, addr := range []string{grants.Addr, relayAddr} {
		code, body := get(t, "http://"+addr+"/healthz")
		require.Equal(t, http.StatusOK, code, body)
	}
}

// A /healthz whose database has no pgquota schema answers 503 and says why.
func TestHealthzUnavailableWithoutSchema(t *testing.T) {
	t.Parallel()
	pool := pgtest.Connect(t, pgtest.NewEmptyURL(t), 2)
	c, err := quota.New(pool, nil)
	require.NoError(t, err)
	p, err := telemetry.NewProvider()
	require.NoError(t, err)
	s, err := telemetry.Serve("127.0.0.1:0", p, c.CheckSchema)
	require.NoError(t, err)
	defer s.Close()
	code, body := get(t, "http://"+s.Addr+"/healthz")
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Contains(t, body, "migrate up")
	code, _ = get(t, "http://"+s.Addr+"/metrics")
	require.Equal(t, http.StatusOK, code)

	// A taken address fails at once, naming the flag.
	_, err = telemetry.Serve(s.Addr, p, c.CheckSchema)
	require.ErrorContains(t, err, "--metrics-addr "+s.Addr)
}

func ptr[T any](v T) *T { return &v }

func httpReady(u string) func(context.Context) error {
	return func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s: %s", u, resp.Status)
		}
		return nil
	}
}

func get(t *testing.T, u string) (int, string) {
	t.Helper()
	resp, err := http.Get(u)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// promQuery runs an instant query and returns the single sample's value.
func promQuery(ctx context.Context, addr, q string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/api/v1/query?query="+url.QueryEscape(q), nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []struct {
				Value [2]any `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return "", err
	}
	if r.Status != "success" {
		return "", fmt.Errorf("%s", r.Error)
	}
	if len(r.Data.Result) != 1 {
		return "", fmt.Errorf("%d samples", len(r.Data.Result))
	}
	s, _ := r.Data.Result[0].Value[1].(string)
	return s, nil
}

func table(want map[string]float64, got map[string]string) string {
	var b bytes.Buffer
	for q, w := range want {
		fmt.Fprintf(&b, "  %-100s want %v got %s\n", q, w, got[q])
	}
	return b.String()
}

// syncBuffer is a bytes.Buffer safe for the relay's goroutine and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
