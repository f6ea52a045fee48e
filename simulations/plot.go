package simulations

import (
	"fmt"
	"image/color"
	"io"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"

	"github.com/quotientlabs/quotient/limiter"
)

// regionColors are the fills of the regions' admitted areas (Tableau 10),
// cycled when there are more regions.
var regionColors = []color.RGBA{
	{78, 121, 167, 255}, {242, 142, 43, 255}, {89, 161, 79, 255}, {225, 87, 89, 255},
	{118, 183, 178, 255}, {237, 201, 72, 255}, {176, 122, 161, 255}, {255, 157, 167, 255},
	{156, 117, 95, 255}, {186, 176, 172, 255},
}

// lighten mixes c halfway to white, for fills under darker lines.
func lighten(c color.RGBA) color.RGBA {
	return color.RGBA{R: c.R/2 + 128, G: c.G/2 + 128, B: c.B/2 + 128, A: 255}
}

func regionColor(r int, alpha uint8) color.RGBA {
	c := regionColors[r%len(regionColors)]
	c.A = alpha
	return c
}

// WritePlot writes <name>.svg: one panel per named key and policy. For a
// bucket, admitted cost per second stacked by region, against the limit L,
// the ideal limiter's admissions and each region's share (dashed, in the
// region's colour). For a fixed window, the same as running totals within
// each of the policy's windows, against the limit Q. Values are averaged
// over bins of a few seconds so that long runs stay legible.
func (rep *Report) WritePlot(w io.Writer) error {
	named := rep.rec.Named()
	const panelH = 3.2 * vg.Inch
	width := 10 * vg.Inch
	rows := max(1, len(named))
	var plots [][]*plot.Plot
	for _, k := range named {
		p, err := rep.keyPlot(k)
		if err != nil {
			return err
		}
		plots = append(plots, []*plot.Plot{p})
	}
	if len(plots) == 0 {
		p := plot.New()
		p.Title.Text = rep.Scenario + ": no named keys to plot (generated groups are summarised in the tables)"
		plots = append(plots, []*plot.Plot{p})
	}
	c := vgsvg.New(width, panelH*vg.Length(rows))
	dc := draw.New(c)
	tiles := draw.Tiles{Rows: rows, Cols: 1, PadTop: vg.Points(4), PadBottom: vg.Points(4), PadX: vg.Points(4), PadY: vg.Points(12)}
	canvases := plot.Align(plots, tiles, dc)
	for i := range plots {
		plots[i][0].Draw(canvases[i][0])
	}
	_, err := c.WriteTo(w)
	return err
}

// keyPlot draws one named key and policy.
func (rep *Report) keyPlot(k int) (*plot.Plot, error) {
	t := rep.rec.keys[k]
	sc := rep.rec.sc
	dur := sc.DurationSec
	bin := max(1, dur/300)
	window := t.policy.Algorithm == limiter.FixedWindow
	// running turns per-second values into what the panel shows: per
	// second (buckets) or running totals within policy windows.
	running := func(v []int64, scale float64) []float64 {
		out := make([]float64, dur)
		var acc float64
		var win int64 = -1
		for s := int64(0); s < dur; s++ {
			x := float64(v[s]) * scale
			if window {
				if w := (rep.startUnix + s) / t.policy.WindowSec; w != win {
					win, acc = w, 0
				}
				acc += x
				out[s] = acc
			} else {
				out[s] = x
			}
		}
		return out
	}
	binned := func(v []float64) plotter.XYs {
		n := (dur + bin - 1) / bin
		xys := make(plotter.XYs, 0, n)
		for b := int64(0); b < n; b++ {
			from, to := b*bin, min(dur, (b+1)*bin)
			sum := 0.0
			for s := from; s < to; s++ {
				sum += v[s]
			}
			xys = append(xys, plotter.XY{X: float64(from+to) / 2, Y: sum / float64(to-from)})
		}
		return xys
	}

	p := plot.New()
	unit := "cost units per second"
	limit := float64(t.policy.RateMilli()) / 1000
	if window {
		unit = fmt.Sprintf("cost units so far in the %d s window", t.policy.WindowSec)
		limit = float64(t.policy.Limit)
	}
	p.Title.Text = fmt.Sprintf("%s: key %s, policy %s (%s)", rep.Scenario, t.key, t.policy.ID, t.policy.Algorithm)
	p.X.Label.Text = "simulated time (s)"
	p.Y.Label.Text = unit
	p.X.Min, p.X.Max = 0, float64(dur)
	p.Y.Min = 0
	p.Legend.Top = true
	p.Legend.Left = true
	p.Legend.XOffs = vg.Points(8)
	p.Legend.Padding = vg.Points(1)
	p.Legend.TextStyle.Font.Size = vg.Points(8)
	p.Add(plotter.NewGrid())

	// Stacked admitted: draw the total first, then each lower stack over it.
	n := len(sc.Regions)
	stacks := make([][]float64, n)
	acc := make([]float64, dur)
	for r := range sc.Regions {
		vals := running(t.secRegAdmitted[r], 1)
		for s := range acc {
			acc[s] += vals[s]
		}
		stacks[r] = append([]float64(nil), acc...)
	}
	for r := n - 1; r >= 0; r-- {
		l, err := plotter.NewLine(binned(stacks[r]))
		if err != nil {
			return nil, err
		}
		l.FillColor = lighten(regionColor(r, 255))
		l.LineStyle.Width = vg.Points(0.3)
		l.LineStyle.Color = regionColor(r, 255)
		p.Add(l)
		p.Legend.Add("admitted "+sc.Regions[r], l)
	}
	for r := range sc.Regions {
		// A share is a rate (buckets) or a budget (windows), never a
		// running total.
		share := make([]float64, dur)
		for s := range share {
			share[s] = float64(t.secShareMilli[r][s]) / 1000
		}
		l, err := plotter.NewLine(binned(share))
		if err != nil {
			return nil, err
		}
		l.LineStyle.Color = regionColor(r, 255)
		l.LineStyle.Width = vg.Points(1.2)
		l.LineStyle.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		p.Add(l)
		if r == 0 {
			p.Legend.Add("shares (dashed, region colour)", l)
		}
	}
	ideal, err := plotter.NewLine(binned(running(rep.ideal[k], 0.001)))
	if err != nil {
		return nil, err
	}
	ideal.LineStyle.Width = vg.Points(1.5)
	ideal.LineStyle.Color = color.Black
	p.Add(ideal)
	p.Legend.Add("ideal (one global limiter)", ideal)
	lim, err := plotter.NewLine(plotter.XYs{{X: 0, Y: limit}, {X: float64(dur), Y: limit}})
	if err != nil {
		return nil, err
	}
	lim.LineStyle.Color = color.RGBA{200, 0, 0, 255}
	lim.LineStyle.Width = vg.Points(1.5)
	lim.LineStyle.Dashes = []vg.Length{vg.Points(8), vg.Points(4)}
	p.Add(lim)
	p.Legend.Add("limit", lim)
	// Headroom above the data for the legend.
	top := limit
	for _, v := range stacks[n-1] {
		top = max(top, v)
	}
	for _, v := range running(rep.ideal[k], 0.001) {
		top = max(top, v)
	}
	p.Y.Max = 1.6 * top
	return p, nil
}
