package bulk_test

import (
	"context"
	"fmt"
	"strings"

	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/bulk"

	"github.com/pgquota/pgquota/quota"
)

// A UTF-8 file with a byte order mark whose fields are all quoted (Excel's
// "CSV UTF-8", Python's csv.QUOTE_ALL with utf-8-sig): the mark is not part
// of the first field, so the quoted header is no bare quote.
func TestReaderBOMBeforeQuotedHeader(t *testing.T) {
	t.Parallel()
	rows := readAll(t, "\ufeff\"quota\",\"member\",\"amount\"\r\n\"q\",\"m\",\"1\"\r\n")
	require.Len(t, rows, 1)
	require.NoError(t, rows[0].Err)
	require.Equal(t, quota.GrantRequest{Quota: "q", Member: "m", Amount: 1}, rows[0].Request)
	require.Equal(t, 2, rows[0].Line)
}

// A key used on two lines for different members (a data error in the
// file): the line that comes first in the file is the key's request, and
// the later line is the reuse that fails, as when the file is granted
// row by row. Rows of different members go to different workers, so the
// later line's batch may commit first.
func TestRunKeyReusedAcrossWorkersFirstLineWins(t *testing.T) {
	t.Parallel()
	c, _ := setup(t, 8)
	const pairs = 200
	var file strings.Builder
	file.WriteString("quota,member,amount,idempotency_key\n")
	for i := range pairs {
		fmt.Fprintf(&file, "q,first-%d,1,key-%d\n", i, i)
		fmt.Fprintf(&file, "q,second-%d,1,key-%d\n", i, i)
	}
	r, err := bulk.NewReader(strings.NewReader(file.String()))
	require.NoError(t, err)
	var outs []bulk.Outcome
	_, err = bulk.Run(context.Background(), c, r.Next, bulk.Options{BatchSize: 1, Workers: 8}, func(o bulk.Outcome) error {
		outs = append(outs, o)
		return nil
	})
	require.NoError(t, err)
	require.Len(t, outs, 2*pairs)
	wrong := 0
	for i := range pairs {
		first, second := outs[2*i], outs[2*i+1]
		if first.Status == bulk.StatusError {
			wrong++
			require.Equal(t, bulk.StatusGranted, second.Status)
			if wrong == 1 {
				t.Errorf("line %d (%s) failed with %q while the later line %d (%s) was granted under its key",
					first.Line, first.Member, first.Error, second.Line, second.Member)
			}
		}
	}
	require.Zero(t, wrong, "pairs whose later line took the key")
}
