package bench

import (
	"errors"
	"fmt"
	"io"
	"math"
	"text/tabwriter"
)

// formatMicros prints a latency in the unit that keeps it short.
func formatMicros(us float64) string {
	switch {
	case us < 1000:
		return fmt.Sprintf("%.1fµs", us)
	case us < 1e6:
		return fmt.Sprintf("%.2fms", us/1e3)
	}
	return fmt.Sprintf("%.2fs", us/1e6)
}

// perCycle is n per lock cycle; 0 without cycles.
func (r *Result) perCycle(n float64) float64 {
	if r.Cycles == 0 {
		return 0
	}
	return n / float64(r.Cycles)
}

// serverMicrosPerCycle is the server's CPU time per lock cycle.
func (r *Result) serverMicrosPerCycle() float64 { return r.perCycle(r.ServerCPUS * 1e6) }

// formatPerCycle prints a count per cycle, "–" when it is unknown (0).
func (r *Result) formatPerCycle(n uint64) string {
	if n == 0 || r.Cycles == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f", r.perCycle(float64(n)))
}

// requestsPer prints requests per syscall, "–" when the syscalls are
// unknown.
func (r *Result) requestsPer(syscalls uint64) string {
	if syscalls == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f", float64(r.Requests)/float64(syscalls))
}

// describe names a run's shape: workload, loop and load.
func (r *Result) describe() string {
	s := fmt.Sprintf("%s  %s loop  callers %d", r.Workload, r.Mode, r.Callers)
	if r.Mode == "open" {
		s += fmt.Sprintf("  rate %.0f/s", r.Rate)
	}
	if f := r.Failover; f != nil {
		s += fmt.Sprintf("  %s of the %s", faultName(f.Fault), f.Victim)
	}
	return s
}

// WriteTable prints each run: its totals, what the processes spent per
// cycle, and its per-outcome latencies.
func WriteTable(w io.Writer, results []*Result) {
	for _, r := range results {
		fmt.Fprintf(w, "\n%s (%s)  %s  %.1fs", r.Target, r.Kind, r.describe(), r.DurationS)
		if r.Sample > 0 {
			fmt.Fprintf(w, "  sample %d", r.Sample)
		}
		fmt.Fprintln(w)
		fmt.Fprintf(w, "  %d connections: %s\n", r.Conns, r.Transport)
		fmt.Fprintf(w, "  cycles %d  %.0f/s  requests %d  errors %d  drops %d\n", r.Cycles, r.CyclesPerS, r.Requests, r.Errors, r.Drops)
		if r.DurationS > 0 {
			fmt.Fprintf(w, "  CPU: lockbench %.1fs (%.2f cores, %s per cycle)", r.BenchCPUS, r.BenchCPUS/r.DurationS, formatMicros(r.perCycle(r.BenchCPUS*1e6)))
			if r.ServerCPUS > 0 {
				fmt.Fprintf(w, ", server %.1fs (%.2f cores, %s per cycle)", r.ServerCPUS, r.ServerCPUS/r.DurationS, formatMicros(r.serverMicrosPerCycle()))
			}
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "  per cycle: lockbench %s reads, %s writes, %s context switches (%s requests per read)",
			r.formatPerCycle(r.BenchSyscr), r.formatPerCycle(r.BenchSyscw), r.formatPerCycle(r.BenchCtxsw), r.requestsPer(r.BenchSyscr))
		if r.ServerCPUS > 0 {
			fmt.Fprintf(w, "; server %s reads, %s writes, %s context switches (%s requests per read)",
				r.formatPerCycle(r.ServerSyscr), r.formatPerCycle(r.ServerSyscw), r.formatPerCycle(r.ServerCtxsw), r.requestsPer(r.ServerSyscr))
		}
		fmt.Fprintln(w)
		for _, note := range r.Notes {
			fmt.Fprintf(w, "  note: %s\n", note)
		}
		if l := r.SchedulerLag; l != nil {
			fmt.Fprintf(w, "  arrivals sent late by p50 %s, p99 %s, max %s (included in the latencies)\n",
				formatMicros(l.P50), formatMicros(l.P99), formatMicros(l.Max))
		}
		if r.FirstError != "" {
			fmt.Fprintf(w, "  first error: %s\n", r.FirstError)
		}
		writeOutcomes(w, "  ", r.Outcomes)
		if r.Service != nil {
			fmt.Fprintf(w, "  the same from each request's actual send:\n")
			writeOutcomes(w, "  ", r.Service)
		}
		if a := r.Admission; a != nil {
			writeAdmission(w, a)
		}
		if r.Timeouts != nil {
			writeTimeouts(w, r)
		}
		if r.Keepalive != nil {
			writeKeepalive(w, r.Keepalive)
		}
		if r.Failover != nil {
			writeFailover(w, r.Failover)
		}
	}
}

