package dbutil_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/internal/dbutil"
)

// Which errors leave a call's outcome unknown: the server's own ERROR
// does not (the statement rolled back), except a Citus coordinator's
// failed one-phase commit on a worker; a FATAL, a lost connection or a
// context ended mid-request do.
func TestSentWithoutReplyClassifiesErrors(t *testing.T) {
	for _, tc := range []struct {
		name    string
		err     error
		unknown bool
	}{
		{"nil", nil, false},
		{"statement error", &pgconn.PgError{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "23505", Message: "duplicate key"}, false},
		{"Citus remote connection lost during the statement", &pgconn.PgError{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "08006",
			Message: "connection to the remote node postgres@127.0.0.1:5433 failed with the following error: connection not open"}, false},
		{"Citus worker commit failed", &pgconn.PgError{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "XX000",
			Message: "could not commit transaction for shard 102008 on any active node"}, true},
		{"Citus worker commit failed, wrapped", fmt.Errorf("pgquota: grant: %w", &pgconn.PgError{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "XX000",
			Message: "could not commit transaction for shard 7 on any active node"}), true},
		{"FATAL", &pgconn.PgError{Severity: "FATAL", SeverityUnlocalized: "FATAL", Code: "57P01", Message: "terminating connection due to administrator command"}, true},
		{"lost connection", io.ErrUnexpectedEOF, true},
		{"deadline mid-request", context.DeadlineExceeded, true},
		{"no rows", pgx.ErrNoRows, false},
		{"commit rolled back", pgx.ErrTxCommitRollback, false},
		{"already unknown", dbutil.MarkOutcome(io.ErrUnexpectedEOF), false},
		{"a connection attempt", &pgconn.ConnectError{}, false},
		{"other", errors.New("boom"), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.unknown, dbutil.SentWithoutReply(tc.err))
			if tc.unknown {
				require.ErrorIs(t, dbutil.MarkOutcome(tc.err), dbutil.ErrOutcomeUnknown)
			}
		})
	}
}
