package quota_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
)

func mustTime(t *testing.T, s string) time.Time {
	t.Helper()
	v, err := time.Parse(time.RFC3339, s)
	require.NoError(t, err)
	return v
}

// windowOf calls the SQL functions pgquota.window_start and
// pgquota.window_end.
func (b *testBundle) windowOf(t *testing.T, unit, tz string, at time.Time) (start, end pgtype.Timestamptz) {
	t.Helper()
	err := b.pool.QueryRow(b.ctx, `SELECT pgquota.window_start($1, $2, $3), pgquota.window_end($1, $2, $3)`,
		unit, tz, at).Scan(&start, &end)
	require.NoError(t, err)
	return start, end
}

func TestWindowFunctions(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)

	cases := []struct {
		name       string
		unit, tz   string
		at         string
		start, end string
	}{
		{"hour UTC", "hour", "UTC", "2026-05-10T13:45:10Z", "2026-05-10T13:00:00Z", "2026-05-10T14:00:00Z"},
		{"hour UTC on the boundary", "hour", "UTC", "2026-05-10T13:00:00Z", "2026-05-10T13:00:00Z", "2026-05-10T14:00:00Z"},
		{"day UTC", "day", "UTC", "2026-05-10T13:45:00Z", "2026-05-10T00:00:00Z", "2026-05-11T00:00:00Z"},
		{"day UTC last instant", "day", "UTC", "2026-05-10T23:59:59Z", "2026-05-10T00:00:00Z", "2026-05-11T00:00:00Z"},
		{"week UTC (ISO, Monday) on a Sunday", "week", "UTC", "2026-05-10T13:45:00Z", "2026-05-04T00:00:00Z", "2026-05-11T00:00:00Z"},
		{"week UTC on a Monday", "week", "UTC", "2026-05-11T00:00:00Z", "2026-05-11T00:00:00Z", "2026-05-18T00:00:00Z"},
		{"week across a year", "week", "UTC", "2026-01-01T12:00:00Z", "2025-12-29T00:00:00Z", "2026-01-05T00:00:00Z"},
		{"month UTC", "month", "UTC", "2026-05-10T13:45:00Z", "2026-05-01T00:00:00Z", "2026-06-01T00:00:00Z"},
		{"month UTC February", "month", "UTC", "2028-02-29T23:00:00Z", "2028-02-01T00:00:00Z", "2028-03-01T00:00:00Z"},
		{"month UTC December", "month", "UTC", "2026-12-31T23:59:59Z", "2026-12-01T00:00:00Z", "2027-01-01T00:00:00Z"},

		// A local day, not the UTC one: 23:30 UTC is already tomorrow in Berlin.
		{"day Berlin summer", "day", "Europe/Berlin", "2026-05-10T23:30:00Z", "2026-05-10T22:00:00Z", "2026-05-11T22:00:00Z"},
		{"day Berlin winter", "day", "Europe/Berlin", "2026-01-10T12:00:00Z", "2026-01-09T23:00:00Z", "2026-01-10T23:00:00Z"},
		// DST days: 23 and 25 hours.
		{"day Berlin spring forward (23h)", "day", "Europe/Berlin", "2026-03-29T12:00:00Z", "2026-03-28T23:00:00Z", "2026-03-29T22:00:00Z"},
		{"day Berlin fall back (25h)", "day", "Europe/Berlin", "2026-10-25T12:00:00Z", "2026-10-24T22:00:00Z", "2026-10-25T23:00:00Z"},
		{"day Berlin fall back, in the repeated hour", "day", "Europe/Berlin", "2026-10-25T01:30:00Z", "2026-10-24T22:00:00Z", "2026-10-25T23:00:00Z"},
		// Hours around the changes: the repeated hour is two windows.
		{"hour Berlin before spring forward", "hour", "Europe/Berlin", "2026-03-29T00:30:00Z", "2026-03-29T00:00:00Z", "2026-03-29T01:00:00Z"},
		{"hour Berlin after spring forward", "hour", "Europe/Berlin", "2026-03-29T01:30:00Z", "2026-03-29T01:00:00Z", "2026-03-29T02:00:00Z"},
		{"hour Berlin 02:30 CEST (first)", "hour", "Europe/Berlin", "2026-10-25T00:30:00Z", "2026-10-25T00:00:00Z", "2026-10-25T01:00:00Z"},
		{"hour Berlin 02:30 CET (repeat)", "hour", "Europe/Berlin", "2026-10-25T01:30:00Z", "2026-10-25T01:00:00Z", "2026-10-25T02:00:00Z"},
		{"week Berlin holding spring forward (167h)", "week", "Europe/Berlin", "2026-03-25T12:00:00Z", "2026-03-22T23:00:00Z", "2026-03-29T22:00:00Z"},
		{"month Berlin March (DST inside)", "month", "Europe/Berlin", "2026-03-15T12:00:00Z", "2026-02-28T23:00:00Z", "2026-03-31T22:00:00Z"},
		{"month Berlin first instant", "month", "Europe/Berlin", "2026-04-30T22:00:00Z", "2026-04-30T22:00:00Z", "2026-05-31T22:00:00Z"},

		{"day New York spring forward (23h)", "day", "America/New_York", "2026-03-08T16:00:00Z", "2026-03-08T05:00:00Z", "2026-03-09T04:00:00Z"},
		{"day New York fall back (25h)", "day", "America/New_York", "2026-11-01T16:00:00Z", "2026-11-01T04:00:00Z", "2026-11-02T05:00:00Z"},
		{"day New York evening is still today", "day", "America/New_York", "2026-07-04T03:59:59Z", "2026-07-03T04:00:00Z", "2026-07-04T04:00:00Z"},
		{"hour New York 01:30 EDT (first)", "hour", "America/New_York", "2026-11-01T05:30:00Z", "2026-11-01T05:00:00Z", "2026-11-01T06:00:00Z"},
		{"hour New York 01:30 EST (repeat)", "hour", "America/New_York", "2026-11-01T06:30:00Z", "2026-11-01T06:00:00Z", "2026-11-01T07:00:00Z"},

		// Half-hour offset: hours start at :30 UTC.
		{"hour Kolkata", "hour", "Asia/Kolkata", "2026-06-15T10:45:00Z", "2026-06-15T10:30:00Z", "2026-06-15T11:30:00Z"},
		{"hour Kolkata before :30", "hour", "Asia/Kolkata", "2026-06-15T10:15:00Z", "2026-06-15T09:30:00Z", "2026-06-15T10:30:00Z"},
		{"day Kolkata", "day", "Asia/Kolkata", "2026-06-15T10:45:00Z", "2026-06-14T18:30:00Z", "2026-06-15T18:30:00Z"},
		{"month Kolkata", "month", "Asia/Kolkata", "2026-06-15T10:45:00Z", "2026-05-31T18:30:00Z", "2026-06-30T18:30:00Z"},
		// Quarter-hour offset.
		{"hour Kathmandu", "hour", "Asia/Kathmandu", "2026-06-15T10:00:00Z", "2026-06-15T09:15:00Z", "2026-06-15T10:15:00Z"},

		// Havana changes the clock at midnight. Spring: local midnight does
		// not exist, the day starts at 01:00 CDT and lasts 23 hours.
		{"day Havana spring forward at midnight (23h)", "day", "America/Havana", "2026-03-08T12:00:00Z", "2026-03-08T05:00:00Z", "2026-03-09T04:00:00Z"},
		// Autumn: 01:00 CDT goes back to 00:00 CST, so local midnight happens
		// twice; the day starts at the first one and lasts 25 hours, and the
		// day before ends there.
		{"day Havana before fall back at midnight", "day", "America/Havana", "2026-10-31T12:00:00Z", "2026-10-31T04:00:00Z", "2026-11-01T04:00:00Z"},
		{"day Havana fall back, first midnight hour", "day", "America/Havana", "2026-11-01T04:30:00Z", "2026-11-01T04:00:00Z", "2026-11-02T05:00:00Z"},
		{"day Havana fall back, repeated midnight hour", "day", "America/Havana", "2026-11-01T05:30:00Z", "2026-11-01T04:00:00Z", "2026-11-02T05:00:00Z"},
		{"month Havana starting at the first midnight", "month", "America/Havana", "2026-11-01T04:30:00Z", "2026-11-01T04:00:00Z", "2026-12-01T05:00:00Z"},
		{"hour Havana 00:30 CDT (first)", "hour", "America/Havana", "2026-11-01T04:30:00Z", "2026-11-01T04:00:00Z", "2026-11-01T05:00:00Z"},
		{"hour Havana 00:30 CST (repeat)", "hour", "America/Havana", "2026-11-01T05:30:00Z", "2026-11-01T05:00:00Z", "2026-11-01T06:00:00Z"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			at := mustTime(t, tc.at)
			start, end := b.windowOf(t, tc.unit, tc.tz, at)
			require.True(t, start.Valid && end.Valid)
			require.Equal(t, mustTime(t, tc.start).UTC(), start.Time.UTC(), "window start")
			require.Equal(t, mustTime(t, tc.end).UTC(), end.Time.UTC(), "window end")
			require.False(t, at.Before(start.Time), "the window holds its instant")
			require.True(t, at.Before(end.Time), "the window holds its instant")
		})
	}

	t.Run("none is a lifetime", func(t *testing.T) {
		for _, tz := range []string{"UTC", "Europe/Berlin"} {
			start, end := b.windowOf(t, "none", tz, mustTime(t, "2026-05-10T13:45:00Z"))
			require.Equal(t, pgtype.NegativeInfinity, start.InfinityModifier)
			require.Equal(t, pgtype.Infinity, end.InfinityModifier)
		}
	})
}