func writeOutcomes(w io.Writer, indent string, outcomes map[string]Percentiles) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "%soutcome\tcount\tp50\tp90\tp99\tp99.9\tmax\t\n", indent)
	for o := range numOutcomes {
		p := outcomes[o.String()]
		if p.Count == 0 {
			continue
		}
		fmt.Fprintf(tw, "%s%s\t%d\t%s\t%s\t%s\t%s\t%s\t\n", indent, o, p.Count,
			formatMicros(p.P50), formatMicros(p.P90), formatMicros(p.P99), formatMicros(p.P999), formatMicros(p.Max))
	}
	tw.Flush()
}

func writeAdmission(w io.Writer, a *AdmissionResult) {
	fmt.Fprintf(w, "  admission: limit %d, pressure wait %.0fs, gate closes at %d%%, reopens below %d%%; probe latencies from the scheduled instant (and from the actual send)\n",
		a.Limit, a.WaitS, int(gateCloses*100), int(gateReopens*100))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "  phase\tload\tB rate\tprobe A\tA p50\tA p99\t(sent)\tprobe B\tB p99\t(sent)\t\n")
	for _, p := range a.Phases {
		pa, pb := p.Probe[Acquired.String()], p.Probe[Busy.String()]
		sa, sb := p.ProbeService[Acquired.String()], p.ProbeService[Busy.String()]
		fmt.Fprintf(tw, "  %.1f–%.1fs\t%.0f%%\t%.1f%%\t%d\t%s\t%s\t%s\t%d\t%s\t%s\t\n", p.StartS, p.EndS, 100*p.Load, 100*p.BRate,
			pa.Count, formatMicros(pa.P50), formatMicros(pa.P99), formatMicros(sa.P99), pb.Count, formatMicros(pb.P99), formatMicros(sb.P99))
	}
	tw.Flush()
	fmt.Fprintf(w, "  A p99 unloaded %s (sent %s), at the gate %s (sent %s);  B p99 %s (sent %s);  reopen: %s\n",
		formatMicros(a.Latency.UnloadedAcquiredP99), formatMicros(a.Service.UnloadedAcquiredP99),
		formatMicros(a.Latency.LoadedAcquiredP99), formatMicros(a.Service.LoadedAcquiredP99),
		formatMicros(a.Latency.BusyP99), formatMicros(a.Service.BusyP99), describeReopen(a.ReopenS))
}

func writeTimeouts(w io.Writer, r *Result) {
	t := r.Timeouts
	fmt.Fprintf(w, "  timeouts: %s\n", t.shape(r.Callers))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "  stream\tacquired\ttimed out (T)\town indeterminate (W)\tcollateral (I)\terrors\t\n")
	for _, row := range t.rows() {
		k := row.kinds
		fmt.Fprintf(tw, "  %s\t%d\t%d\t%d\t%d\t%d\t\n", row.name, k.Acquired, k.TimedOut, k.OwnIndeterminate, k.Collateral, k.Errors)
	}
	tw.Flush()
	fmt.Fprintf(w, "  probe A p99: baseline %s, with timeouts %s (%s); from the actual send %s, %s (%s)\n",
		formatMicros(t.Latency.BaselineP99), formatMicros(t.Latency.LoadedP99), formatRatio(t.Latency.Ratio),
		formatMicros(t.Service.BaselineP99), formatMicros(t.Service.LoadedP99), formatRatio(t.Service.Ratio))
	fmt.Fprintf(w, "  client reconnects: %s\n", t.reconnectSummary())
}

