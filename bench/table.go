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

// serverMicrosPerCycle is the server's CPU time per lock cycle.
func (r *Result) serverMicrosPerCycle() float64 {
	if r.Cycles == 0 {
		return 0
	}
	return r.ServerCPUS * 1e6 / float64(r.Cycles)
}

// describe names a run's shape: workload, loop and load.
func (r *Result) describe() string {
	s := fmt.Sprintf("%s  %s loop  callers %d  conns %d", r.Workload, r.Mode, r.Callers, r.Conns)
	if r.Mode == "open" {
		s += fmt.Sprintf("  rate %.0f/s", r.Rate)
	}
	return s
}

// WriteTable prints each run: its totals and its per-outcome latencies.
func WriteTable(w io.Writer, results []*Result) {
	for _, r := range results {
		fmt.Fprintf(w, "\n%s (%s)  %s  %.1fs\n", r.Target, r.Kind, r.describe(), r.DurationS)
		fmt.Fprintf(w, "  cycles %d  %.0f/s  errors %d  drops %d\n", r.Cycles, r.CyclesPerS, r.Errors, r.Drops)
		if r.DurationS > 0 {
			fmt.Fprintf(w, "  CPU: lockbench %.1fs (%.2f cores)", r.BenchCPUS, r.BenchCPUS/r.DurationS)
			if r.ServerCPUS > 0 {
				fmt.Fprintf(w, ", server %.1fs (%.2f cores, %s per cycle)", r.ServerCPUS, r.ServerCPUS/r.DurationS, formatMicros(r.serverMicrosPerCycle()))
			}
			fmt.Fprintln(w)
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
		fmt.Fprintf(tw, "target\tcycles/s\tfirst ÷ this\tA p50\tA p99\tA p99.9\tA p99 this ÷ first\tserver CPU/cycle\terrors\t\n")
		for _, r := range group {
			a, fa := r.Outcomes[Acquired.String()], first.Outcomes[Acquired.String()]
			serverCPU := "–"
			if r.ServerCPUS > 0 {
				serverCPU = formatMicros(r.serverMicrosPerCycle())
			}
			fmt.Fprintf(tw, "%s\t%.0f\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t\n", r.Kind, r.CyclesPerS,
				ratio(first.CyclesPerS, r.CyclesPerS), formatMicros(a.P50), formatMicros(a.P99), formatMicros(a.P999),
				ratio(a.P99, fa.P99), serverCPU, r.Errors)
		}
		tw.Flush()
	}
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
		for o := range numOutcomes {
			p := r.Outcomes[o.String()]
			if p.Count > 0 && !(p.P50 <= p.P90 && p.P90 <= p.P99 && p.P99 <= p.P999 && p.P999 <= p.Max) {
				bad(r, "%s percentiles out of order: %+v", o, p)
			}
		}
		if r.Admission != nil && r.Outcomes[Busy.String()].Count == 0 {
			bad(r, "the admission gate never closed (no B answer)")
		}
	}
	return errors.Join(problems...)
}