// For every half hour of the months around 2026's clock changes, in zones
// with awkward rules, the window holds its instant, and windows tile time:
// the end of one is the start of the next (so a grant at any instant lands
// in exactly one window). Known exception, documented with
// pgquota.window_start: hour windows in Australia/Lord_Howe, whose clock
// changes by half an hour, overlap next to a change.
func TestWindowFunctionsTileTime(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	rows, err := b.pool.Query(b.ctx, `
		WITH w AS (
			SELECT z.tz, u.unit, s.at,
			       pgquota.window_start(u.unit, z.tz, s.at) AS ws,
			       pgquota.window_end(u.unit, z.tz, s.at) AS we
			FROM unnest(ARRAY['Europe/Berlin', 'America/New_York', 'America/Havana', 'America/Santiago',
			                  'Australia/Lord_Howe', 'Pacific/Chatham', 'Antarctica/Troll']) AS z(tz)
			CROSS JOIN unnest(ARRAY['hour', 'day', 'week', 'month']) AS u(unit)
			CROSS JOIN (
				SELECT generate_series('2026-02-28 00:15+00'::timestamptz, '2026-04-10 00:00+00', interval '30 minutes')
				UNION ALL
				SELECT generate_series('2026-08-31 00:15+00'::timestamptz, '2026-11-05 00:00+00', interval '30 minutes')
			) AS s(at)
			WHERE NOT (z.tz = 'Australia/Lord_Howe' AND u.unit = 'hour')
		)
		SELECT tz, unit, at, ws, we, pgquota.window_start(unit, tz, we) AS next_ws
		FROM w
		WHERE NOT (ws <= at AND at < we)
		   OR pgquota.window_start(unit, tz, we) <> we
		ORDER BY tz, unit, at
		LIMIT 20`)
	require.NoError(t, err)
	defer rows.Close()
	bad := 0
	for rows.Next() {
		var tz, unit string
		var at, ws, we, nextWS time.Time
		require.NoError(t, rows.Scan(&tz, &unit, &at, &ws, &we, &nextWS))
		t.Errorf("%s %s at %s: window [%s, %s), next window starts %s",
			tz, unit, at.UTC().Format(time.RFC3339), ws.UTC().Format(time.RFC3339), we.UTC().Format(time.RFC3339), nextWS.UTC().Format(time.RFC3339))
		bad++
	}
	require.NoError(t, rows.Err())
	require.Zero(t, bad)
}

