package cli

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/pgquota/pgquota/internal/telemetry"
	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/fence"
)

// metricsAddrFlag adds --metrics-addr to a command that runs for long.
func metricsAddrFlag(cmd *cobra.Command, addr *string) {
	cmd.Flags().StringVar(addr, "metrics-addr", "", "serve Prometheus metrics on http://ADDR/metrics and a health check on /healthz (e.g. 127.0.0.1:9464; default off)")
}

// metricsServer is what --metrics-addr started: the provider the command's
// client records into, and the HTTP server.
type metricsServer struct {
	provider *telemetry.Provider
	srv      *telemetry.Server
	health   atomic.Pointer[func(context.Context) error]
}

// startMetrics, when addr is not empty, serves /metrics and /healthz on it
// and makes the client that quotaClient creates record into it (call it
// before quotaClient). /healthz answers 503 until ready or readyPing says
// what to check, then 200 while that check passes, else 503 with the
// reason. A nil *metricsServer (no addr) does nothing.
func (a *app) startMetrics(addr string) (*metricsServer, error) {
	if addr == "" {
		return nil, nil
	}
	p, err := telemetry.NewProvider()
	if err != nil {
		return nil, err
	}
	ms := &metricsServer{provider: p}
	ms.srv, err = telemetry.Serve(addr, p, func(ctx context.Context) error {
		check := ms.health.Load()
		if check == nil {
			return errors.New("not connected to the database yet")
		}
		return (*check)(ctx)
	})
	if err != nil {
		return nil, usageError{err}
	}
	a.meterProvider = p
	fmt.Fprintf(a.stderr, "pgquota: metrics on http://%s/metrics, health on http://%s/healthz\n", ms.srv.Addr, ms.srv.Addr)
	return ms, nil
}

// ready makes /healthz check that c's database answers with the schema
// this build needs (CheckSchema) and that the guard of every guarded table
// fires (fence.Client.CheckGuards: a guard disabled, or bypassed by replica sessions,
// is a 503 naming the table).
func (ms *metricsServer) ready(c *quota.Client) {
	if ms != nil {
		fences, err := fence.New(c)
		check := func(ctx context.Context) error {
			if err != nil {
				return err
			}
			if err := c.CheckSchema(ctx); err != nil {
				return err
			}
			return fences.CheckGuards(ctx)
		}
		ms.health.Store(&check)
	}
}

// readyPing makes /healthz check that pool's database answers (bench and
// lab work in scratch databases they migrate themselves).
func (ms *metricsServer) readyPing(pool *pgxpool.Pool) {
	if ms != nil {
		check := pool.Ping
		ms.health.Store(&check)
	}
}

// stop stops the server and the provider.
func (ms *metricsServer) stop() {
	if ms == nil {
		return
	}
	_ = ms.srv.Close()
	_ = ms.provider.Shutdown(context.Background())
}
