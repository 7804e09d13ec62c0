package bench

import (
	"time"
)

// Result is what one run measured. Latencies are in microseconds.
type Result struct {
	// Target is the address as given ("lockd://127.0.0.1:7420"); Kind the
	// implementation driven ("lockd", "lockd-raw", "redis", "etcd").
	Target     string  `json:"target"`
	Kind       string  `json:"kind"`
	Workload   string  `json:"workload"`
	Mode       string  `json:"mode"` // "closed" or "open"
	Callers    int     `json:"callers"`
	Conns      int     `json:"conns"`
	Rate       float64 `json:"rate,omitempty"`
	Keys       int     `json:"keys"`
	DurationS  float64 `json:"duration_s"`
	Cycles     uint64  `json:"cycles"`
	CyclesPerS float64 `json:"cycles_per_s"`
	Errors     uint64  `json:"errors"`
	FirstError string  `json:"first_error,omitempty"`
	Drops      uint64  `json:"drops"`
	// BenchCPUS is the CPU time lockbench itself used during the run (an
	// in-process server's included); ServerCPUS that of the target's
	// server processes, summed, when their pids were given.
	BenchCPUS  float64 `json:"bench_cpu_s"`
	ServerCPUS float64 `json:"server_cpu_s,omitempty"`
	// SchedulerLag is how late open-loop arrivals were sent; the
	// latencies include it, since they count from the scheduled instant.
	SchedulerLag *Percentiles `json:"scheduler_lag,omitempty"`
	// Service, in open loop only, has the outcomes' latencies from the
	// instant each request was actually sent: Outcomes less the time it
	// waited for the generator and for a free caller.
	Service map[string]Percentiles `json:"service,omitempty"`
	// Outcomes has an entry for every outcome letter, seen or not.
	Outcomes  map[string]Percentiles `json:"outcomes"`
	Timeline  []TimelinePoint        `json:"timeline"`
	Admission *AdmissionResult       `json:"admission,omitempty"`
}

// Percentiles summarise the latencies of one outcome.
type Percentiles struct {
	Count uint64  `json:"count"`
	P50   float64 `json:"p50_us"`
	P90   float64 `json:"p90_us"`
	P99   float64 `json:"p99_us"`
	P999  float64 `json:"p999_us"`
	Max   float64 `json:"max_us"`
}

// TimelinePoint counts the answers that came in one step of the run.
type TimelinePoint struct {
	T      float64           `json:"t_s"` // start of the step, from the run's start
	Counts map[string]uint64 `json:"counts"`
	// BRate is the share of acquire answers that were B.
	BRate float64 `json:"b_rate"`
}

// AdmissionResult is what the admission workload adds.
type AdmissionResult struct {
	Limit  int           `json:"limit"`
	WaitS  float64       `json:"pressure_wait_s"`
	Phases []PhaseResult `json:"phases"`
	// Latency counts from each request's scheduled instant, as the
	// outcome tables do; Service from the instant it was actually sent,
	// which leaves out the time it waited in the load generator.
	Latency GateLatencies `json:"latency"`
	Service GateLatencies `json:"service"`
	// ReopenS is the time from the drop below 75 % to the first A after
	// the last B; 0 when the gate was already open at the drop, -1 when it
	// had not reopened by the end of the phase or no such drop exists.
	ReopenS float64 `json:"reopen_s"`
}

// GateLatencies are the admission workload's headline latencies.
type GateLatencies struct {
	// UnloadedAcquiredP99 is the probes' A p99 in the least loaded phase;
	// LoadedAcquiredP99 their A p99 over the phases at or past 90 %.
	UnloadedAcquiredP99 float64 `json:"unloaded_a_p99_us"`
	LoadedAcquiredP99   float64 `json:"loaded_a_p99_us"`
	// BusyP99 is the p99 of every B answer, probe or pressure.
	BusyP99 float64 `json:"b_p99_us"`
}

// PhaseResult is one phase of the admission workload.
type PhaseResult struct {
	Load   float64                `json:"load"`
	StartS float64                `json:"start_s"`
	EndS   float64                `json:"end_s"`
	BRate  float64                `json:"b_rate"`
	Probe  map[string]Percentiles `json:"probe"`
	// ProbeService is Probe with latencies from the actual send.
	ProbeService map[string]Percentiles `json:"probe_service"`
	Pressure     map[string]Percentiles `json:"pressure"`
}

// Admission thresholds of SPEC §8.
const (
	gateCloses  = 0.90
	gateReopens = 0.75
)

// reportStep is the timeline's resolution in results and charts.
const reportStep = 100 * time.Millisecond

func micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

func percentiles(h *Histogram) Percentiles {
	return Percentiles{
		Count: h.Count(),
		P50:   micros(h.Quantile(0.50)),
		P90:   micros(h.Quantile(0.90)),
		P99:   micros(h.Quantile(0.99)),
		P999:  micros(h.Quantile(0.999)),
		Max:   micros(h.Max()),
	}
}

func outcomeTable(hists [numOutcomes]*Histogram) map[string]Percentiles {
	m := make(map[string]Percentiles, numOutcomes)
	for o, h := range hists {
		m[Outcome(o).String()] = percentiles(h)
	}
	return m
}

// bRate is the share of B among the acquire answers counted in c.
func bRate(c [numOutcomes]uint64) float64 {
	acquires := c[Acquired] + c[TimedOut] + c[Busy]
	if acquires == 0 {
		return 0
	}
	return float64(c[Busy]) / float64(acquires)
}

