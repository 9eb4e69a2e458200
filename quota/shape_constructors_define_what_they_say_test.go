package quota_test

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
)

// The constructors CalendarWindow, FixedWindow, RollingWindow and Rate
// define, through DefineQuota, the quota their names and the command's
// flags say, and a bad argument to one is refused by DefineQuota with an
// InputError, defining nothing.
func TestShapeConstructorsDefineWhatTheySay(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	cases := []struct {
		def          quota.Definition
		window       quota.Window
		tz           string
		limit, burst int64
		period       time.Duration
	}{
		{quota.CalendarWindow("cal", quota.WindowDay, "Europe/Berlin", 1000), quota.WindowDay, "Europe/Berlin", 1000, 0, 0},
		{quota.CalendarWindow("life", quota.WindowNone, "", 1), quota.WindowNone, "UTC", 1, 0, 0},
		{quota.FixedWindow("fixed", 10*time.Second, 50), quota.WindowFixed, "UTC", 50, 0, 10 * time.Second},
		{quota.RollingWindow("roll", time.Hour, 100), quota.WindowRolling, "UTC", 100, 0, time.Hour},
		{quota.Rate("rate", 10, time.Second, 20), quota.WindowRate, "UTC", 10, 20, time.Second},
		{quota.Rate("rate-default-burst", 5, 10*time.Second, 0), quota.WindowRate, "UTC", 5, 5, 10 * time.Second},
	}
	for _, c := range cases {
		t.Run(c.def.Name, func(t *testing.T) {
			q, err := b.operator.DefineQuota(b.ctx, c.def)
			require.NoError(t, err)
			require.Equal(t, c.window, q.Window)
			require.Equal(t, c.tz, q.TimeZone)
			require.NotNil(t, q.DefaultLimit)
			require.Equal(t, c.limit, *q.DefaultLimit)
			require.Equal(t, c.period, q.Period)
			if c.window == quota.WindowRate {
				require.Equal(t, c.burst, q.Burst)
			}
		})
	}

	for _, bad := range []quota.Definition{
		quota.FixedWindow("bad-fixed", 1500*time.Microsecond, 1),
		quota.RollingWindow("bad-roll", time.Hour, quota.MaxRollingLimit+1),
		quota.Rate("bad-rate", 10, 0, 0),
		quota.CalendarWindow("bad-tz", quota.WindowDay, "Mars/Olympus", 1),
		quota.Rate("", 10, time.Second, 0),
	} {
		_, err := b.operator.DefineQuota(b.ctx, bad)
		require.ErrorIs(t, err, quota.ErrInvalidInput, "%+v", bad)
		var n int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM pgquota.quota WHERE name = $1`, bad.Name).Scan(&n))
		require.Zero(t, n, "nothing defined for %q", bad.Name)
	}
}

func TestParseRateReadsTheCommandsForm(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in    string
		count int64
		per   time.Duration
	}{
		{"10/s", 10, time.Second},
		{"600/m", 600, time.Minute},
		{"2/h", 2, time.Hour},
		{"1/d", 1, 24 * time.Hour},
		{"5/10s", 5, 10 * time.Second},
		{"3/1500ms", 3, 1500 * time.Millisecond},
	} {
		n, per, err := quota.ParseRate(c.in)
		require.NoError(t, err, c.in)
		require.Equal(t, c.count, n, c.in)
		require.Equal(t, c.per, per, c.in)
	}
	for _, in := range []string{"", "10", "10/", "/s", "x/s", "0/s", "-1/s", "10/fortnight", "10/-1s", "10/0s"} {
		_, _, err := quota.ParseRate(in)
		require.ErrorIs(t, err, quota.ErrInvalidInput, "%q", in)
		var ie *quota.InputError
		require.True(t, errors.As(err, &ie), "%q", in)
		require.Equal(t, "rate", ie.Field, "%q", in)
	}
}
