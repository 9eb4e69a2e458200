package bench

import (
	"fmt"
	"image/color"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
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

// WriteChart draws operations per second against clients, one line per
// strategy (and a dashed one per strategy for pgbench, when measured), to
// path as SVG or PNG (by its extension).
func WriteChart(rep *Report, path string) error {
	if _, err := ChartFormat(path); err != nil {
		return err
	}
	p := plot.New()
	p.Title.Text = "pgquota bench: throughput by clients (durable commits)"
	p.X.Label.Text = "clients"
	p.Y.Label.Text = "operations / s"
	p.Y.Min = 0
	p.Add(plotter.NewGrid())
	p.Legend.Top = true
	p.Legend.Left = false

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
		c := plotutil.Color(i)
		if err := addLine(p, name, lib, c, nil, plotutil.Shape(i)); err != nil {
			return err
		}
		if len(pg) > 0 {
			dash := []vg.Length{vg.Points(4), vg.Points(3)}
			if err := addLine(p, name+" (pgbench)", pg, c, dash, plotutil.Shape(i)); err != nil {
				return err
			}
		}
	}
	p.X.Tick.Marker = plot.ConstantTicks(ticks)
	return p.Save(9*vg.Inch, 5.5*vg.Inch, path)
}

func addLine(p *plot.Plot, label string, xys plotter.XYs, c color.Color, dashes []vg.Length, shape draw.GlyphDrawer) error {
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
	p.Legend.Add(label, l, pts)
	return nil
}
