package httprate_test

import (
	"context"
	"errors"
	"io"
	"log"
	"net/http"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/httprate"
)

// One grant per request in front of an API: 100 requests an hour per API
// key, 429 with Retry-After past that.
func ExampleMiddleware() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost/app")
	if err != nil {
		log.Fatal(err)
	}
	client, err := quota.New(pool, nil)
	if err != nil {
		log.Fatal(err)
	}
	// Once, as an operator (pgquota quota define --name api --window hour --limit 100):
	if _, err := client.DefineQuota(ctx, quota.Definition{Name: "api", Window: quota.WindowHour, DefaultLimit: quota.Limit(100)}); err != nil {
		log.Fatal(err)
	}

	limit, err := httprate.Middleware(client, httprate.MiddlewareConfig{
		Quota: "api",
		Key: func(r *http.Request) (string, error) {
			key, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
			if !ok {
				return "", errors.New("no bearer token") // 400, nothing counted
			}
			return key, nil
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		res, _ := httprate.ResultFromContext(r.Context())
		_, _ = io.WriteString(w, res.Member+" has "+strings.TrimSpace(w.Header().Get(httprate.HeaderRateLimit))+"\n")
	})
	log.Fatal(http.ListenAndServe(":8080", limit(api)))
}
