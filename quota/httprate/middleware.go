package httprate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/pgquota/pgquota/quota"
)

// MiddlewareConfig configures Middleware.
type MiddlewareConfig struct {
	// Quota names the defined quota each request is granted against
	// (GrantRequest.Quota). Exactly one of Quota and Quotas is required.
	Quota string
	// Quotas names several quotas granted all or nothing
	// (GrantRequest.Quotas), such as a per-second rate and a daily cap.
	// Defaults to none.
	Quotas []string
	// Key returns the member a request is counted for (GrantRequest.Member:
	// an API key, a user or tenant id, a client address): 1 to
	// quota.MaxNameBytes bytes, no control characters. An error, or a key
	// that is not a valid member, is answered by OnError with a *KeyError
	// and the request is neither counted nor passed on. Required.
	Key func(*http.Request) (string, error)
	// Amount is the number of units each request takes
	// (GrantRequest.Amount), 1 to quota.MaxUnits. Defaults to 1.
	Amount int64
	// OnError answers a request whose grant failed with an error (not a
	// denial, which is a 429). Defaults to WriteError.
	OnError func(w http.ResponseWriter, r *http.Request, err error)
}

// KeyError is the error OnError receives when MiddlewareConfig.Key failed
// or returned a key that is not a valid member. Err is Key's error, or the
// *quota.InputError (quota.ErrInvalidInput) of the member check.
type KeyError struct{ Err error }

func (e *KeyError) Error() string { return "httprate: rate limit key: " + e.Err.Error() }

// Unwrap returns Key's error.
func (e *KeyError) Unwrap() error { return e.Err }

type resultKey struct{}

// ResultFromContext returns the grant result of the request whose context
// ctx is, as Middleware granted it, and true; false when Middleware did
// not run for it.
func ResultFromContext(ctx context.Context) (quota.GrantResult, bool) {
	res, ok := ctx.Value(resultKey{}).(quota.GrantResult)
	return res, ok
}

// Middleware returns an HTTP middleware that grants cfg.Amount units of
// cfg.Quota (or cfg.Quotas) to cfg.Key(r) for each request, with
// client.Grant (one statement; the limit is never exceeded, however many
// replicas serve the requests), before the request reaches next:
//   - granted: the RateLimit-Policy and RateLimit fields are set (Set) and
//     the request goes on to next, whose context carries the result
//     (ResultFromContext);
//   - denied: 429 Too Many Requests with the fields and, when a wait
//     helps, Retry-After in whole seconds (Deny); next is not called;
//   - an error (next is not called): cfg.OnError, by default WriteError,
//     which answers 400 for a bad key, 503 when the database could not be
//     reached or the outcome is unknown, 500 for a misconfiguration.
//
// A request whose grant outcome is unknown (quota.ErrOutcomeUnknown: the
// statement was sent and no reply came, for example because the client
// went away and the request's context ended) may have been counted
// although it was not served.
//
// Errors: a *quota.InputError (quota.ErrInvalidInput) naming the
// MiddlewareConfig field ("Quota", "Key", "Amount") when cfg is not
// valid, or "client" when client is nil.
func Middleware(client *quota.Client, cfg MiddlewareConfig) (func(http.Handler) http.Handler, error) {
	switch {
	case client == nil:
		return nil, &quota.InputError{Field: "client", Reason: "must not be nil"}
	case cfg.Quota == "" && len(cfg.Quotas) == 0:
		return nil, &quota.InputError{Field: "Quota", Reason: "is required (or Quotas)"}
	case cfg.Quota != "" && len(cfg.Quotas) > 0:
		return nil, &quota.InputError{Field: "Quota", Reason: "must be empty when Quotas is set"}
	case cfg.Key == nil:
		return nil, &quota.InputError{Field: "Key", Reason: "must not be nil"}
	case cfg.Amount < 0 || cfg.Amount > quota.MaxUnits:
		return nil, &quota.InputError{Field: "Amount", Reason: fmt.Sprintf("must be between 1 and %d, got %d", quota.MaxUnits, cfg.Amount)}
	}
	if cfg.Amount == 0 {
		cfg.Amount = 1
	}
	if cfg.OnError == nil {
		cfg.OnError = WriteError
	}
	quotas := append([]string(nil), cfg.Quotas...)
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			key, err := cfg.Key(r)
			if err != nil {
				cfg.OnError(w, r, &KeyError{Err: err})
				return
			}
			res, err := client.Grant(r.Context(), quota.GrantRequest{Quota: cfg.Quota, Quotas: quotas, Member: key, Amount: cfg.Amount})
			if err != nil {
				var ie *quota.InputError
				if errors.As(err, &ie) && ie.Field == "member" {
					err = &KeyError{Err: err}
				}
				cfg.OnError(w, r, err)
				return
			}
			if Deny(w, res) {
				return
			}
			next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), resultKey{}, res)))
		})
	}, nil
}

// WriteError is Middleware's default MiddlewareConfig.OnError. It answers
// with a one-line text body:
//   - 400 Bad Request for a *KeyError (the request's key is missing or not
//     a valid member);
//   - 503 Service Unavailable with Retry-After: 1 when the outcome is
//     unknown (quota.ErrOutcomeUnknown; the body says the request may have
//     been counted), and for every other database error (a connection
//     that failed, a pool exhausted, a context that ended: nothing was
//     counted);
//   - 500 Internal Server Error for errors a retry cannot mend: the quota
//     is not defined (quota.ErrQuotaNotFound), has no limit
//     (quota.ErrNoLimit), the schema is missing (quota.ErrSchemaMissing),
//     the role lacks privileges (quota.ErrPermissionDenied), or the
//     request is not valid (quota.ErrInvalidInput, from MiddlewareConfig
//     fields the grant checks, such as a quota name).
//
// The body never carries the database's message, which may name tables
// or roles. Every error but a *KeyError (a client's mistake) is logged with
// slog's default logger (slog.ErrorContext, with the request's method and
// path), so that a misconfigured quota is seen in the service's log; set
// OnError to log otherwise.
func WriteError(w http.ResponseWriter, r *http.Request, err error) {
	var ke *KeyError
	if !errors.As(err, &ke) {
		slog.ErrorContext(r.Context(), "pgquota rate limit: the grant failed", "method", r.Method, "path", r.URL.Path, "error", err)
	}
	switch {
	case errors.As(err, &ke):
		http.Error(w, "rate limit key missing or not valid", http.StatusBadRequest)
	case errors.Is(err, quota.ErrOutcomeUnknown):
		w.Header().Set(HeaderRetryAfter, "1")
		http.Error(w, "rate limit outcome unknown: the database did not answer; this request may have been counted", http.StatusServiceUnavailable)
	case errors.Is(err, quota.ErrQuotaNotFound), errors.Is(err, quota.ErrNoLimit), errors.Is(err, quota.ErrSchemaMissing),
		errors.Is(err, quota.ErrPermissionDenied), errors.Is(err, quota.ErrInvalidInput):
		http.Error(w, "rate limit misconfigured", http.StatusInternalServerError)
	default:
		w.Header().Set(HeaderRetryAfter, "1")
		http.Error(w, "rate limit unavailable: the database could not be reached; this request was not counted", http.StatusServiceUnavailable)
	}
}
