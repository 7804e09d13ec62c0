package bench

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"html"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"
)

// Report is everything one lockbench command measured: the --json file,
// and the source of the --report page.
type Report struct {
	Version int       `json:"version"`
	Started time.Time `json:"started"`
	Command string    `json:"command"`
	Machine Machine   `json:"machine"`
	// CyclesPerS and Outcomes repeat the first run's, so that a CI step
	// reading one number needs no knowledge of the runs list.
	CyclesPerS float64                `json:"cycles_per_s"`
	Outcomes   map[string]Percentiles `json:"outcomes"`
	Runs       []*Result              `json:"runs"`
	// Gate is the baseline gate's verdict, when the runs were compared
	// with a baseline.
	Gate *Gate `json:"gate,omitempty"`
}

// Machine describes where the numbers were taken.
type Machine struct {
	NumCPU     int    `json:"num_cpu"`
	GOMAXPROCS int    `json:"gomaxprocs"`
	GoVersion  string `json:"go_version"`
	OS         string `json:"os"`
	Arch       string `json:"arch"`
	// LoadAvg is /proc/loadavg when the command started: other work on
	// the machine shares the cores with the run.
	LoadAvg string `json:"load_avg,omitempty"`
}

// reportVersion is the JSON layout's version; a baseline of another
// version is refused.
const reportVersion = 1

// NewReport gathers the results of one command.
func NewReport(command string, started time.Time, results []*Result) *Report {
	rep := &Report{
		Version: reportVersion,
		Started: started,
		Command: command,
		Machine: Machine{
			NumCPU:     runtime.NumCPU(),
			GOMAXPROCS: runtime.GOMAXPROCS(0),
			GoVersion:  runtime.Version(),
			OS:         runtime.GOOS,
			Arch:       runtime.GOARCH,
			LoadAvg:    loadAvg(),
		},
		Runs: results,
	}
	if len(results) > 0 {
		rep.CyclesPerS, rep.Outcomes = results[0].CyclesPerS, results[0].Outcomes
	}
	return rep
}

// loadAvg reads the load averages, or "" where /proc has none.
func loadAvg() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	fields := strings.Fields(string(data))
	return strings.Join(fields[:min(3, len(fields))], " ")
}

// WriteJSON writes the report to path.
func (rep *Report) WriteJSON(path string) error {
	data, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(data, '\n'), 0o644)
}

// ReportFile is the name of the page WriteHTML writes in its directory.
const ReportFile = "lockbench.html"

// WriteHTML writes a self-contained page with the report's tables and
// charts (latency against offered load, B rate across the admission
// gate's transitions) into dir, and returns its path.
func (rep *Report) WriteHTML(dir string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString(`<!doctype html><html><head><meta charset="utf-8"><title>lockbench report</title><style>
body{font-family:sans-serif;margin:2em;max-width:1000px}table{border-collapse:collapse;margin:.5em 0 1.5em}
td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}th{background:#f4f4f4}td:first-child,th:first-child{text-align:left}
code{background:#f4f4f4;padding:1px 4px}</style></head><body>`)
	b.WriteString("<h1>lockbench report</h1>")
	m := rep.Machine
	fmt.Fprintf(&b, "<p><code>%s</code><br>started %s on %d CPUs (GOMAXPROCS %d, load average %s), %s, %s/%s</p>",
		html.EscapeString(rep.Command), rep.Started.Format(time.RFC3339), m.NumCPU, m.GOMAXPROCS, m.LoadAvg, m.GoVersion, m.OS, m.Arch)

	var comparison bytes.Buffer
	WriteComparison(&comparison, rep.Runs)
	if comparison.Len() > 0 {
		fmt.Fprintf(&b, "<h2>Side by side</h2><pre>%s</pre>", html.EscapeString(comparison.String()))
	}
	if charts := loadCharts(rep.Runs); len(charts) > 0 {
		b.WriteString("<h2>Latency against offered load</h2><p>Offered load is the scheduled rate in open loop and the achieved rate in closed loop; solid lines are the A p99, dashed the A p50.</p>")
		for _, c := range charts {
			b.WriteString(c.svg())
		}
	}
	for _, r := range rep.Runs {
		if r.Admission != nil {
			fmt.Fprintf(&b, "<h2>Admission: %s</h2>", html.EscapeString(r.Target))
			b.WriteString(admissionChart(r).svg())
			writeAdmissionHTML(&b, r.Admission)
		}
		if r.Timeouts != nil {
			fmt.Fprintf(&b, "<h2>Timeouts: %s (%s)</h2>", html.EscapeString(r.Target), html.EscapeString(r.Kind))
			writeTimeoutsHTML(&b, r)
		}
		if r.Keepalive != nil {
			fmt.Fprintf(&b, "<h2>Keepalive: %s (%s)</h2>", html.EscapeString(r.Target), html.EscapeString(r.Kind))
			writeKeepaliveHTML(&b, r.Keepalive)
		}
	}
	b.WriteString("<h2>Runs</h2>")
	for _, r := range rep.Runs {
		fmt.Fprintf(&b, "<h3>%s (%s) — %s</h3><p>%.1f s, %d connections (%s), %d cycles, %.0f cycles/s, %d requests, %d errors, %d drops</p>",
			html.EscapeString(r.Target), html.EscapeString(r.Kind), html.EscapeString(r.describe()), r.DurationS,
			r.Conns, html.EscapeString(r.Transport), r.Cycles, r.CyclesPerS, r.Requests, r.Errors, r.Drops)
		writeUsageHTML(&b, r)
		writeOutcomesHTML(&b, r.Outcomes)
		if r.Service != nil {
			b.WriteString("<p>The same from each request's actual send:</p>")
			writeOutcomesHTML(&b, r.Service)
		}
	}
	b.WriteString("</body></html>\n")
	path := filepath.Join(dir, ReportFile)
	return path, os.WriteFile(path, []byte(b.String()), 0o644)
}

