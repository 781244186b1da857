package main

import (
	"fmt"
	"math"
	"sort"
	"strings"
)

func sortFloats(v []float64) { sort.Float64s(v) }

// quantile of sorted values, nearest rank.
func quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[int(math.Ceil(q*float64(len(sorted))))-1+boolInt(q == 0)]
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// lagSVG plots p50, p99 and max lag per second of placement, on a
// logarithmic axis: a healthy run sits in milliseconds, an overloaded one
// climbs to seconds, and both must be readable.
func lagSVG(series []LagPoint, title string) string {
	const (
		w, h                     = 900, 420
		left, right, top, bottom = 70, 20, 40, 50
	)
	pw, ph := float64(w-left-right), float64(h-top-bottom)
	maxSec := float64(series[len(series)-1].Second + 1)
	lo, hi := math.Inf(1), 0.0
	for _, p := range series {
		lo = math.Min(lo, math.Max(p.P50Ms, 0.1))
		hi = math.Max(hi, p.MaxMs)
	}
	lo = math.Pow(10, math.Floor(math.Log10(lo)))
	hi = math.Pow(10, math.Ceil(math.Log10(math.Max(hi, lo*10))))
	x := func(s float64) float64 { return float64(left) + s/maxSec*pw }
	y := func(ms float64) float64 {
		ms = math.Max(ms, lo)
		return float64(top) + ph - (math.Log10(ms)-math.Log10(lo))/(math.Log10(hi)-math.Log10(lo))*ph
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", w, h, w, h)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", w, h)
	fmt.Fprintf(&b, `<text x="%d" y="22" font-size="14">%s</text>`+"\n", left, escape(title))
	for d := lo; d <= hi*1.0001; d *= 10 {
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#ddd"/><text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n",
			left, w-right, y(d), y(d), left-6, y(d)+4, msLabel(d))
	}
	if ms100 := 100.0; ms100 > lo && ms100 < hi {
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#c00" stroke-dasharray="4 4"/><text x="%d" y="%.1f" fill="#c00" text-anchor="end">p99 goal 100 ms</text>`+"\n",
			left, w-right, y(ms100), y(ms100), w-right-4, y(ms100)-4)
	}
	step := niceStep(maxSec)
	for s := 0.0; s <= maxSec; s += step {
		fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="#999"/><text x="%.1f" y="%d" text-anchor="middle">%.0f</text>`+"\n",
			x(s), x(s), h-bottom, h-bottom+5, x(s), h-bottom+18, s)
	}
	fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">seconds since the first order (by placement time)</text>`+"\n", float64(left)+pw/2, h-12)
	fmt.Fprintf(&b, `<text transform="translate(16 %.1f) rotate(-90)" text-anchor="middle">lag (log scale)</text>`+"\n", float64(top)+ph/2)
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.0f" height="%.0f" fill="none" stroke="#333"/>`+"\n", left, top, pw, ph)
	for _, line := range []struct {
		name, color string
		v           func(LagPoint) float64
	}{
		{"max", "#bbb", func(p LagPoint) float64 { return p.MaxMs }},
		{"p99", "#d62728", func(p LagPoint) float64 { return p.P99Ms }},
		{"p50", "#1f77b4", func(p LagPoint) float64 { return p.P50Ms }},
	} {
		var pts []string
		for _, p := range series {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(float64(p.Second)+0.5), y(line.v(p))))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>`+"\n", line.color, strings.Join(pts, " "))
	}
	for i, l := range []struct{ name, color string }{{"p50", "#1f77b4"}, {"p99", "#d62728"}, {"max", "#bbb"}} {
		lx := left + 10 + i*70
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="%s" stroke-width="3"/><text x="%d" y="%d">%s</text>`+"\n",
			lx, lx+20, top+14, top+14, l.color, lx+25, top+18, l.name)
	}
	b.WriteString("</svg>\n")
	return b.String()
}

func msLabel(ms float64) string {
	if ms >= 1000 {
		return fmt.Sprintf("%g s", ms/1000)
	}
	return fmt.Sprintf("%g ms", ms)
}

func niceStep(span float64) float64 {
	for _, s := range []float64{1, 2, 5, 10, 15, 30, 60, 120, 300, 600} {
		if span/s <= 12 {
			return s
		}
	}
	return 1200
}

func escape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}