// shape says what the timeouts run did.
func (t *TimeoutsResult) shape(callers int) string {
	waiting := fmt.Sprintf("%d waiting callers queueing for %d hot key(s) with wait %s, hold %s",
		callers, t.HotKeys, formatMicros(t.WaitS*1e6), formatMicros(t.HoldS*1e6))
	if t.Rounds <= 1 {
		return fmt.Sprintf("probes alone until %.1fs, then also %s", t.LoadedStartS, waiting)
	}
	return fmt.Sprintf("%d rounds of %.1fs of probes alone, then %.1fs with also %s (%.1fs loaded in all, their last waits included)",
		t.Rounds, t.LoadedStartS, t.LoadedStartS, waiting, t.LoadedS)
}

// timeoutsRow is one stream of the timeouts table.
type timeoutsRow struct {
	name  string
	kinds OutcomeKinds
}

func (t *TimeoutsResult) rows() []timeoutsRow {
	return []timeoutsRow{
		{"probes, baseline", t.BaselineProbes},
		{"probes, with timeouts", t.LoadedProbes},
		{"waiting callers", t.Waiting},
	}
}

// reconnectSummary is the reconnects of each half, or why there are none.
func (t *TimeoutsResult) reconnectSummary() string {
	if t.LoadedReconnects == nil {
		return "n/a (this target's client does not reconnect by itself)"
	}
	return fmt.Sprintf("baseline %d, with timeouts %d (%s)", *t.BaselineReconnects, *t.LoadedReconnects, t.reconnectRate())
}

// reconnectRate is the loaded half's reconnects per second and per
// indeterminate outcome, or why there is none.
func (t *TimeoutsResult) reconnectRate() string {
	if t.LoadedReconnects == nil {
		return "n/a"
	}
	s := fmt.Sprintf("%.1f/s", t.ReconnectsPerS)
	if indeterminate := t.Waiting.OwnIndeterminate + t.Waiting.Collateral + t.LoadedProbes.Collateral; indeterminate > 0 {
		s += fmt.Sprintf(", %.2f per indeterminate outcome", float64(*t.LoadedReconnects)/float64(indeterminate))
	}
	return s
}

func formatRatio(x float64) string {
	if x == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f×", x)
}

func describeReopen(s float64) string {
	switch {
	case s > 0:
		return fmt.Sprintf("%.2fs after the drop below 75%%", s)
	case s < 0:
		return "not reopened within the phase"
	}
	return "already open at the drop"
}

// WriteComparison prints, for each workload shape that ran against more
// than one target, the targets side by side with ratios to the first.
func WriteComparison(w io.Writer, results []*Result) {
	for _, group := range groupByShape(results) {
		if len(group) < 2 {
			continue
		}
		first := group[0]
		fmt.Fprintf(w, "\n%s\n", first.describe())
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintf(tw, "target\tconns\tcycles/s\tfirst ÷ this\tA p50\tA p99\tA p99.9\tA p99 this ÷ first\terrors\t\n")
		for _, r := range group {
			a, fa := r.Outcomes[Acquired.String()], first.Outcomes[Acquired.String()]
			fmt.Fprintf(tw, "%s\t%d\t%.0f\t%s\t%s\t%s\t%s\t%s\t%d\t\n", r.Kind, r.Conns, r.CyclesPerS,
				ratio(first.CyclesPerS, r.CyclesPerS), formatMicros(a.P50), formatMicros(a.P99), formatMicros(a.P999),
				ratio(a.P99, fa.P99), r.Errors)
		}
		tw.Flush()
		fmt.Fprintf(w, "per cycle (requests: every acquire and release; – unknown):\n")
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintf(tw, "target\tserver CPU\treads\twrites\tctx switches\treq/read\tlockbench CPU\treads\twrites\tctx switches\treq/read\t\n")
		for _, r := range group {
			serverCPU := "–"
			if r.ServerCPUS > 0 {
				serverCPU = formatMicros(r.serverMicrosPerCycle())
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", r.Kind,
				serverCPU, r.formatPerCycle(r.ServerSyscr), r.formatPerCycle(r.ServerSyscw), r.formatPerCycle(r.ServerCtxsw), r.requestsPer(r.ServerSyscr),
				formatMicros(r.perCycle(r.BenchCPUS*1e6)), r.formatPerCycle(r.BenchSyscr), r.formatPerCycle(r.BenchSyscw), r.formatPerCycle(r.BenchCtxsw), r.requestsPer(r.BenchSyscr))
		}
		tw.Flush()
		writeTimeoutsComparison(w, group)
	}
}

