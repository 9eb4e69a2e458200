package bulk_test

import (
	"context"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/bulk"
	"github.com/pgquota/pgquota/internal/pgtest"
	"github.com/pgquota/pgquota/quota"
)

// readAll reads every row of a file.
func readAll(t *testing.T, file string) []bulk.Row {
	t.Helper()
	r, err := bulk.NewReader(strings.NewReader(file))
	require.NoError(t, err)
	var rows []bulk.Row
	for {
		row, err := r.Next()
		if err == io.EOF {
			return rows
		}
		require.NoError(t, err)
		rows = append(rows, row)
	}
}

func TestReaderHeader(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ file, want string }{
		{"", "empty"},
		{"quota,member\n", `"amount" is missing`},
		{"quota,member,amount,colour\n", `unknown column "colour"`},
		{"quota,member,amount,quota\n", `"quota" appears twice`},
		{"quota,\"mem\"ber,amount\n", "header"},
	} {
		_, err := bulk.NewReader(strings.NewReader(tc.file))
		require.ErrorContains(t, err, tc.want, "%q", tc.file)
	}
	// Any order, any case, a byte order mark, spaces.
	rows := readAll(t, "\ufeffAmount, Member ,QUOTA,limit\n3,m,q,7\n")
	require.Len(t, rows, 1)
	require.NoError(t, rows[0].Err)
	require.Equal(t, quota.GrantRequest{Quota: "q", Member: "m", Amount: 3, Limit: ptr[int64](7)}, rows[0].Request)
	require.Equal(t, 2, rows[0].Line)
}

func ptr[T any](v T) *T { return &v }

func TestReaderRows(t *testing.T) {
	t.Parallel()
	file := "quota,member,amount,limit,idempotency_key\n" +
		"q,a,1,,\n" + // 2: good, no limit
		"q,b,2,5,\n" + // 3: good, limit 5
		"q,c,x,,\n" + // 4: bad amount
		"q,d,1,y,\n" + // 5: bad limit
		"q,e,1\n" + // 6: too few fields
		"q,\"f\ng\",1,,\n" + // 7-8: a member with a newline (the row starts on line 7)
		"q,h\"i,1,,\n" + // 9: bare quote
		"q,j,1,,key-1\n" + // 10: an idempotency key
		"\n" + // 11: blank, skipped
		"q,k, 4 ,,\n" // 12: spaces around a number
	rows := readAll(t, file)
	require.Len(t, rows, 9)
	for i, r := range rows {
		require.Equal(t, int64(i), r.Seq)
	}
	lines := []int{2, 3, 4, 5, 6, 7, 9, 10, 12}
	for i, r := range rows {
		require.Equal(t, lines[i], r.Line, "row %d", i)
	}
	require.NoError(t, rows[0].Err)
	require.Nil(t, rows[0].Request.Limit)
	require.NoError(t, rows[1].Err)
	require.Equal(t, int64(5), *rows[1].Request.Limit)
	require.ErrorContains(t, rows[2].Err, "amount")
	require.ErrorContains(t, rows[3].Err, "limit")
	require.ErrorContains(t, rows[4].Err, "want 5 fields")
	require.NoError(t, rows[5].Err, "the member's newline is quota's to reject, not the reader's")
	require.Equal(t, "f\ng", rows[5].Request.Member)
	require.ErrorContains(t, rows[6].Err, "malformed CSV")
	require.NoError(t, rows[7].Err)
	require.Equal(t, "key-1", rows[7].IdempotencyKey)
	require.Equal(t, quota.IdempotencyKey{Key: "key-1"}, rows[7].Request.Idempotency)
	require.NoError(t, rows[8].Err)
	require.Equal(t, int64(4), rows[8].Request.Amount)
}

// setup returns a client on a fresh database with quota q (lifetime,
// default limit 3) and quota big (lifetime, default limit 1,000,000).
func setup(t *testing.T, conns int32) (*quota.Client, *pgxpool.Pool) {
	t.Helper()
	pool := pgtest.NewPool(t, conns)
	c, err := quota.New(pool, nil)
	require.NoError(t, err)
	ctx := context.Background()
	_, err = c.DefineQuota(ctx, quota.Definition{Name: "q", Window: quota.WindowNone, DefaultLimit: ptr[int64](3)})
	require.NoError(t, err)
	_, err = c.DefineQuota(ctx, quota.Definition{Name: "big", Window: quota.WindowNone, DefaultLimit: ptr[int64](1_000_000)})
	require.NoError(t, err)
	return c, pool
}

