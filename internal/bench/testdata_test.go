package bench

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// testdataScripts are the strategies whose pgbench scripts are checked in
// as testdata/<name>.pgbench: the fenced lock's statements. The files are a
// readable copy of the SQL that the library sends; TestPgbenchEquivalence
// fails when the library drifts from them, so that a change of that SQL
// shows in review. Set PGQUOTA_UPDATE_SCRIPTS=1 to rewrite them.
var testdataScripts = []string{"lease-acquire", "fenced-write"}

// scriptFile renders a script as its checked-in file: the pgbench command
// with the -D arguments it needs, then the script.
func scriptFile(s *Script) string {
	var sb strings.Builder
	sb.WriteString("-- pgbench --no-vacuum --protocol=prepared --file=" + s.Strategy + ".pgbench")
	for _, d := range s.Defines {
		sb.WriteString(" --define='" + d + "'")
	}
	sb.WriteString("\n")
	sb.WriteString(s.Text)
	return sb.String()
}

// checkTestdata compares script with its checked-in file, if it has one.
func checkTestdata(t *testing.T, script *Script) {
	t.Helper()
	if !slices.Contains(testdataScripts, script.Strategy) {
		return
	}
	path := filepath.Join("testdata", script.Strategy+".pgbench")
	if os.Getenv("PGQUOTA_UPDATE_SCRIPTS") != "" {
		require.NoError(t, os.WriteFile(path, []byte(scriptFile(script)), 0o644))
	}
	b, err := os.ReadFile(path)
	require.NoError(t, err, "run with PGQUOTA_UPDATE_SCRIPTS=1 to create it")
	require.Equal(t, string(b), scriptFile(script),
		"%s drifted from the library's SQL: run with PGQUOTA_UPDATE_SCRIPTS=1 and review the diff", path)
}

// TestTestdataHasNoStrayScripts: every checked-in script is checked.
func TestTestdataHasNoStrayScripts(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob(filepath.Join("testdata", "*.pgbench"))
	require.NoError(t, err)
	var names []string
	for _, f := range files {
		names = append(names, strings.TrimSuffix(filepath.Base(f), ".pgbench"))
	}
	require.ElementsMatch(t, testdataScripts, names)
}