// writeTimeoutsComparison puts the timeouts workload's outcome kinds of
// several targets side by side.
func writeTimeoutsComparison(w io.Writer, group []*Result) {
	if group[0].Timeouts == nil {
		return
	}
	fmt.Fprintf(w, "timeouts (waiting callers, and the probes with timeouts):\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "target\tA\tT\tW own\tI collateral\tprobe I\tprobe A p99 baseline\twith timeouts\tratio\treconnects\t\n")
	for _, r := range group {
		t := r.Timeouts
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t\n", r.Kind,
			t.Waiting.Acquired, t.Waiting.TimedOut, t.Waiting.OwnIndeterminate, t.Waiting.Collateral, t.LoadedProbes.Collateral,
			formatMicros(t.Latency.BaselineP99), formatMicros(t.Latency.LoadedP99), formatRatio(t.Latency.Ratio), t.reconnectRate())
	}
	tw.Flush()
}

func ratio(num, den float64) string {
	if den == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f×", num/den)
}

// groupByShape groups runs of the same workload and load, in run order.
func groupByShape(results []*Result) [][]*Result {
	var groups [][]*Result
	index := make(map[string]int)
	for _, r := range results {
		shape := r.describe()
		i, ok := index[shape]
		if !ok {
			i = len(groups)
			index[shape] = i
			groups = append(groups, nil)
		}
		groups[i] = append(groups[i], r)
	}
	return groups
}

// Check reports what is not sane in results: a run without cycles or with
// errors, percentiles out of order, an admission run whose gate never
// closed. It never judges speed.
func Check(results []*Result) error {
	var problems []error
	bad := func(r *Result, format string, args ...any) {
		problems = append(problems, fmt.Errorf("%s %s: %s", r.Kind, r.describe(), fmt.Sprintf(format, args...)))
	}
	if len(results) == 0 {
		return errors.New("no run completed")
	}
	for _, r := range results {
		if r.Cycles == 0 || !(r.CyclesPerS > 0) || math.IsInf(r.CyclesPerS, 0) {
			bad(r, "no lock cycles (cycles %d, %v/s)", r.Cycles, r.CyclesPerS)
		}
		if r.Errors > 0 {
			bad(r, "%d errors, the first: %s", r.Errors, r.FirstError)
		}
		w, i := r.Outcomes[WaitElapsed.String()].Count, r.Outcomes[Indeterminate.String()].Count
		if t := r.Timeouts; t != nil {
			if t.Waiting.TimedOut+t.Waiting.OwnIndeterminate == 0 {
				bad(r, "no wait ran out: the timeouts workload measured nothing (more --callers or a longer --hold)")
			}
		} else if w+i > 0 {
			bad(r, "%d indeterminate outcomes (%d of them the caller's own wait running out)", w+i, w)
		}
		for o := range numOutcomes {
			p := r.Outcomes[o.String()]
			if p.Count > 0 && !(p.P50 <= p.P90 && p.P90 <= p.P99 && p.P99 <= p.P999 && p.P999 <= p.Max) {
				bad(r, "%s percentiles out of order: %+v", o, p)
			}
		}
		if r.Admission != nil && r.Outcomes[Busy.String()].Count == 0 {
			bad(r, "the admission gate never closed (no B answer)")
		}
		if k := r.Keepalive; k != nil {
			if k.Renewals[Acquired.String()].Count == 0 {
				bad(r, "no renewal was confirmed: the keepalive workload measured nothing")
			}
			if k.Errors > 0 {
				bad(r, "%d renewals not confirmed, the first: %s", k.Errors, k.FirstError)
			}
		}
	}
	return errors.Join(problems...)
}
