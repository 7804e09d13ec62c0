package bench

import (
	"time"
)

// Result is what one run measured. Latencies are in microseconds.
type Result struct {
	// Target is the address as given ("lockd://127.0.0.1:7420"); Kind the
	// implementation driven ("lockd", "lockd-raw", "redis/rueidis",
	// "redis/go-redis", "etcd").
	Target   string `json:"target"`
	Kind     string `json:"kind"`
	Workload string `json:"workload"`
	Mode     string `json:"mode"` // "closed" or "open"
	Callers  int    `json:"callers"`
	// Sample is the run's place, from 1, among the runs of its
	// configuration when lockbench repeats each (--repeat); 0 otherwise.
	Sample int `json:"sample,omitempty"`
	// Conns is the connections the target had open at the end of the run,
	// as the client or the server counts them; Transport how they were
	// configured, in the client library's terms.
	Conns      int     `json:"conns"`
	Transport  string  `json:"transport"`
	Rate       float64 `json:"rate,omitempty"`
	Keys       int     `json:"keys"`
	DurationS  float64 `json:"duration_s"`
	Cycles     uint64  `json:"cycles"`
	CyclesPerS float64 `json:"cycles_per_s"`
	Errors     uint64  `json:"errors"`
	FirstError string  `json:"first_error,omitempty"`
	Drops      uint64  `json:"drops"`
	// Requests counts the lock operations the callers made: every acquire
	// and every release that got an outcome, whatever it was — 2 per cycle,
	// plus the acquires that did not end in a grant. A waiting Redis
	// acquire is one request however often it polled.
	Requests uint64 `json:"requests"`
	// BenchCPUS is the CPU time lockbench itself used during the run (an
	// in-process server's included); ServerCPUS that of the target's
	// server processes, summed, when their pids were given.
	BenchCPUS  float64 `json:"bench_cpu_s"`
	ServerCPUS float64 `json:"server_cpu_s,omitempty"`
	// Syscr and Syscw are read-like and write-like system calls, Ctxsw
	// voluntary plus involuntary context switches, during the run (see
	// usage.go for what Linux counts): lockbench's own, and the server
	// processes' summed, absent when unknown (Notes says why).
	BenchSyscr  uint64 `json:"bench_syscr"`
	BenchSyscw  uint64 `json:"bench_syscw"`
	BenchCtxsw  uint64 `json:"bench_ctxsw"`
	ServerSyscr uint64 `json:"server_syscr,omitempty"`
	ServerSyscw uint64 `json:"server_syscw,omitempty"`
	ServerCtxsw uint64 `json:"server_ctxsw,omitempty"`
	// Notes say what could not be measured, and why.
	Notes []string `json:"notes,omitempty"`
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
	Timeouts  *TimeoutsResult        `json:"timeouts,omitempty"`
	Keepalive *KeepaliveResult       `json:"keepalive,omitempty"`
	Failover  *FailoverResult        `json:"failover,omitempty"`
}

// TimeoutsResult is what the timeouts workload adds.
type TimeoutsResult struct {
	WaitS   float64 `json:"wait_s"`
	HoldS   float64 `json:"hold_s"`
	HotKeys int     `json:"hot_keys"`
	// LoadedStartS is when the waiting callers first started: the end
	// of the first baseline window. Rounds is how many baseline windows
	// alternated with as many windows of waiting callers, and LoadedS
	// the time the waiting callers ran, until their last cycle ended.
	LoadedStartS float64 `json:"loaded_start_s"`
	Rounds       int     `json:"rounds"`
	LoadedS      float64 `json:"loaded_s"`
	// Waiting is the waiting callers' outcomes; BaselineProbes and
	// LoadedProbes the probes' in each half.
	Waiting        OutcomeKinds `json:"waiting"`
	BaselineProbes OutcomeKinds `json:"baseline_probes"`
	LoadedProbes   OutcomeKinds `json:"loaded_probes"`
	// The probes' A p99 in each half, from the scheduled instant
	// (Latency) and from the actual send (Service), and loaded ÷
	// baseline of each.
	Latency ProbeP99 `json:"latency"`
	Service ProbeP99 `json:"service"`
	// Reconnects counts the client's reconnects in the baseline and the
	// loaded windows, and ReconnectsPerS in the loaded ones; both absent
	// for a target whose client does not reconnect by itself (all but
	// the lockd client).
	BaselineReconnects *uint64 `json:"baseline_reconnects,omitempty"`
	LoadedReconnects   *uint64 `json:"loaded_reconnects,omitempty"`
	ReconnectsPerS     float64 `json:"loaded_reconnects_per_s,omitempty"`
}