// writeUsageHTML is the run's CPU, syscalls and context switches per
// cycle, for lockbench and the server, and its notes.
func writeUsageHTML(b *strings.Builder, r *Result) {
	b.WriteString("<table><tr><th>per cycle</th><th>CPU</th><th>reads</th><th>writes</th><th>context switches</th><th>requests per read</th></tr>")
	fmt.Fprintf(b, "<tr><td>lockbench</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td></tr>",
		formatMicros(r.perCycle(r.BenchCPUS*1e6)), r.formatPerCycle(r.BenchSyscr), r.formatPerCycle(r.BenchSyscw), r.formatPerCycle(r.BenchCtxsw), r.requestsPer(r.BenchSyscr))
	if r.ServerCPUS > 0 {
		fmt.Fprintf(b, "<tr><td>server</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td></tr>",
			formatMicros(r.serverMicrosPerCycle()), r.formatPerCycle(r.ServerSyscr), r.formatPerCycle(r.ServerSyscw), r.formatPerCycle(r.ServerCtxsw), r.requestsPer(r.ServerSyscr))
	}
	b.WriteString("</table>")
	for _, note := range r.Notes {
		fmt.Fprintf(b, "<p>Note: %s</p>", html.EscapeString(note))
	}
}

func writeTimeoutsHTML(b *strings.Builder, r *Result) {
	t := r.Timeouts
	fmt.Fprintf(b, "<p>%s. Probe A p99: baseline %s, with timeouts %s (%s); from the actual send %s, %s (%s). Client reconnects: %s.</p>",
		html.EscapeString(t.shape(r.Callers)),
		formatMicros(t.Latency.BaselineP99), formatMicros(t.Latency.LoadedP99), formatRatio(t.Latency.Ratio),
		formatMicros(t.Service.BaselineP99), formatMicros(t.Service.LoadedP99), formatRatio(t.Service.Ratio), html.EscapeString(t.reconnectSummary()))
	b.WriteString("<table><tr><th>stream</th><th>acquired</th><th>timed out (T)</th><th>own indeterminate (W)</th><th>collateral (I)</th><th>errors</th></tr>")
	for _, row := range t.rows() {
		k := row.kinds
		fmt.Fprintf(b, "<tr><td>%s</td><td>%d</td><td>%d</td><td>%d</td><td>%d</td><td>%d</td></tr>",
			row.name, k.Acquired, k.TimedOut, k.OwnIndeterminate, k.Collateral, k.Errors)
	}
	b.WriteString("</table>")
}

func writeKeepaliveHTML(b *strings.Builder, k *KeepaliveResult) {
	fmt.Fprintf(b, "<p>%s. Probe A p99: baseline %s, with renewals %s (%s).</p>",
		html.EscapeString(k.shape()), formatMicros(k.Latency.BaselineP99), formatMicros(k.Latency.LoadedP99), formatRatio(k.Latency.Ratio))
	b.WriteString("<p>Renewals, from the instant each was due:</p>")
	writeOutcomesHTML(b, k.Renewals)
	if c := k.PerRenewal; c != nil {
		fmt.Fprintf(b, "<table><tr><th>per renewal</th><th>lockbench CPU</th><th>server CPU</th><th>server syscalls</th><th>server ctxsw</th></tr><tr><td></td><td>%s</td><td>%s</td><td>%s</td><td>%s</td></tr></table>",
			formatMicros(c.BenchCPUUS), optMicros(c.ServerCPUUS), optCount(c.ServerSyscall), optCount(c.ServerCtxsw))
	}
}

func writeOutcomesHTML(b *strings.Builder, outcomes map[string]Percentiles) {
	b.WriteString("<table><tr><th>outcome</th><th>count</th><th>p50</th><th>p90</th><th>p99</th><th>p99.9</th><th>max</th></tr>")
	for o := range numOutcomes {
		p := outcomes[o.String()]
		if p.Count == 0 {
			continue
		}
		fmt.Fprintf(b, "<tr><td>%s</td><td>%d</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td></tr>", o, p.Count,
			formatMicros(p.P50), formatMicros(p.P90), formatMicros(p.P99), formatMicros(p.P999), formatMicros(p.Max))
	}
	b.WriteString("</table>")
}

