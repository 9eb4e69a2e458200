package bench

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/stretchr/testify/require"
)

func TestBuildScript(t *testing.T) {
	t.Parallel()
	vars := []Var{{Name: "member", Min: 1, Max: 100}}
	a, b := samples(vars)
	require.NotEqual(t, a, b)
	at := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	stmt := func(member string) []Statement {
		return []Statement{
			{SQL: "begin"},
			{SQL: "-- name: X :one\nSELECT f($1::text, $2::text, $3, $2, $4)", Args: []any{"q", member, int64(7), at}},
			{SQL: "UPDATE t SET v = v + $1 WHERE q = $2 AND d < $3::interval", Args: []any{
				pgtype.Int8{Int64: 7, Valid: true}, "q", pgtype.Interval{Days: 1, Microseconds: 1500, Valid: true}}},
			{SQL: "commit"},
		}
	}
	require.Equal(t, []int64{34}, a) // about 1/3 and 2/3 of the range
	require.Equal(t, []int64{68}, b)
	s, err := BuildScript("x", vars, a, b, stmt("34"), stmt("68"))
	require.NoError(t, err)
	require.Equal(t, []string{"c1=q", "c2=7", "c3=2026-11-30 00:00:00Z", "c4=0 months 1 days 1500 microseconds"}, s.Defines)
	require.Contains(t, s.Text, "\\set member random(1, 100)\n")
	require.Contains(t, s.Text, "begin;\nSELECT f(:c1::text, :member::text, :c2, :member, :c3);\nUPDATE t SET v = v + :c2 WHERE q = :c1 AND d < :c4::interval;\ncommit;\n")
	require.NotContains(t, s.Text, "name: X", "sqlc's leading comment is dropped, as pgbench drops it")

	// What pgbench sends: every occurrence numbered anew, values as text.
	got, err := s.PgbenchSQL([]int64{42})
	require.NoError(t, err)
	require.Len(t, got, 4)
	require.Equal(t, "SELECT f($1::text, $2::text, $3, $4, $5)", got[1].SQL)
	require.Equal(t, []any{"q", "42", "7", "42", "2026-11-30 00:00:00Z"}, got[1].Args)
	require.Equal(t, "begin", got[0].SQL)

	fixed := s.WithFixedVars([]int64{42})
	require.Contains(t, fixed.Text, "\\set member 42\n")
	require.NotContains(t, fixed.Text, "random(")
}

func TestBuildScriptRejects(t *testing.T) {
	t.Parallel()
	vars := []Var{{Name: "member", Min: 1, Max: 100}}
	a, b := samples(vars)
	one := func(sql string, args ...any) []Statement { return []Statement{{SQL: sql, Args: args}} }
	for name, tc := range map[string]struct {
		capA, capB []Statement
		want       string
	}{
		"nothing sent":       {nil, nil, "sent no statement"},
		"different count":    {one("SELECT 1"), append(one("SELECT 1"), one("SELECT 2")...), "the same statements"},
		"different sql":      {one("SELECT 1"), one("SELECT 2"), "differs"},
		"varies but no var":  {one("SELECT $1", "x"), one("SELECT $1", "y"), "no declared Var"},
		"null":               {one("SELECT $1", nil), one("SELECT $1", nil), "NULL"},
		"null int8":          {one("SELECT $1", pgtype.Int8{}), one("SELECT $1", pgtype.Int8{}), "NULL"},
		"null interval":      {one("SELECT $1", pgtype.Interval{}), one("SELECT $1", pgtype.Interval{}), "NULL"},
		"odd type":           {one("SELECT $1", []byte("x")), one("SELECT $1", []byte("x")), "cannot pass"},
		"pgbench variable":   {one("SELECT ':x'"), one("SELECT ':x'"), "variable"},
		"semicolon":          {one("SELECT 1; SELECT 2"), one("SELECT 1; SELECT 2"), "semicolon"},
		"backslash":          {one(`SELECT E'\n'`), one(`SELECT E'\n'`), "backslash"},
		"placeholder beyond": {one("SELECT $2", "x"), one("SELECT $2", "x"), "has 1 arguments"},
	} {
		_, err := BuildScript("x", vars, a, b, tc.capA, tc.capB)
		require.ErrorContains(t, err, tc.want, name)
	}
	_, err := BuildScript("x", []Var{{Name: "c1", Min: 1, Max: 2}}, []int64{1}, []int64{2}, one("SELECT 1"), one("SELECT 1"))
	require.ErrorContains(t, err, "var name")
}

func TestPercentiles(t *testing.T) {
	t.Parallel()
	var s []time.Duration
	for i := 100; i >= 1; i-- {
		s = append(s, time.Duration(i)*time.Millisecond)
	}
	l := percentiles(s)
	require.Equal(t, Latency{P50: 50, P95: 95, P99: 99}, l)
	require.Equal(t, Latency{}, percentiles(nil))
}
