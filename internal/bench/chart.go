package bench

import (
	"fmt"
	"image/color"
	"os"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// ChartFormat returns the chart format for path's extension, "svg" or
// "png", or an error naming the extensions that work.
func ChartFormat(path string) (string, error) {
	switch ext := strings.ToLower(filepath.Ext(path)); ext {
	case ".svg", ".png":
		return ext[1:], nil
	default:
		return "", fmt.Errorf("chart file %q: the name must end in .svg or .png", path)
	}
}

// chartColors holds one distinct color per strategy (Tableau 10, then two
// darker shades for the hot-row strategies; plotutil's default palette has
// 7, fewer than the strategies).
var chartColors = []color.Color{
	color.RGBA{R: 0x4e, G: 0x79, B: 0xa7, A: 0xff},
	color.RGBA{R: 0xf2, G: 0x8e, B: 0x2b, A: 0xff},
	color.RGBA{R: 0xe1, G: 0x57, B: 0x59, A: 0xff},
	color.RGBA{R: 0x76, G: 0xb7, B: 0xb2, A: 0xff},
	color.RGBA{R: 0x59, G: 0xa1, B: 0x4f, A: 0xff},
	color.RGBA{R: 0xed, G: 0xc9, B: 0x48, A: 0xff},
	color.RGBA{R: 0xb0, G: 0x7a, B: 0xa1, A: 0xff},
	color.RGBA{R: 0xff, G: 0x9d, B: 0xa7, A: 0xff},
	color.RGBA{R: 0x9c, G: 0x75, B: 0x5f, A: 0xff},
	color.RGBA{R: 0xba, G: 0xb0, B: 0xac, A: 0xff},
	color.RGBA{R: 0x1f, G: 0x3a, B: 0x5f, A: 0xff},
	color.RGBA{R: 0x8c, G: 0x2d, B: 0x04, A: 0xff},
}

// WriteChart draws operations per second against clients (log scale),
// one line per strategy and a dashed one per strategy for pgbench when
// measured, with the legend beside the plot, to path as SVG or PNG (by its
// extension).
func WriteChart(rep *Report, path string) error {
	format, err := ChartFormat(path)
	if err != nil {
		return err
	}
	p := plot.New()
	p.Title.Text = "pgquota bench: throughput by clients (durable commits)"
	p.X.Label.Text = "clients"
	p.Y.Label.Text = "operations / s"
	p.Y.Min = 0
	p.X.Scale = plot.LogScale{}
	p.Add(plotter.NewGrid())
	legend := plot.NewLegend()
	legend.Top = true
	legend.Left = true

	var order []string
	byName := map[string][]Result{}
	for _, r := range rep.Results {
		if _, ok := byName[r.Strategy]; !ok {
			order = append(order, r.Strategy)
		}
		byName[r.Strategy] = append(byName[r.Strategy], r)
	}
	var ticks []plot.Tick
	seen := map[int]bool{}
	for i, name := range order {
		rs := byName[name]
		lib := make(plotter.XYs, len(rs))
		var pg plotter.XYs
		for j, r := range rs {
			lib[j] = plotter.XY{X: float64(r.Clients), Y: r.Library.OpsPerSec}
			if r.Pgbench != nil {
				pg = append(pg, plotter.XY{X: float64(r.Clients), Y: r.Pgbench.TPS})
			}
			if !seen[r.Clients] {
				seen[r.Clients] = true
				ticks = append(ticks, plot.Tick{Value: float64(r.Clients), Label: fmt.Sprint(r.Clients)})
			}
		}
		c := chartColors[i%len(chartColors)]
		if err := addLine(p, &legend, name, lib, c, nil, plotutil.Shape(i)); err != nil {
			return err
		}
		if len(pg) > 0 {
			dash := []vg.Length{vg.Points(4), vg.Points(3)}
			if err := addLine(p, &legend, name+" (pgbench)", pg, c, dash, plotutil.Shape(i)); err != nil {
				return err
			}
		}
	}
	p.X.Tick.Marker = plot.ConstantTicks(ticks)
	if len(ticks) == 1 {
		// One client count: widen the axis around it.
		p.X.Min, p.X.Max = ticks[0].Value/2, ticks[0].Value*2
	} else {
		// Room for the glyphs of the first and last client counts.
		p.X.Min, p.X.Max = p.X.Min/1.08, p.X.Max*1.08
	}
	// Room above the highest point, so that its glyph is not cut off.
	p.Y.Max *= 1.08
	p.Title.Padding = vg.Points(8)

	const w, h = 10 * vg.Inch, 5.5 * vg.Inch
	legendWidth := 2.6 * vg.Inch
	var (
		canvas vg.CanvasWriterTo
		dc     draw.Canvas
	)
	switch format {
	case "svg":
		c := vgsvg.New(w, h)
		canvas, dc = c, draw.New(c)
	default:
		c := vgimg.PngCanvas{Canvas: vgimg.New(w, h)}
		canvas, dc = c, draw.New(c)
	}
	// A margin at the top, so that the title does not touch the edge.
	p.Draw(draw.Crop(dc, 0, -legendWidth, 0, -vg.Points(6)))
	legend.Draw(draw.Crop(dc, w-legendWidth+vg.Points(8), 0, 0, -vg.Points(30)))

	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := canvas.WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("write chart %s: %w", path, err)
	}
	return f.Close()
}

func addLine(p *plot.Plot, legend *plot.Legend, label string, xys plotter.XYs, c color.Color, dashes []vg.Length, shape draw.GlyphDrawer) error {
	l, pts, err := plotter.NewLinePoints(xys)
	if err != nil {
		return fmt.Errorf("chart %s: %w", label, err)
	}
	l.Color = c
	l.Dashes = dashes
	l.Width = vg.Points(1.5)
	pts.Color = c
	pts.Shape = shape
	p.Add(l, pts)
	legend.Add(label, l, pts)
	return nil
}
