// Package telemetry serves pgquota's metrics to Prometheus: an
// OpenTelemetry MeterProvider whose reader is the OpenTelemetry Prometheus
// exporter, on a registry of its own, and an HTTP server with /metrics and
// /healthz. The pgquota commands that run for long (`outbox relay`,
// `bench`, `lab`) start one with --metrics-addr.
//
// Why the OpenTelemetry exporter rather than prometheus/client_golang's own
// instruments: the library records through the OpenTelemetry metrics API
// (quota.Config.MeterProvider), so the exporter serves exactly the
// instruments a library user sees, with one definition of each; it is
// built on client_golang's registry and handler (promhttp) anyway.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// Provider is a MeterProvider exported in the Prometheus text format by
// Handler.
type Provider struct {
	*sdkmetric.MeterProvider
	registry *prometheus.Registry
}

// NewProvider returns a Provider with a fresh registry (no process or Go
// runtime collectors: only pgquota's instruments, plus the exporter's
// target_info).
func NewProvider() (*Provider, error) {
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo())
	if err != nil {
		return nil, fmt.Errorf("prometheus exporter: %w", err)
	}
	return &Provider{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp)), registry: reg}, nil
}

// Handler serves the metrics in the Prometheus exposition format.
func (p *Provider) Handler() http.Handler {
	return promhttp.HandlerFor(p.registry, promhttp.HandlerOpts{})
}

// HealthTimeout bounds one /healthz check.
const HealthTimeout = 2 * time.Second

// Server serves /metrics and /healthz on a TCP address.
type Server struct {
	// Addr is the address it listens on (the port chosen when the address
	// given had port 0).
	Addr string
	srv  *http.Server
	done chan error
}

// Serve listens on addr (host:port; port 0 picks a free one) and serves
// GET /metrics with p and GET /healthz: 200 "ok" when health returns nil,
// else 503 with the error's text, each check bounded by HealthTimeout. It
// returns once it listens, with an error when addr cannot be listened on.
func Serve(addr string, p *Provider, health func(ctx context.Context) error) (*Server, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics-addr %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", p.Handler())
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), HealthTimeout)
		defer cancel()
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if err := health(ctx); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintf(w, "unavailable: %v\n", err)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	s := &Server{
		Addr: l.Addr().String(),
		srv:  &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second},
		done: make(chan error, 1),
	}
	go func() { s.done <- s.srv.Serve(l) }()
	return s, nil
}

// Close stops the server, waiting up to 2s for requests in flight.
func (s *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := s.srv.Shutdown(ctx)
	if serr := <-s.done; !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	return err
}
