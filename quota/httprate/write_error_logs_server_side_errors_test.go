package httprate_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgquota/pgquota/quota"
	"github.com/pgquota/pgquota/quota/httprate"
)

// WriteError logs what the service must see (a quota that is not defined
// answers 500 with a body that names nothing), and not a client's bad key.
// Not parallel: it replaces slog's default logger.
func TestWriteErrorLogsServerSideErrors(t *testing.T) {
	var buf bytes.Buffer
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewJSONHandler(&buf, nil)))
	t.Cleanup(func() { slog.SetDefault(prev) })

	for _, tc := range []struct {
		err    error
		status int
		logged bool
	}{
		{fmt.Errorf("grant: %w: %q", quota.ErrQuotaNotFound, "api"), http.StatusInternalServerError, true},
		{fmt.Errorf("grant: %w", quota.ErrOutcomeUnknown), http.StatusServiceUnavailable, true},
		{errors.New("dial tcp: connection refused"), http.StatusServiceUnavailable, true},
		{&httprate.KeyError{Err: errors.New("no key")}, http.StatusBadRequest, false},
	} {
		buf.Reset()
		w := httptest.NewRecorder()
		httprate.WriteError(w, httptest.NewRequest(http.MethodGet, "/v1/things", nil), tc.err)
		require.Equal(t, tc.status, w.Code, "%v", tc.err)
		if tc.logged {
			require.Contains(t, buf.String(), `"path":"/v1/things"`, "%v", tc.err)
			require.Contains(t, buf.String(), `"msg":"pgquota rate limit: the grant failed"`)
			msg, err := json.Marshal(tc.err.Error())
			require.NoError(t, err)
			require.Contains(t, buf.String(), `"error":`+string(msg), "the log carries the error")
		} else {
			require.Empty(t, buf.String(), "a client's bad key is not the service's error")
		}
	}
}