// Grants just before and just after local midnight in a non-UTC zone land in
// different windows, also when both instants are on the same UTC day.
func TestGrantLocalMidnight(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	b.define(t, quota.Definition{Name: "q", Window: quota.WindowDay, TimeZone: "Europe/Berlin", DefaultLimit: ptr[int64](1)})
	req := quota.GrantRequest{Quota: "q", Member: "m", Amount: 1}

	b.setClock(t, "2026-05-10 23:59:59.999+02") // 21:59:59.999 UTC
	before, err := b.client.Grant(b.ctx, req)
	require.NoError(t, err)
	require.True(t, before.Granted)
	require.Equal(t, mustTime(t, "2026-05-09T22:00:00Z"), before.WindowStart.UTC())
	require.Equal(t, mustTime(t, "2026-05-10T22:00:00Z"), before.WindowEnd.UTC())
	again, err := b.client.Grant(b.ctx, req)
	require.NoError(t, err)
	require.False(t, again.Granted, "same window, limit 1")

	b.setClock(t, "2026-05-11 00:00:00+02") // 22:00 UTC, same UTC day
	after, err := b.client.Grant(b.ctx, req)
	require.NoError(t, err)
	require.True(t, after.Granted, "a new local day is a new window")
	require.Equal(t, int64(1), after.Used)
	require.Equal(t, before.WindowEnd, after.WindowStart)
	require.Equal(t, mustTime(t, "2026-05-11T22:00:00Z"), after.WindowEnd.UTC())

	sum, rows := b.usageRows(t, "q", "m")
	require.Equal(t, int64(2), sum)
	require.Equal(t, int64(2), rows)

	u, err := b.client.Usage(b.ctx, "q", "m")
	require.NoError(t, err)
	require.Equal(t, int64(1), u.Used)
	require.Equal(t, after.WindowStart, u.WindowStart)
}