func (r *run) result(elapsed time.Duration) *Result {
	cfg := r.cfg
	all := r.rec.merged(sinceScheduled, r.rec.allSeries()...)
	res := &Result{
		Workload:   cfg.Workload,
		Mode:       "closed",
		Callers:    cfg.Callers,
		Rate:       cfg.Rate,
		Keys:       cfg.Keys,
		DurationS:  elapsed.Seconds(),
		Cycles:     r.rec.cycles.Load(),
		CyclesPerS: float64(r.rec.cycles.Load()) / elapsed.Seconds(),
		Errors:     all[Failed].Count(),
		Drops:      r.rec.drops.Load(),
		Outcomes:   outcomeTable(all),
	}
	if cfg.Rate > 0 {
		res.Mode = "open"
		lag := percentiles(&r.lag)
		res.SchedulerLag = &lag
		res.Service = outcomeTable(r.rec.merged(sinceSent, r.rec.allSeries()...))
	}
	if r.rec.firstErr != nil {
		res.FirstError = r.rec.firstErr.Error()
	}
	steps := r.rec.counts()
	res.Timeline = timeline(steps)
	if cfg.Workload == Admission {
		res.Admission = r.admissionResult(steps)
	}
	return res
}

// timeline sums the fine steps into reportStep steps, up to the last step
// that saw an answer.
func timeline(steps [][numOutcomes]uint64) []TimelinePoint {
	last := len(steps) - 1
	for last >= 0 && steps[last] == ([numOutcomes]uint64{}) {
		last--
	}
	per := int(reportStep / timelineStep)
	var points []TimelinePoint
	for i := 0; i <= last; i += per {
		var sum [numOutcomes]uint64
		for _, s := range steps[i:min(i+per, last+1)] {
			for o, n := range s {
				sum[o] += n
			}
		}
		counts := make(map[string]uint64, numOutcomes)
		for o, n := range sum {
			counts[Outcome(o).String()] = n
		}
		points = append(points, TimelinePoint{
			T:      (time.Duration(i) * timelineStep).Seconds(),
			Counts: counts,
			BRate:  bRate(sum),
		})
	}
	return points
}

func (r *run) admissionResult(steps [][numOutcomes]uint64) *AdmissionResult {
	a := r.cfg.Admission
	phaseLen := r.cfg.Duration / time.Duration(len(a.Loads))
	out := &AdmissionResult{Limit: a.Limit, WaitS: a.Wait.Seconds(), ReopenS: -1}
	quietest := 0
	var loaded []int
	for p, load := range a.Loads {
		probe := r.rec.merged(sinceScheduled, streams*p+probeStream)
		pressure := r.rec.merged(sinceScheduled, streams*p+pressureStream)
		var counts [numOutcomes]uint64
		for o := range counts {
			counts[o] = probe[o].Count() + pressure[o].Count()
		}
		out.Phases = append(out.Phases, PhaseResult{
			Load:         load,
			StartS:       (time.Duration(p) * phaseLen).Seconds(),
			EndS:         (time.Duration(p+1) * phaseLen).Seconds(),
			BRate:        bRate(counts),
			Probe:        outcomeTable(probe),
			ProbeService: outcomeTable(r.rec.merged(sinceSent, streams*p+probeStream)),
			Pressure:     outcomeTable(pressure),
		})
		if load < a.Loads[quietest] {
			quietest = p
		}
		if load >= gateCloses {
			loaded = append(loaded, streams*p+probeStream)
		}
	}
	out.Latency = r.gateLatencies(sinceScheduled, streams*quietest+probeStream, loaded)
	out.Service = r.gateLatencies(sinceSent, streams*quietest+probeStream, loaded)
	for p := 1; p < len(a.Loads); p++ {
		if a.Loads[p-1] >= gateCloses && a.Loads[p] < gateReopens {
			out.ReopenS = reopenTime(steps, time.Duration(p)*phaseLen, time.Duration(p+1)*phaseLen)
			break
		}
	}
	return out
}

// gateLatencies summarises the admission run on one clock: A p99 of the
// unloaded probe series and of the loaded ones, B p99 of every series.
func (r *run) gateLatencies(clock, unloaded int, loaded []int) GateLatencies {
	g := GateLatencies{
		UnloadedAcquiredP99: micros(r.rec.merged(clock, unloaded)[Acquired].Quantile(0.99)),
		BusyP99:             micros(r.rec.merged(clock, r.rec.allSeries()...)[Busy].Quantile(0.99)),
	}
	if len(loaded) > 0 {
		g.LoadedAcquiredP99 = micros(r.rec.merged(clock, loaded...)[Acquired].Quantile(0.99))
	}
	return g
}

// reopenTime measures, in the steps between drop and end, how long after
// the drop the gate reopened for good: the start of the first step with a
// grant after the last step with a B. It is 0 when no B came after the
// drop, and -1 when no grant followed the last B before end.
func reopenTime(steps [][numOutcomes]uint64, drop, end time.Duration) float64 {
	first := int(drop / timelineStep)
	stop := min(int(end/timelineStep), len(steps))
	lastBusy := -1
	for i := first; i < stop; i++ {
		if steps[i][Busy] > 0 {
			lastBusy = i
		}
	}
	if lastBusy < 0 {
		return 0
	}
	for i := lastBusy + 1; i < stop; i++ {
		if steps[i][Acquired] > 0 {
			return (time.Duration(i)*timelineStep - drop).Seconds()
		}
	}
	return -1
}