func writeAdmissionHTML(b *strings.Builder, a *AdmissionResult) {
	fmt.Fprintf(b, "<p>In-flight limit %d; pressure acquires wait %.0f s behind a held key. Probe latencies count from the scheduled instant; “sent” from the actual send. A p99 unloaded %s (sent %s), at the gate %s (sent %s); B p99 %s (sent %s); reopen: %s.</p>",
		a.Limit, a.WaitS, formatMicros(a.Latency.UnloadedAcquiredP99), formatMicros(a.Service.UnloadedAcquiredP99),
		formatMicros(a.Latency.LoadedAcquiredP99), formatMicros(a.Service.LoadedAcquiredP99),
		formatMicros(a.Latency.BusyP99), formatMicros(a.Service.BusyP99), describeReopen(a.ReopenS))
	b.WriteString("<table><tr><th>phase</th><th>load</th><th>B rate</th><th>probe A</th><th>A p50</th><th>A p99</th><th>A p99 sent</th><th>probe B</th><th>B p99</th><th>B p99 sent</th></tr>")
	for _, p := range a.Phases {
		pa, pb := p.Probe[Acquired.String()], p.Probe[Busy.String()]
		sa, sb := p.ProbeService[Acquired.String()], p.ProbeService[Busy.String()]
		fmt.Fprintf(b, "<tr><td>%.1f–%.1f s</td><td>%.0f %%</td><td>%.1f %%</td><td>%d</td><td>%s</td><td>%s</td><td>%s</td><td>%d</td><td>%s</td><td>%s</td></tr>",
			p.StartS, p.EndS, 100*p.Load, 100*p.BRate, pa.Count, formatMicros(pa.P50), formatMicros(pa.P99), formatMicros(sa.P99),
			pb.Count, formatMicros(pb.P99), formatMicros(sb.P99))
	}
	b.WriteString("</table>")
}

// loadCharts draws, per workload and loop, each target's A latency against
// the offered load, one point per run.
func loadCharts(results []*Result) []chart {
	type group struct {
		key   string
		lines map[string]*[2]line // by kind: p99, p50
		kinds []string
	}
	var groups []*group
	byKey := make(map[string]*group)
	for _, r := range results {
		if r.Admission != nil || r.Timeouts != nil || r.Keepalive != nil {
			continue // their own sections: two streams in one run
		}
		key := r.Workload + ", " + r.Mode + " loop"
		g := byKey[key]
		if g == nil {
			g = &group{key: key, lines: make(map[string]*[2]line)}
			byKey[key] = g
			groups = append(groups, g)
		}
		ls := g.lines[r.Kind]
		if ls == nil {
			color := palette[len(g.kinds)%len(palette)]
			ls = &[2]line{{name: r.Kind + " p99", color: color}, {name: r.Kind + " p50", color: color, dashed: true}}
			g.lines[r.Kind] = ls
			g.kinds = append(g.kinds, r.Kind)
		}
		x := r.CyclesPerS
		if r.Mode == "open" {
			x = r.Rate
		}
		a := r.Outcomes[Acquired.String()]
		ls[0].points = append(ls[0].points, point{x, a.P99})
		ls[1].points = append(ls[1].points, point{x, a.P50})
	}
	var charts []chart
	for _, g := range groups {
		c := chart{title: g.key, xLabel: "offered load (lock cycles/s)", yLabel: "acquire latency", logY: true, yTick: formatMicrosTick}
		for _, kind := range g.kinds {
			for _, l := range g.lines[kind] {
				slices.SortFunc(l.points, func(a, b point) int { return cmp.Compare(a.x, b.x) })
				c.lines = append(c.lines, l)
			}
		}
		charts = append(charts, c)
	}
	return charts
}

// admissionChart draws the B rate over time against the offered pressure,
// with the gate's thresholds.
func admissionChart(r *Result) chart {
	a := r.Admission
	brate := line{name: "B rate"}
	for _, p := range r.Timeline {
		brate.points = append(brate.points, point{p.T, p.BRate})
	}
	load := line{name: "offered load", step: true, dashed: true}
	for _, p := range a.Phases {
		load.points = append(load.points, point{p.StartS, p.Load})
	}
	if n := len(a.Phases); n > 0 {
		load.points = append(load.points, point{a.Phases[n-1].EndS, a.Phases[n-1].Load})
	}
	return chart{
		title:  "B rate across the gate's transitions",
		xLabel: "time (s)",
		yLabel: "fraction (B of acquires; load of the limit)",
		lines:  []line{brate, load},
		rules:  []rule{{gateCloses, "gate closes (90 %)"}, {gateReopens, "reopens below 75 %"}},
	}
}