// On a DST change day the reported window is 23 or 25 hours long.
func TestGrantDSTWindowLength(t *testing.T) {
	t.Parallel()
	cases := []struct {
		tz, clock string
		want      time.Duration
	}{
		{"Europe/Berlin", "2026-03-29 12:00+02", 23 * time.Hour},
		{"Europe/Berlin", "2026-03-29 00:30+01", 23 * time.Hour},
		{"Europe/Berlin", "2026-10-25 12:00+01", 25 * time.Hour},
		{"Europe/Berlin", "2026-10-25 02:30+01", 25 * time.Hour}, // in the repeated hour
		{"Europe/Berlin", "2026-10-26 12:00+01", 24 * time.Hour},
		{"America/New_York", "2026-03-08 12:00-04", 23 * time.Hour},
		{"America/New_York", "2026-11-01 12:00-05", 25 * time.Hour},
		{"Asia/Kolkata", "2026-03-29 12:00+05:30", 24 * time.Hour},
	}
	for _, tc := range cases {
		t.Run(tc.tz+" "+tc.clock, func(t *testing.T) {
			t.Parallel()
			b := setup(t, 2)
			b.define(t, quota.Definition{Name: "q", Window: quota.WindowDay, TimeZone: tc.tz, DefaultLimit: ptr[int64](5)})
			b.setClock(t, tc.clock)
			res, err := b.client.Grant(b.ctx, quota.GrantRequest{Quota: "q", Member: "m", Amount: 1})
			require.NoError(t, err)
			require.True(t, res.Granted)
			require.Equal(t, tc.want, res.WindowEnd.Sub(res.WindowStart))
			// The window starts at local midnight.
			loc, err := time.LoadLocation(tc.tz)
			require.NoError(t, err)
			local := res.WindowStart.In(loc)
			require.Equal(t, [3]int{0, 0, 0}, [3]int{local.Hour(), local.Minute(), local.Second()})
			// The stored row carries the same bounds.
			var ws, we time.Time
			require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT window_start, window_end FROM pgquota.usage`).Scan(&ws, &we))
			require.True(t, ws.Equal(res.WindowStart))
			require.True(t, we.Equal(res.WindowEnd))
		})
	}
}

// The repeated hour of a fall-back night is two hour windows.
func TestGrantRepeatedHour(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	b.define(t, quota.Definition{Name: "q", Window: quota.WindowHour, TimeZone: "Europe/Berlin", DefaultLimit: ptr[int64](1)})
	req := quota.GrantRequest{Quota: "q", Member: "m", Amount: 1}
	b.setClock(t, "2026-10-25 02:30+02")
	first, err := b.client.Grant(b.ctx, req)
	require.NoError(t, err)
	require.True(t, first.Granted)
	b.setClock(t, "2026-10-25 02:30+01")
	second, err := b.client.Grant(b.ctx, req)
	require.NoError(t, err)
	require.True(t, second.Granted, "02:30 CET is another hour than 02:30 CEST")
	require.Equal(t, first.WindowEnd, second.WindowStart)
	require.Equal(t, time.Hour, second.WindowEnd.Sub(second.WindowStart))
}

// Redefining a quota's window (with ReplaceKind: another kind) starts fresh
// counters, even when the old and new windows start at the same instant.
func TestGrantWindowRedefined(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	b.setClock(t, "2026-05-11 00:30+02")
	b.define(t, quota.Definition{Name: "q", Window: quota.WindowDay, TimeZone: "Europe/Berlin", DefaultLimit: ptr[int64](1)})
	req := quota.GrantRequest{Quota: "q", Member: "m", Amount: 1}
	res, err := b.client.Grant(b.ctx, req)
	require.NoError(t, err)
	require.True(t, res.Granted)
	res, err = b.client.Grant(b.ctx, req)
	require.NoError(t, err)
	require.False(t, res.Granted)

	// Hour windows: the current hour starts at the same instant as the day.
	b.define(t, quota.Definition{Name: "q", Window: quota.WindowHour, TimeZone: "Europe/Berlin", DefaultLimit: ptr[int64](1), ReplaceKind: true})
	res, err = b.client.Grant(b.ctx, req)
	require.NoError(t, err)
	require.True(t, res.Granted, "a new window kind starts a fresh counter")
	require.Equal(t, int64(1), res.Used)
	require.Equal(t, time.Hour, res.WindowEnd.Sub(res.WindowStart))
	u, err := b.client.Usage(b.ctx, "q", "m")
	require.NoError(t, err)
	require.Equal(t, int64(1), u.Used)

	// Another time zone is another set of windows too.
	b.define(t, quota.Definition{Name: "q", Window: quota.WindowHour, TimeZone: "Asia/Kolkata", DefaultLimit: ptr[int64](1)})
	res, err = b.client.Grant(b.ctx, req)
	require.NoError(t, err)
	require.True(t, res.Granted)
	sum, rows := b.usageRows(t, "q", "m")
	require.Equal(t, int64(2), sum, "the day's counter went with the change of kind")
	require.Equal(t, int64(2), rows)
}

func TestDefineQuotaTimeZone(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	for _, tc := range []struct{ in, want string }{
		{"", "UTC"},
		{"UTC", "UTC"},
		{"utc", "UTC"},
		{"europe/berlin", "Europe/Berlin"},
		{"EUROPE/BERLIN", "Europe/Berlin"},
		{"america/new_york", "America/New_York"},
		{"Asia/Kolkata", "Asia/Kolkata"},
		{"asia/calcutta", "Asia/Calcutta"}, // a link keeps its own name
	} {
		q := b.define(t, quota.Definition{Name: "q", Window: quota.WindowDay, TimeZone: tc.in})
		require.Equal(t, tc.want, q.TimeZone, "input %q", tc.in)
		got, err := b.client.Quota(b.ctx, "q")
		require.NoError(t, err)
		require.Equal(t, tc.want, got.TimeZone)
	}
	qs, err := b.client.Quotas(b.ctx)
	require.NoError(t, err)
	require.Len(t, qs, 1)

	_, err = b.operator.DefineQuota(b.ctx, quota.Definition{Name: "q", Window: quota.WindowDay, TimeZone: "Nowhere/Special"})
	var ie *quota.InputError
	require.ErrorAs(t, err, &ie)
	require.Equal(t, "time zone", ie.Field)
	got, err := b.client.Quota(b.ctx, "q")
	require.NoError(t, err)
	require.Equal(t, "Asia/Calcutta", got.TimeZone, "a rejected redefinition changes nothing")
}