func TestRun100kRows(t *testing.T) {
	t.Parallel()
	// 100,000 rows: most on distinct members of big, some members of q
	// several times (limit 3, so the 4th row of a member is denied wherever
	// it is in the file), and malformed rows of every kind.
	const rows = 100_000
	var sb strings.Builder
	sb.WriteString("quota,member,amount,limit\n")
	type want struct {
		line   int
		status string
	}
	var wants []want
	qSeen := map[string]int{}
	line := 2
	for i := range rows {
		switch {
		case i%1000 == 7:
			fmt.Fprintf(&sb, "big,m%d,x,\n", i) // bad amount
			wants = append(wants, want{line, bulk.StatusError})
		case i%1000 == 8:
			fmt.Fprintf(&sb, "big,m%d\n", i) // too few fields
			wants = append(wants, want{line, bulk.StatusError})
		case i%1000 == 9:
			fmt.Fprintf(&sb, "nope,m%d,1,\n", i) // undefined quota
			wants = append(wants, want{line, bulk.StatusError})
		case i%1000 == 10:
			fmt.Fprintf(&sb, "big,m%d,0,\n", i) // amount below 1
			wants = append(wants, want{line, bulk.StatusError})
		case i%1000 == 11:
			fmt.Fprintf(&sb, "big,\"m\n%d\",1,\n", i) // a member with a control character
			wants = append(wants, want{line, bulk.StatusError})
			line++
		case i%10 == 0:
			m := fmt.Sprintf("r%d", i%997) // about 10 rows per member
			fmt.Fprintf(&sb, "q,%s,1,\n", m)
			qSeen[m]++
			st := bulk.StatusGranted
			if qSeen[m] > 3 {
				st = bulk.StatusDenied
			}
			wants = append(wants, want{line, st})
		default:
			fmt.Fprintf(&sb, "big,m%d,2,\n", i)
			wants = append(wants, want{line, bulk.StatusGranted})
		}
		line++
	}
	c, pool := setup(t, 4)
	r, err := bulk.NewReader(strings.NewReader(sb.String()))
	require.NoError(t, err)
	var got []bulk.Outcome
	sum, err := bulk.Run(context.Background(), c, r.Next, bulk.Options{BatchSize: 1000, Workers: 4}, func(o bulk.Outcome) error {
		got = append(got, o)
		return nil
	})
	require.NoError(t, err)
	require.Len(t, got, rows)
	var granted, denied, bad int64
	var bigUnits int64
	for i, o := range got {
		require.Equal(t, wants[i].line, o.Line, "outcomes come in file order")
		require.Equal(t, wants[i].status, o.Status, "line %d: %+v", o.Line, o)
		switch o.Status {
		case bulk.StatusGranted:
			granted++
			if o.Quota == "big" {
				bigUnits += o.Amount
				require.Equal(t, o.Amount, o.Used, "a distinct member's first grant")
			}
		case bulk.StatusDenied:
			denied++
			require.Equal(t, int64(3), o.Used)
		default:
			bad++
			require.NotEmpty(t, o.Error)
		}
	}
	require.Equal(t, bulk.Summary{Rows: rows, Granted: granted, Denied: denied, Errors: bad, Unkeyed: granted + denied,
		Batches: sum.Batches, Elapsed: sum.Elapsed, RowsPerSec: sum.RowsPerSec}, sum)
	require.Equal(t, int64(5*rows/1000), bad)

	// Every good row was granted once: the counters hold exactly the
	// granted units.
	var bigSum, bigRows, qSum int64
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT coalesce(sum(used), 0), count(*) FROM pgquota.usage WHERE quota_name = 'big'`).Scan(&bigSum, &bigRows))
	require.Equal(t, bigUnits, bigSum)
	require.Equal(t, granted-qGranted(qSeen), bigRows, "one counter per granted distinct member")
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT coalesce(sum(used), 0) FROM pgquota.usage WHERE quota_name = 'q'`).Scan(&qSum))
	require.Equal(t, qGranted(qSeen), qSum)
	t.Logf("%d rows in %.2fs (%.0f rows/s, -race, test machine load), %d statements", sum.Rows, sum.Elapsed.Seconds(), sum.RowsPerSec, sum.Batches)
}

// qGranted is the number of q rows granted: at most 3 per member.
func qGranted(seen map[string]int) int64 {
	var n int64
	for _, k := range seen {
		n += int64(min(k, 3))
	}
	return n
}

