package bench

import (
	"fmt"
	"html"
	"math"
	"strings"
)

// A small SVG line chart, enough for the report's two kinds of plot; the
// report must open offline, so nothing is fetched from anywhere.

type point struct{ x, y float64 }

type line struct {
	name   string
	color  string
	points []point
	dashed bool
	// step draws the line as a staircase: the value holds until the next
	// point (an offered load changes by phase, it does not slide).
	step bool
}

// rule is a horizontal reference line.
type rule struct {
	y     float64
	label string
}

type chart struct {
	title, xLabel, yLabel string
	logY                  bool
	// yTick formats the y axis' tick labels; default formatTick.
	yTick func(float64) string
	lines []line
	rules []rule
}

// Chart geometry, in SVG user units.
const (
	chartWidth   = 720
	chartHeight  = 360
	marginLeft   = 70
	marginRight  = 150
	marginTop    = 30
	marginBottom = 45
)

// palette colours lines by order; the lockd line is always first.
var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"}

func (c chart) bounds() (xmin, xmax, ymin, ymax float64) {
	xmin, ymin = math.Inf(1), math.Inf(1)
	xmax, ymax = math.Inf(-1), math.Inf(-1)
	for _, l := range c.lines {
		for _, p := range l.points {
			if c.logY && p.y <= 0 {
				continue
			}
			xmin, xmax = min(xmin, p.x), max(xmax, p.x)
			ymin, ymax = min(ymin, p.y), max(ymax, p.y)
		}
	}
	for _, r := range c.rules {
		ymin, ymax = min(ymin, r.y), max(ymax, r.y)
	}
	if math.IsInf(xmin, 0) {
		return 0, 1, 0, 1
	}
	if !c.logY {
		xmin, ymin = min(xmin, 0), min(ymin, 0)
	}
	if xmax == xmin {
		xmax = xmin + 1
	}
	if ymax == ymin {
		ymax = ymin * 2
		if ymax == 0 {
			ymax = 1
		}
	}
	if c.logY {
		ymin = math.Pow(10, math.Floor(math.Log10(ymin)))
		ymax = math.Pow(10, math.Ceil(math.Log10(ymax)))
	} else {
		ymax = niceCeil(ymax)
	}
	return xmin, xmax, ymin, ymax
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

// ticks returns about n round values from lo to hi.
func ticks(lo, hi float64, n int) []float64 {
	step := niceCeil((hi - lo) / float64(n))
	var out []float64
	for v := math.Ceil(lo/step) * step; v <= hi+step/1e9; v += step {
		out = append(out, v)
	}
	return out
}

func formatTick(v float64) string {
	switch a := math.Abs(v); {
	case a >= 1e6:
		return fmt.Sprintf("%gM", v/1e6)
	case a >= 1e3:
		return fmt.Sprintf("%gk", v/1e3)
	}
	return fmt.Sprintf("%g", math.Round(v*1000)/1000)
}

// formatMicrosTick labels a latency axis whose values are microseconds.
func formatMicrosTick(us float64) string {
	switch {
	case us >= 1e6:
		return fmt.Sprintf("%gs", us/1e6)
	case us >= 1e3:
		return fmt.Sprintf("%gms", us/1e3)
	}
	return fmt.Sprintf("%gµs", us)
}

func (c chart) svg() string {
	xmin, xmax, ymin, ymax := c.bounds()
	plotW := float64(chartWidth - marginLeft - marginRight)
	plotH := float64(chartHeight - marginTop - marginBottom)
	px := func(x float64) float64 { return marginLeft + (x-xmin)/(xmax-xmin)*plotW }
	py := func(y float64) float64 {
		if c.logY {
			y = math.Log10(max(y, ymin))
			return marginTop + plotH - (y-math.Log10(ymin))/(math.Log10(ymax)-math.Log10(ymin))*plotH
		}
		return marginTop + plotH - (y-ymin)/(ymax-ymin)*plotH
	}

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="11">`,
		chartWidth, chartHeight, chartWidth, chartHeight)
	fmt.Fprintf(&b, `<text x="%d" y="18" font-size="13" font-weight="bold">%s</text>`, marginLeft, html.EscapeString(c.title))
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.0f" height="%.0f" fill="none" stroke="#999"/>`, marginLeft, marginTop, plotW, plotH)

	for _, x := range ticks(xmin, xmax, 8) {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%.1f" stroke="#eee"/>`, px(x), marginTop, px(x), marginTop+plotH)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`, px(x), marginTop+plotH+14, formatTick(x))
	}
	var yTicks []float64
	if c.logY {
		for v := ymin; v <= ymax*1.0001; v *= 10 {
			yTicks = append(yTicks, v)
		}
	} else {
		yTicks = ticks(ymin, ymax, 6)
	}
	yTick := c.yTick
	if yTick == nil {
		yTick = formatTick
	}
	for _, y := range yTicks {
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#eee"/>`, marginLeft, py(y), marginLeft+plotW, py(y))
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`, marginLeft-5, py(y)+4, yTick(y))
	}
	fmt.Fprintf(&b, `<text x="%.0f" y="%d" text-anchor="middle">%s</text>`, marginLeft+plotW/2, chartHeight-8, html.EscapeString(c.xLabel))
	fmt.Fprintf(&b, `<text transform="translate(14 %.0f) rotate(-90)" text-anchor="middle">%s</text>`, marginTop+plotH/2, html.EscapeString(c.yLabel))

	for _, r := range c.rules {
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#777" stroke-dasharray="2 3"/>`, marginLeft, py(r.y), marginLeft+plotW, py(r.y))
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" fill="#555">%s</text>`, marginLeft+4, py(r.y)-3, html.EscapeString(r.label))
	}
	legendY := marginTop + 10
	for i, l := range c.lines {
		color := l.color
		if color == "" {
			color = palette[i%len(palette)]
		}
		dash := ""
		if l.dashed {
			dash = ` stroke-dasharray="6 3"`
		}
		var path strings.Builder
		for j, p := range l.points {
			if c.logY && p.y <= 0 {
				continue
			}
			switch {
			case path.Len() == 0:
				fmt.Fprintf(&path, "M%.1f %.1f", px(p.x), py(p.y))
			case l.step:
				fmt.Fprintf(&path, " H%.1f V%.1f", px(p.x), py(p.y))
			default:
				fmt.Fprintf(&path, " L%.1f %.1f", px(p.x), py(p.y))
			}
			if !l.step && len(l.points) < 40 {
				fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"><title>%s: %g, %g</title></circle>`,
					px(p.x), py(p.y), color, html.EscapeString(l.name), l.points[j].x, l.points[j].y)
			}
		}
		fmt.Fprintf(&b, `<path d="%s" fill="none" stroke="%s" stroke-width="1.8"%s/>`, path.String(), color, dash)
		fmt.Fprintf(&b, `<line x1="%.0f" y1="%d" x2="%.0f" y2="%d" stroke="%s" stroke-width="2"%s/>`,
			marginLeft+plotW+8, legendY, marginLeft+plotW+28, legendY, color, dash)
		fmt.Fprintf(&b, `<text x="%.0f" y="%d">%s</text>`, marginLeft+plotW+32, legendY+4, html.EscapeString(l.name))
		legendY += 16
	}
	b.WriteString(`</svg>`)
	return b.String()
}