// OutcomeKinds counts one stream's outcomes by kind. Acquired, TimedOut
// and OwnIndeterminate are acquires; Collateral and Errors count acquires
// and releases.
type OutcomeKinds struct {
	Acquired uint64 `json:"acquired"`
	TimedOut uint64 `json:"timed_out"`
	// OwnIndeterminate is W: the acquire's own wait ran out.
	OwnIndeterminate uint64 `json:"indeterminate_own"`
	// Collateral is I: indeterminate for a reason not the call's own.
	Collateral uint64 `json:"indeterminate_collateral"`
	Errors     uint64 `json:"errors"`
}

// ProbeP99 compares the probes' A p99 across the timeouts workload's
// halves.
type ProbeP99 struct {
	BaselineP99 float64 `json:"baseline_a_p99_us"`
	LoadedP99   float64 `json:"loaded_a_p99_us"`
	// Ratio is LoadedP99 ÷ BaselineP99 (issue target: ≤ 1.5).
	Ratio float64 `json:"loaded_over_baseline"`
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
	acquires := c[Acquired] + c[TimedOut] + c[Busy] + c[WaitElapsed]
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
		Requests:   requests(all),
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
	if r.workload.result != nil {
		r.workload.result(r, res, steps)
	}
	return res
}

// requests counts every outcome recorded.
func requests(hists [numOutcomes]*Histogram) uint64 {
	var n uint64
	for _, h := range hists {
		n += h.Count()
	}
	return n
}

// setUsage puts what the meter read into the result.
func (res *Result) setUsage(self, server usage) {
	res.BenchCPUS = self.cpu.Seconds()
	res.BenchSyscr, res.BenchSyscw, res.BenchCtxsw = self.syscr, self.syscw, self.switches
	res.ServerCPUS = server.cpu.Seconds()
	res.ServerSyscr, res.ServerSyscw, res.ServerCtxsw = server.syscr, server.syscw, server.switches
}

func outcomeKinds(hists [numOutcomes]*Histogram) OutcomeKinds {
	return OutcomeKinds{
		Acquired:         hists[Acquired].Count(),
		TimedOut:         hists[TimedOut].Count(),
		OwnIndeterminate: hists[WaitElapsed].Count(),
		Collateral:       hists[Indeterminate].Count(),
		Errors:           hists[Failed].Count(),
	}
}

func (r *run) timeoutsResult() *TimeoutsResult {
	t := &r.waits
	baseline, loaded := probeStream, streams+probeStream
	out := &TimeoutsResult{
		WaitS:          r.cfg.Wait.Seconds(),
		HoldS:          r.cfg.Hold.Seconds(),
		HotKeys:        r.cfg.Keys,
		LoadedStartS:   t.firstLoaded.Seconds(),
		Rounds:         r.cfg.Rounds,
		LoadedS:        t.loadedTime.Seconds(),
		Waiting:        outcomeKinds(r.rec.merged(sinceScheduled, streams+pressureStream)),
		BaselineProbes: outcomeKinds(r.rec.merged(sinceScheduled, baseline)),
		LoadedProbes:   outcomeKinds(r.rec.merged(sinceScheduled, loaded)),
		Latency:        r.probeP99(sinceScheduled, baseline, loaded),
		Service:        r.probeP99(sinceSent, baseline, loaded),
	}
	if _, ok := r.target.(reconnectCounter); ok {
		before, during := t.baselineReconnects, t.loadedReconnects
		out.BaselineReconnects, out.LoadedReconnects = &before, &during
		if t.loadedTime > 0 {
			out.ReconnectsPerS = float64(during) / t.loadedTime.Seconds()
		}
	}
	return out
}

func (r *run) probeP99(clock, baseline, loaded int) ProbeP99 {
	p := ProbeP99{
		BaselineP99: micros(r.rec.merged(clock, baseline)[Acquired].Quantile(0.99)),
		LoadedP99:   micros(r.rec.merged(clock, loaded)[Acquired].Quantile(0.99)),
	}
	if p.BaselineP99 > 0 {
		p.Ratio = p.LoadedP99 / p.BaselineP99
	}
	return p
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
