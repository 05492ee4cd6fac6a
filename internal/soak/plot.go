package soak

import (
	"fmt"
	"io"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// WritePNG draws each of [Quantities] against time, one panel each, with
// title and the fitted trend (after warmUp) above it, as a PNG.
func WritePNG(w io.Writer, title string, samples []Sample, warmUp time.Duration) error {
	trends, err := Trends(samples, warmUp)
	if err != nil {
		return err
	}
	const rows, cols = 2, 2
	plots := make([][]*plot.Plot, rows)
	for r := range rows {
		plots[r] = make([]*plot.Plot, cols)
		for c := range cols {
			i := r*cols + c
			q, tr := Quantities[i], trends[i]
			p := plot.New()
			p.Title.Text = fmt.Sprintf("%s: %s %+.2f %s/h after warm-up", title, q.Name, tr.PerHour, q.Unit)
			p.X.Label.Text = "minutes"
			p.Y.Label.Text = q.Unit
			if q.Unit == "" {
				p.Y.Label.Text = "count"
			}
			pts := make(plotter.XYs, len(samples))
			for j, s := range samples {
				pts[j] = plotter.XY{X: s.Elapsed.Minutes(), Y: q.Value(s)}
			}
			line, err := plotter.NewLine(pts)
			if err != nil {
				return err
			}
			p.Add(line, plotter.NewGrid())
			p.Y.Min = 0
			plots[r][c] = p
		}
	}
	img := vgimg.New(vg.Points(1000), vg.Points(700))
	body := draw.New(img)
	tiles := draw.Tiles{Rows: rows, Cols: cols, PadX: vg.Millimeter * 4, PadY: vg.Millimeter * 4, PadTop: vg.Millimeter * 2,
		PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	canvases := plot.Align(plots, tiles, body)
	for r := range rows {
		for c := range cols {
			plots[r][c].Draw(canvases[r][c])
		}
	}
	_, err = vgimg.PngCanvas{Canvas: img}.WriteTo(w)
	return err
}
