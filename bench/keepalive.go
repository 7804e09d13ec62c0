package bench

import (
	"context"
	"fmt"
	"github.com/lockd/lockd/internal/defaults"
	"io"
	"strconv"
	"sync"
	"text/tabwriter"
	"time"
)

// Defaults of the keepalive workload: 64 holders renewing every 100 ms
// are 640 renewals per second beside the probes.
const (
	DefaultKeepaliveHolders = 64
	DefaultKeepaliveEvery   = 100 * time.Millisecond
)

// KeepaliveConfig shapes the keepalive workload: in the second half of the
// run Holders callers, each holding a lock of its own, renew it every
// Every (lockd's KEEP, through Ticket.Renew), while a probe stream of
// uncontended cycles at Config.Rate runs throughout. The first half, the
// probes alone, is the baseline the second is compared with: the probes'
// load is the same in both, so what the second half costs more is what
// the renewals cost.
type KeepaliveConfig struct {
	Holders int
	Every   time.Duration
}

// Renewer is a Caller that can renew the lease of the lock it holds.
type Renewer interface {
	// Renew extends the lease of the last Acquired; it answers Acquired
	// (renewed, the same token), NotHeld, Indeterminate or Failed.
	Renew(ctx context.Context) (Outcome, error)
}

// KeepaliveResult is what the keepalive workload adds.
type KeepaliveResult struct {
	Holders int     `json:"holders"`
	EveryS  float64 `json:"every_s"`
	// LoadedStartS is when the renewals started: the end of the baseline.
	LoadedStartS float64 `json:"loaded_start_s"`
	// Renewals has the renewals' latencies by outcome letter (A: renewed),
	// from the instant each was due; RenewalsPerS the renewed ones per
	// second of the loaded half.
	Renewals     map[string]Percentiles `json:"renewals"`
	RenewalsPerS float64                `json:"renewals_per_s"`
	// The probes' A p99 in each half.
	Latency ProbeP99 `json:"latency"`
	// Baseline and Loaded are what lockbench and the server used in each
	// half; PerRenewal is their difference divided by the renewals.
	Baseline   HalfUsage    `json:"baseline"`
	Loaded     HalfUsage    `json:"loaded"`
	PerRenewal *RenewalCost `json:"per_renewal,omitempty"`
	// Errors counts the renewals not answered renewed (N, I or E).
	Errors     uint64 `json:"renewal_errors"`
	FirstError string `json:"renewal_first_error,omitempty"`
}

// keepaliveRun is the keepalive workload's state, read by its result.
type keepaliveRun struct {
	holders []holderRecord
	halves  [2][2]usage // [baseline, loaded][lockbench, server]
	// serverRead: the server's counters were read at both ends of both
	// halves.
	serverRead bool
}

// HalfUsage is what one half of a keepalive run used.
type HalfUsage struct {
	BenchCPUS   float64 `json:"bench_cpu_s"`
	ServerCPUS  float64 `json:"server_cpu_s,omitempty"`
	ServerSyscr uint64  `json:"server_syscr,omitempty"`
	ServerSyscw uint64  `json:"server_syscw,omitempty"`
	ServerCtxsw uint64  `json:"server_ctxsw,omitempty"`
}

// RenewalCost is the loaded half's extra usage per renewal. Server fields
// are absent without --server-pids. Noise can make a small cost negative.
type RenewalCost struct {
	BenchCPUUS    float64  `json:"bench_cpu_us"`
	ServerCPUUS   *float64 `json:"server_cpu_us,omitempty"`
	ServerSyscall *float64 `json:"server_syscalls,omitempty"`
	ServerCtxsw   *float64 `json:"server_ctxsw,omitempty"`
}

// holderRecord is one holder's renewals, kept apart so that holders never
// share a lock; merged at the end.
type holderRecord struct {
	hists    [numOutcomes]Histogram
	firstErr error
}

func (a *KeepaliveConfig) applyDefaults(lease time.Duration) error {
	a.Holders = defaults.Or(a.Holders, DefaultKeepaliveHolders)
	a.Every = defaults.Or(a.Every, DefaultKeepaliveEvery)
	if 2*a.Every > lease {
		return fmt.Errorf("keepalive renews every %v: the lease %v must be at least twice that", a.Every, lease)
	}
	return nil
}

// keepaliveLoad runs the keepalive workload: probes at Config.Rate
// throughout, and in the second half the holders renewing their locks,
// taken at the half so that no lease can lapse before its first renewal.
// It reads the usage of each half itself.
func (r *run) keepaliveLoad(ctx context.Context, probes, holders []Caller) error {
	renewers := make([]Renewer, len(holders))
	for i, h := range holders {
		rn, ok := h.(Renewer)
		if !ok {
			return fmt.Errorf("keepalive: the %s target cannot renew a lease", r.target.Kind())
		}
		renewers[i] = rn
	}
	st := &keepaliveRun{holders: make([]holderRecord, len(holders))}
	r.keepalive = st
	baseline := startMeter(procRoot, r.cfg.ServerPIDs)

	var holdErr error
	r.probeHalves(ctx, probes, func() {
		for i, h := range holders {
			key := r.keyPrefix + "k/" + strconv.Itoa(i)
			if out, err := h.Acquire(ctx, key, 0); out != Acquired {
				holdErr = fmt.Errorf("keepalive: holder %d could not take %q: %v %v", i, key, out, err)
				return
			}
			defer h.Release(context.WithoutCancel(ctx))
		}
		self, server, _ := baseline.stop()
		loaded := startMeter(procRoot, r.cfg.ServerPIDs)
		st.halves[0] = [2]usage{self, server}
		var renewing sync.WaitGroup
		for i, rn := range renewers {
			renewing.Go(func() { r.renewUntilEnd(ctx, rn, i, &st.holders[i]) })
		}
		renewing.Wait()
		self, server, _ = loaded.stop()
		st.halves[1] = [2]usage{self, server}
		st.serverRead = len(r.cfg.ServerPIDs) > 0 && st.halves[0][1].ioKnown && server.ioKnown
	})
	return holdErr
}

