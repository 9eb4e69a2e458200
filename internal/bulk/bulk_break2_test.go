package bulk_test

import (
	"testing"

	"github.com/stretchr/testify/require"

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
