package sim

import (
	"encoding/csv"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
)

// WriteTable writes one scenario's results as an aligned text table (also
// valid Markdown).
func WriteTable(w io.Writer, sc Scenario, results []*Result) error {
	cols := []string{"policy", "requests", "errors", "p50 ms", "p95 ms", "p99 ms", "watched share",
		"imbalance", "imb p95", "max/min p95", "cache hits", "retries/req", "attempts/req in incident", "oscillation", "ejections"}
	rows := [][]string{cols}
	for _, r := range results {
		rows = append(rows, []string{
			r.Policy, strconv.Itoa(r.Requests), pct(r.ErrorRate), num(r.TTFTP50), num(r.TTFTP95), num(r.TTFTP99),
			pct(r.WatchShare), fix(r.Imbalance), fix(r.ImbalanceP95), fix(r.MaxMinP95), pct(r.CacheHitRate),
			fmt.Sprintf("%.3f", r.RetriesPerRequest), loadOf(r), fmt.Sprintf("%.3f", r.Oscillation), strconv.Itoa(r.Ejections),
		})
	}
	var b strings.Builder
	fmt.Fprintf(&b, "### %s\n\n%s (%s simulated, %d routers, %d backends)\n\n", sc.Name, sc.Description, sc.Duration, max(sc.Routers, 1), len(sc.Backends))
	writeAligned(&b, rows)
	b.WriteString("\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func loadOf(r *Result) string {
	if r.WindowAttemptsPerRequest == 0 || r.Retries == 0 {
		return "-"
	}
	return fmt.Sprintf("x%.2f", r.WindowAttemptsPerRequest)
}

func pct(v float64) string {
	if math.IsNaN(v) {
		return "-"
	}
	return fmt.Sprintf("%.2f%%", 100*v)
}

func num(v float64) string {
	if math.IsNaN(v) {
		return "-"
	}
	return strconv.FormatFloat(math.Round(v), 'f', 0, 64)
}

func fix(v float64) string {
	if math.IsNaN(v) {
		return "-"
	}
	return fmt.Sprintf("%.2f", v)
}

// CSVHeader is the header of WriteCSV's rows.
var CSVHeader = []string{"scenario", "policy", "seed", "requests", "failed", "attempts", "retries", "shed",
	"retries_refused", "error_rate", "ttft_p50_ms", "ttft_p95_ms", "ttft_p99_ms", "watch_share", "imbalance",
	"imbalance_p95", "max_min_p95", "cache_hit_rate", "retries_per_request", "attempts_per_request",
	"incident_attempts_per_request", "budget_limit", "oscillation", "ejections", "events", "opens", "watch_open_ms"}

// WriteCSV writes results as CSV with CSVHeader (header included when
// header is true).
func WriteCSV(w io.Writer, results []*Result, header bool) error {
	cw := csv.NewWriter(w)
	if header {
		if err := cw.Write(CSVHeader); err != nil {
			return err
		}
	}
	f := func(v float64) string { return strconv.FormatFloat(v, 'g', 6, 64) }
	for _, r := range results {
		rec := []string{r.Scenario, r.Policy, strconv.FormatUint(r.Seed, 10), strconv.Itoa(r.Requests),
			strconv.Itoa(r.Failed), strconv.Itoa(r.Attempts), strconv.Itoa(r.Retries), strconv.Itoa(r.Shed),
			strconv.Itoa(r.Refused), f(r.ErrorRate), f(r.TTFTP50), f(r.TTFTP95), f(r.TTFTP99), f(r.WatchShare),
			f(r.Imbalance), f(r.ImbalanceP95), f(r.MaxMinP95), f(r.CacheHitRate), f(r.RetriesPerRequest),
			f(r.AttemptsPerRequest), f(r.WindowAttemptsPerRequest), f(r.BudgetLimit), f(r.Oscillation),
			strconv.Itoa(r.Ejections), strconv.FormatInt(r.Events, 10), strconv.Itoa(r.Opens), f(r.WatchOpenMs)}
		if err := cw.Write(rec); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}

// WriteSharesCSV writes every policy's per-second share of attempts per
// backend: second, policy, then one column per backend.
func WriteSharesCSV(w io.Writer, results []*Result) error {
	if len(results) == 0 {
		return nil
	}
	cw := csv.NewWriter(w)
	if err := cw.Write(append([]string{"second", "policy"}, results[0].Backends...)); err != nil {
		return err
	}
	for _, r := range results {
		for t, shares := range r.Shares {
			rec := []string{strconv.Itoa(t), r.Policy}
			for _, s := range shares {
				rec = append(rec, strconv.FormatFloat(s, 'f', 4, 64))
			}
			if err := cw.Write(rec); err != nil {
				return err
			}
		}
	}
	cw.Flush()
	return cw.Error()
}

// palette colours backends in the charts.
var palette = []string{"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"}

// WriteShareSVG draws each policy's per-backend share of attempts over time
// (5-second means), one small panel per policy: a steady pool draws flat
// lines near 1/n; a herd draws saw teeth; a broken host that keeps its
// share is a flat line that should have dropped.
func WriteShareSVG(w io.Writer, sc Scenario, results []*Result) error {
	const (
		panelW, panelH = 300, 120
		cols           = 3
		padL, padT     = 40, 30
		gapX, gapY     = 30, 40
	)
	rows := (len(results) + cols - 1) / cols
	width := padL + cols*(panelW+gapX)
	height := padT + rows*(panelH+gapY) + 30
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="11">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%d" y="18" font-size="14">%s: share of attempts per backend over time (5 s means)</text>`+"\n", padL, esc(sc.Name))
	for i, r := range results {
		x0 := padL + (i%cols)*(panelW+gapX)
		y0 := padT + (i/cols)*(panelH+gapY) + 14
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s</text>`+"\n", x0, y0-4, esc(r.Policy))
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#999"/>`+"\n", x0, y0, panelW, panelH)
		for _, g := range []float64{0.25, 0.5, 0.75} {
			y := float64(y0) + float64(panelH)*(1-g)
			fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#eee"/>`+"\n", x0, y, x0+panelW, y)
		}
		if i%cols == 0 {
			fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end">1</text><text x="%d" y="%d" text-anchor="end">0</text>`+"\n", x0-4, y0+8, x0-4, y0+panelH)
		}
		secs := len(r.Shares)
		const window = 5
		for bk := range r.Backends {
			var pts []string
			for t := 0; t+window <= secs; t += window {
				sum := 0.0
				for k := t; k < t+window; k++ {
					if bk < len(r.Shares[k]) {
						sum += r.Shares[k][bk]
					}
				}
				x := float64(x0) + float64(panelW)*float64(t+window/2)/float64(max(secs, 1))
				y := float64(y0) + float64(panelH)*(1-sum/window)
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", x, y))
			}
			fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1.3" points="%s"/>`+"\n", palette[bk%len(palette)], strings.Join(pts, " "))
		}
	}
	// Legend.
	ly := height - 12
	for bk, id := range results[0].Backends {
		x := padL + bk*90
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="12" height="4" fill="%s"/><text x="%d" y="%d">%s</text>`+"\n", x, ly-4, palette[bk%len(palette)], x+16, ly, esc(id))
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end">%s simulated</text>`+"\n", width-10, ly, sc.Duration)
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteTTFTSVG draws p50, p95 and p99 TTFT per policy as grouped bars on a
// log scale.
func WriteTTFTSVG(w io.Writer, sc Scenario, results []*Result) error {
	const (
		padL, padT, padB = 60, 40, 90
		group, bar       = 60, 14
		plotH            = 260
	)
	width := padL + len(results)*group + 140
	height := padT + plotH + padB
	lo, hi := 10.0, 10.0
	for _, r := range results {
		for _, v := range []float64{r.TTFTP50, r.TTFTP95, r.TTFTP99} {
			if !math.IsNaN(v) {
				hi = math.Max(hi, v)
			}
		}
	}
	top := math.Pow(10, math.Ceil(math.Log10(hi)))
	y := func(v float64) float64 {
		v = math.Max(v, lo)
		return float64(padT) + float64(plotH)*(1-math.Log10(v/lo)/math.Log10(top/lo))
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="11">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%d" y="20" font-size="14">%s: client TTFT of successful requests (ms, log scale)</text>`+"\n", padL, esc(sc.Name))
	for v := lo; v <= top; v *= 10 {
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/><text x="%d" y="%.1f" text-anchor="end">%g</text>`+"\n",
			padL, y(v), padL+len(results)*group, y(v), padL-6, y(v)+4, v)
	}
	colors := []string{"#9ecae1", "#4292c6", "#08306b"}
	for i, r := range results {
		x0 := padL + i*group + 6
		for k, v := range []float64{r.TTFTP50, r.TTFTP95, r.TTFTP99} {
			if math.IsNaN(v) {
				continue
			}
			x := x0 + k*bar
			fmt.Fprintf(&b, `<rect x="%d" y="%.1f" width="%d" height="%.1f" fill="%s"><title>%s p%s %.0f ms</title></rect>`+"\n",
				x, y(v), bar-2, float64(padT+plotH)-y(v), colors[k], esc(r.Policy), []string{"50", "95", "99"}[k], v)
		}
		fmt.Fprintf(&b, `<text transform="translate(%d,%d) rotate(40)">%s</text>`+"\n", x0, padT+plotH+14, esc(r.Policy))
	}
	lx := padL + len(results)*group + 20
	for k, name := range []string{"p50", "p95", "p99"} {
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="12" height="12" fill="%s"/><text x="%d" y="%d">%s</text>`+"\n", lx, padT+k*18, colors[k], lx+18, padT+k*18+10, name)
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func esc(s string) string {
	r := strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;")
	return r.Replace(s)
}

// Median returns a Result whose every metric is the median over rs (runs of
// one scenario and policy with different seeds); counts are medians too.
// Shares are rs[0]'s. Seed is rs[0]'s.
func Median(rs []*Result) *Result {
	if len(rs) == 1 {
		return rs[0]
	}
	out := *rs[0]
	med := func(get func(*Result) float64) float64 {
		v := make([]float64, 0, len(rs))
		for _, r := range rs {
			if x := get(r); !math.IsNaN(x) {
				v = append(v, x)
			}
		}
		if len(v) == 0 {
			return math.NaN()
		}
		for i := range v {
			for j := i + 1; j < len(v); j++ {
				if v[j] < v[i] {
					v[i], v[j] = v[j], v[i]
				}
			}
		}
		if len(v)%2 == 1 {
			return v[len(v)/2]
		}
		return (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	medInt := func(get func(*Result) int) int {
		return int(math.Round(med(func(r *Result) float64 { return float64(get(r)) })))
	}
	out.Requests = medInt(func(r *Result) int { return r.Requests })
	out.Failed = medInt(func(r *Result) int { return r.Failed })
	out.Attempts = medInt(func(r *Result) int { return r.Attempts })
	out.Retries = medInt(func(r *Result) int { return r.Retries })
	out.Shed = medInt(func(r *Result) int { return r.Shed })
	out.Refused = medInt(func(r *Result) int { return r.Refused })
	out.Ejections = medInt(func(r *Result) int { return r.Ejections })
	out.Opens = medInt(func(r *Result) int { return r.Opens })
	out.WatchOpenMs = med(func(r *Result) float64 { return r.WatchOpenMs })
	out.ErrorRate = med(func(r *Result) float64 { return r.ErrorRate })
	out.TTFTP50 = med(func(r *Result) float64 { return r.TTFTP50 })
	out.TTFTP95 = med(func(r *Result) float64 { return r.TTFTP95 })
	out.TTFTP99 = med(func(r *Result) float64 { return r.TTFTP99 })
	out.WatchShare = med(func(r *Result) float64 { return r.WatchShare })
	out.Imbalance = med(func(r *Result) float64 { return r.Imbalance })
	out.ImbalanceP95 = med(func(r *Result) float64 { return r.ImbalanceP95 })
	out.MaxMinP95 = med(func(r *Result) float64 { return r.MaxMinP95 })
	out.CacheHitRate = med(func(r *Result) float64 { return r.CacheHitRate })
	out.RetriesPerRequest = med(func(r *Result) float64 { return r.RetriesPerRequest })
	out.AttemptsPerRequest = med(func(r *Result) float64 { return r.AttemptsPerRequest })
	out.WindowAttemptsPerRequest = med(func(r *Result) float64 { return r.WindowAttemptsPerRequest })
	out.BudgetLimit = med(func(r *Result) float64 { return r.BudgetLimit })
	out.Oscillation = med(func(r *Result) float64 { return r.Oscillation })
	return &out
}

// WriteDetection writes, for one scenario, every policy's breaker openings
// (all backends; false trips in a steady state) and time from the watch
// window's start to the watched backend's first opening, per seed and as
// the median: runs[policy][seed].
func WriteDetection(w io.Writer, sc Scenario, runs [][]*Result) error {
	var b strings.Builder
	fmt.Fprintf(&b, "### %s: detection (%d routers)\n\n", sc.Name, max(sc.Routers, 1))
	b.WriteString("| policy | opens per seed | median opens | time to open the watched backend, s, per seed | median s | its share once open, median / max | half-open: its share then (attempts, periods; all seeds) |\n")
	b.WriteString("| --- | --- | ---: | --- | ---: | --- | --- |\n")
	for _, rs := range runs {
		if len(rs) == 0 {
			continue
		}
		var opens, times []string
		var hits, attempts, periods int
		for _, r := range rs {
			opens = append(opens, strconv.Itoa(r.Opens))
			times = append(times, secs(r.WatchOpenMs))
			hits, attempts, periods = hits+r.HalfOpenHits, attempts+r.HalfOpenAttempts, periods+r.HalfOpens
		}
		half := "-"
		if attempts > 0 {
			half = fmt.Sprintf("%.1f%% (%d of %d, %d periods)", 100*float64(hits)/float64(attempts), hits, attempts, periods)
		}
		m := Median(rs)
		fmt.Fprintf(&b, "| %s | %s | %d | %s | %s | %s | %s |\n", rs[0].Policy, strings.Join(opens, " "), m.Opens,
			strings.Join(times, " "), secs(m.WatchOpenMs),
			medMax(rs, func(r *Result) float64 { return r.DetectedShare }), half)
	}
	b.WriteString("\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// medMax is the median and the largest of get over the runs that have it,
// as percentages; "-" when none has.
func medMax(rs []*Result, get func(*Result) float64) string {
	var v []float64
	for _, r := range rs {
		if x := get(r); !math.IsNaN(x) {
			v = append(v, x)
		}
	}
	if len(v) == 0 {
		return "-"
	}
	slices.Sort(v)
	return fmt.Sprintf("%.3f%% / %.3f%%", 100*quantile(v, 0.5), 100*v[len(v)-1])
}

func secs(msv float64) string {
	if math.IsNaN(msv) {
		return "-"
	}
	return fmt.Sprintf("%.1f", msv/1000)
}