// renewUntilEnd renews one holder's lock every Every, each holder offset
// by its share of the interval so that the renewals arrive evenly, until
// the run ends. A renewal's latency counts from the instant it was due.
func (r *run) renewUntilEnd(ctx context.Context, rn Renewer, holder int, rec *holderRecord) {
	every := r.cfg.Keepalive.Every
	offset := every * time.Duration(holder) / time.Duration(r.cfg.Keepalive.Holders)
	due := time.Now().Add(offset)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for range maxCallerCycles {
		if !due.Before(r.end) {
			return
		}
		if d := time.Until(due); d > 0 {
			timer.Reset(d)
			select {
			case <-timer.C:
			case <-ctx.Done():
				return
			}
		}
		out, err := rn.Renew(ctx)
		rec.hists[out].Record(time.Since(due))
		if err != nil && rec.firstErr == nil {
			rec.firstErr = err
		}
		// A late renewal does not bunch the next ones up: they stay on
		// the holder's grid.
		for due = due.Add(every); due.Before(time.Now()); due = due.Add(every) {
		}
	}
}

// keepaliveResult merges the holders' renewals and the halves' usage.
func (r *run) keepaliveResult() *KeepaliveResult {
	st, a := r.keepalive, r.cfg.Keepalive
	half := r.cfg.Duration / timeoutsPhases
	res := &KeepaliveResult{Holders: a.Holders, EveryS: a.Every.Seconds(), LoadedStartS: half.Seconds()}
	var merged [numOutcomes]*Histogram
	for o := range numOutcomes {
		merged[o] = new(Histogram)
		for i := range st.holders {
			merged[o].Merge(&st.holders[i].hists[o])
		}
	}
	for i := range st.holders {
		if err := st.holders[i].firstErr; err != nil {
			res.FirstError = err.Error()
			break
		}
	}
	res.Renewals = outcomeTable(merged)
	renewed := merged[Acquired].Count()
	res.Errors = requests(merged) - renewed
	loadedS := (r.cfg.Duration - half).Seconds()
	res.RenewalsPerS = float64(renewed) / loadedS
	res.Latency = r.probeP99(sinceScheduled, probeStream, streams+probeStream)
	res.Baseline, res.Loaded = halfUsage(st.halves[0], st.serverRead), halfUsage(st.halves[1], st.serverRead)
	if renewed > 0 {
		n := float64(renewed)
		cost := &RenewalCost{BenchCPUUS: micros(st.halves[1][0].cpu-st.halves[0][0].cpu) / n}
		if st.serverRead {
			b, l := st.halves[0][1], st.halves[1][1]
			cpu := micros(l.cpu-b.cpu) / n
			calls := (float64(l.syscr+l.syscw) - float64(b.syscr+b.syscw)) / n
			cost.ServerCPUUS, cost.ServerSyscall = &cpu, &calls
			if b.switchesKnown && l.switchesKnown {
				sw := (float64(l.switches) - float64(b.switches)) / n
				cost.ServerCtxsw = &sw
			}
		}
		res.PerRenewal = cost
	}
	return res
}

func halfUsage(u [2]usage, serverRead bool) HalfUsage {
	h := HalfUsage{BenchCPUS: u[0].cpu.Seconds()}
	if serverRead {
		h.ServerCPUS, h.ServerSyscr, h.ServerSyscw, h.ServerCtxsw = u[1].cpu.Seconds(), u[1].syscr, u[1].syscw, u[1].switches
	}
	return h
}

// shape says what the keepalive run did.
func (k *KeepaliveResult) shape() string {
	return fmt.Sprintf("probes alone until %.1fs, then also %d holders renewing every %s (%.0f renewals/s)",
		k.LoadedStartS, k.Holders, formatMicros(k.EveryS*1e6), k.RenewalsPerS)
}

func writeKeepalive(w io.Writer, k *KeepaliveResult) {
	fmt.Fprintf(w, "  keepalive: %s\n", k.shape())
	writeOutcomes(w, "    ", k.Renewals)
	fmt.Fprintf(w, "  probe A p99: baseline %s, with renewals %s (%s)\n",
		formatMicros(k.Latency.BaselineP99), formatMicros(k.Latency.LoadedP99), formatRatio(k.Latency.Ratio))
	if c := k.PerRenewal; c != nil {
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintf(tw, "  per renewal\tlockbench CPU\tserver CPU\tserver syscalls\tserver ctxsw\t\n")
		fmt.Fprintf(tw, "  \t%s\t%s\t%s\t%s\t\n", formatMicros(c.BenchCPUUS), optMicros(c.ServerCPUUS), optCount(c.ServerSyscall), optCount(c.ServerCtxsw))
		tw.Flush()
	}
}

func optMicros(v *float64) string {
	if v == nil {
		return "–"
	}
	return formatMicros(*v)
}

func optCount(v *float64) string {
	if v == nil {
		return "–"
	}
	return fmt.Sprintf("%.2f", *v)
}