func TestRunStopsWhenTheDatabaseFails(t *testing.T) {
	t.Parallel()
	// A database without pgquota's schema: the first batch fails with
	// nothing written, the run stops with the error, and every row is
	// reported not run (the failed batches' rows say why).
	pool := pgtest.Connect(t, pgtest.NewEmptyURL(t), 2)
	c, err := quota.New(pool, nil)
	require.NoError(t, err)
	var sb strings.Builder
	sb.WriteString("quota,member,amount\n")
	for i := range 5000 {
		fmt.Fprintf(&sb, "q,m%d,1\n", i)
	}
	r, err := bulk.NewReader(strings.NewReader(sb.String()))
	require.NoError(t, err)
	var got []bulk.Outcome
	sum, err := bulk.Run(context.Background(), c, r.Next, bulk.Options{BatchSize: 100, Workers: 2}, func(o bulk.Outcome) error {
		got = append(got, o)
		return nil
	})
	require.ErrorIs(t, err, quota.ErrSchemaMissing)
	require.Len(t, got, 5000, "every row has an outcome")
	require.Equal(t, int64(5000), sum.NotRun)
	require.False(t, sum.Interrupted)
	failed := 0
	for _, o := range got {
		require.Equal(t, bulk.StatusNotRun, o.Status)
		if strings.Contains(o.Error, "nothing granted") {
			failed++
		} else {
			require.Contains(t, o.Error, "the run stopped")
		}
	}
	require.GreaterOrEqual(t, failed, 100, "the failed batch's rows say it failed")
	require.Less(t, failed, 5000, "the run stopped")
}

func TestRunEmitErrorStops(t *testing.T) {
	t.Parallel()
	c, _ := setup(t, 2)
	var sb strings.Builder
	sb.WriteString("quota,member,amount\n")
	for i := range 3000 {
		fmt.Fprintf(&sb, "big,m%d,1\n", i)
	}
	r, err := bulk.NewReader(strings.NewReader(sb.String()))
	require.NoError(t, err)
	n := 0
	_, err = bulk.Run(context.Background(), c, r.Next, bulk.Options{BatchSize: 100, Workers: 2}, func(bulk.Outcome) error {
		n++
		if n == 150 {
			return io.ErrShortWrite
		}
		return nil
	})
	require.ErrorIs(t, err, io.ErrShortWrite)
	require.Equal(t, 150, n, "nothing is emitted after a failed emit")
}

func TestRunKeyedTwice(t *testing.T) {
	t.Parallel()
	// 5,000 rows on distinct members of big, every other one with an
	// idempotency key, and some keys repeated later in the file (the copy
	// replays the first row). Run twice: the keyed rows are granted once,
	// the unkeyed ones twice.
	c, pool := setup(t, 4)
	var sb strings.Builder
	sb.WriteString("quota,member,amount,idempotency_key\n")
	const rows = 5000
	for i := range rows {
		switch {
		case i%2 == 0:
			fmt.Fprintf(&sb, "big,m%d,1,\n", i)
		case i%100 == 99:
			fmt.Fprintf(&sb, "big,m%d,1,k%d\n", i-98, i-98) // a copy of row i-98's key and request
		default:
			fmt.Fprintf(&sb, "big,m%d,1,k%d\n", i, i)
		}
	}
	file := sb.String()
	run := func() []bulk.Outcome {
		r, err := bulk.NewReader(strings.NewReader(file))
		require.NoError(t, err)
		var got []bulk.Outcome
		_, err = bulk.Run(context.Background(), c, r.Next, bulk.Options{BatchSize: 300, Workers: 3}, func(o bulk.Outcome) error {
			got = append(got, o)
			return nil
		})
		require.NoError(t, err)
		require.Len(t, got, rows)
		return got
	}
	first := run()
	for i, o := range first {
		require.Equal(t, bulk.StatusGranted, o.Status, "row %d: %+v", i, o)
		switch {
		case i%2 == 0:
			require.Zero(t, o.GrantID)
		case i%100 == 99:
			require.True(t, o.Replayed, "row %d repeats the key of row %d", i, i-98)
			require.Equal(t, first[i-98].GrantID, o.GrantID)
		default:
			require.Positive(t, o.GrantID)
			require.False(t, o.Replayed)
		}
	}
	second := run()
	for i, o := range second {
		require.Equal(t, bulk.StatusGranted, o.Status)
		if i%2 == 1 {
			require.True(t, o.Replayed, "row %d", i)
			require.Equal(t, first[i].GrantID, o.GrantID)
			require.Equal(t, first[i].Used, o.Used)
		} else {
			require.Equal(t, int64(2), o.Used, "an unkeyed row is granted again")
		}
	}
	var sum int64
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT sum(used) FROM pgquota.usage`).Scan(&sum))
	keyed := int64(rows/2 - rows/100) // keyed rows that are not copies
	require.Equal(t, 2*int64(rows/2)+keyed, sum)
}
