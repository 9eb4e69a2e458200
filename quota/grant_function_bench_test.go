package quota_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgquota/pgquota/quota"
)

// cteGrant is UsageGrant as it was before migrations/00014: the grant as
// one CTE statement (queries/usage.sql at that time), kept here only so
// that BenchmarkGrantFunctionVsCTE can compare it with pgquota.grant.
const cteGrant = `WITH def AS (
    SELECT q.name,
           coalesce($4::bigint, o.limit_value, q.default_limit) AS limit_value,
           pgquota.window_start(q.window_unit, q.time_zone, c.at) AS window_start,
           pgquota.window_end(q.window_unit, q.time_zone, c.at) AS window_end,
           c.at
    FROM pgquota.quota q
    CROSS JOIN (SELECT pgquota.clock() AS at) c
    LEFT JOIN pgquota.quota_override o ON o.quota_name = q.name AND o.member = $2::text
    WHERE q.name = $1::text
), upd AS (
    UPDATE pgquota.usage u
    SET used = u.used + $3::bigint,
        updated_at = def.at
    FROM def
    WHERE u.quota_name = def.name
      AND u.member = $2::text
      AND u.window_start = def.window_start
      AND u.window_end = def.window_end
      AND u.used + $3::bigint <= def.limit_value
    RETURNING u.used
), ins AS (
    INSERT INTO pgquota.usage AS u (quota_name, member, window_start, window_end, used, updated_at)
    SELECT def.name, $2::text, def.window_start, def.window_end, $3::bigint, def.at
    FROM def
    WHERE $3::bigint <= def.limit_value
      AND NOT EXISTS (
          SELECT 1 FROM pgquota.usage x
          WHERE x.quota_name = def.name
            AND x.member = $2::text
            AND x.window_start = def.window_start
            AND x.window_end = def.window_end
      )
    ON CONFLICT (quota_name, member, window_start, window_end) DO UPDATE
    SET used = u.used + excluded.used,
        updated_at = excluded.updated_at
    WHERE u.used + excluded.used <= (SELECT def.limit_value FROM def)
    RETURNING u.used
), granted AS (
    SELECT upd.used FROM upd
    UNION ALL
    SELECT ins.used FROM ins
)
SELECT (def.limit_value IS NOT NULL)::boolean AS has_limit,
       coalesce(def.limit_value, 0)::bigint AS limit_value,
       def.window_start::timestamptz AS window_start,
       def.window_end::timestamptz AS window_end,
       (g.used IS NOT NULL)::boolean AS granted,
       coalesce(g.used, pgquota.usage_used_fresh(def.name, $2::text, def.window_start, def.window_end))::bigint AS used
FROM def
LEFT JOIN granted g ON true
WHERE (set_config('synchronous_commit', CASE current_setting('synchronous_commit') WHEN 'off' THEN 'on' ELSE current_setting('synchronous_commit') END, true) <> '')`

func cteGrantCall(ctx context.Context, _ *quota.Client, pool *pgxpool.Pool, member string) (bool, error) {
	var hasLimit, granted bool
	var limit, used int64
	var ws, we any
	err := pool.QueryRow(ctx, cteGrant, "bench", member, int64(1), int64(quota.MaxUnits)).Scan(&hasLimit, &limit, &ws, &we, &granted, &used)
	return granted, err
}

// BenchmarkGrantFunctionVsCTE compares, in one run, the grant statement
// before migrations/00014 (one CTE, cteGrant) with the call of
// pgquota.grant that replaced it (UsageGrant, through pgx alone as the
// -pgx cases of BenchmarkGrant), with 1 and 32 clients, on one hot counter
// and spread over 10,000 existing counters. Compare grants/s of cte and
// function in each line:
//
//	go test ./quota -run '^$' -bench GrantFunctionVsCTE -benchtime 3s
func BenchmarkGrantFunctionVsCTE(b *testing.B) {
	url, members := benchDB(b)
	hot := func(*rand.Rand) string { return "hot" }
	spread := func(rng *rand.Rand) string { return members[rng.IntN(len(members))] }
	for _, counters := range []struct {
		name   string
		member func(*rand.Rand) string
	}{{"hot-row", hot}, {"spread", spread}} {
		for _, clients := range []int{1, 32} {
			for _, stmt := range []struct {
				name  string
				grant grantFunc
			}{{"cte", cteGrantCall}, {"function", pgxGrant}} {
				b.Run(fmt.Sprintf("%s/clients=%d/%s", counters.name, clients, stmt.name), func(b *testing.B) {
					benchGrant(b, url, clients, counters.member, stmt.grant)
				})
			}
		}
	}
}
