package bench

import (
	"bytes"
	"encoding/xml"
	"image/png"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func sampleReport() *Report {
	rep := &Report{}
	for i, s := range []string{"grant-hot", "grant-spread", "for-update", "serializable", "voucher-claim", "advisory-lock", "grant-first", "lease-acquire", "fenced-write"} {
		for _, n := range []int{1, 8, 32, 64} {
			ops := float64(1000*(i+1)) / float64(n)
			rep.Results = append(rep.Results, Result{
				Strategy: s, Clients: n,
				Library: LibraryResult{OpsPerSec: ops},
				Pgbench: &PgbenchResult{TPS: ops * 1.1},
			})
		}
	}
	return rep
}

func TestWriteChart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if d := os.Getenv("PGQUOTA_CHART_DIR"); d != "" {
		dir = d // to look at the charts
	}

	svgPath := filepath.Join(dir, "bench.svg")
	require.NoError(t, WriteChart(sampleReport(), svgPath))
	b, err := os.ReadFile(svgPath)
	require.NoError(t, err)
	dec := xml.NewDecoder(bytes.NewReader(b))
	var root string
	for root == "" {
		tok, err := dec.Token()
		require.NoError(t, err)
		if se, ok := tok.(xml.StartElement); ok {
			root = se.Name.Local
		}
	}
	require.Equal(t, "svg", root)
	for {
		if _, err := dec.Token(); err != nil {
			require.ErrorContains(t, err, "EOF", "the SVG is well-formed")
			break
		}
	}
	require.Contains(t, string(b), "serializable (pgbench)")

	pngPath := filepath.Join(dir, "bench.png")
	require.NoError(t, WriteChart(sampleReport(), pngPath))
	f, err := os.Open(pngPath)
	require.NoError(t, err)
	defer f.Close()
	img, err := png.Decode(f)
	require.NoError(t, err)
	require.Equal(t, 960, img.Bounds().Dx()) // 10in at 96 dpi

	require.ErrorContains(t, WriteChart(sampleReport(), filepath.Join(dir, "bench.pdf")), ".svg or .png")
}
