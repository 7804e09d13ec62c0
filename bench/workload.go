package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"github.com/lockd/lockd/internal/defaults"
	"io"
	"math"
	mrand "math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Workload names.
const (
	Uncontended = "uncontended"
	Contended   = "contended"
	Admission   = "admission"
	Timeouts    = "timeouts"
	Keepalive   = "keepalive"
)

// workload is one entry of the workload table: what sets one workload
// apart from the others. Only name and load are required.
type workload struct {
	name string
	// defaults fills the workload's zero fields of cfg, and what it needs
	// of opts, and refuses a shape that cannot measure anything. The
	// fields every workload shares are checked before, and Wait filled
	// after (so that a workload can have a default of its own).
	defaults func(cfg *Config, opts *TargetOptions) error
	// supports says why the workload cannot run against spec, through
	// bare frames when raw, or nil; a nil supports runs against any.
	supports func(spec TargetSpec, raw bool) error
	// probesAtRate: the workload's measured stream is probes at
	// Config.Rate, open loop whatever the caller asked.
	probesAtRate bool
	// The functions take the run first, so that its methods fill them.
	//
	// setUp, before the clock starts, makes the callers the workload adds
	// to the measured ones and says how many series the recorder keeps;
	// warmExtra, whether those callers are warmed up with the measured
	// ones. A nil setUp adds none and keeps one series.
	setUp     func(r *run, ctx context.Context) (extra []Caller, series int, err error)
	warmExtra bool
	// load runs the measured load until the run's end.
	load func(r *run, ctx context.Context, callers, extra []Caller) error
	// result adds the workload's own figures to res.
	result func(r *run, res *Result, steps [][numOutcomes]uint64)
}

// workloads is the workload table, in the order a full run takes them. A
// new workload is one entry here, its functions in a file of its own.
var workloads = []workload{
	{name: Uncontended, defaults: keysOrDefault(DefaultUncontendedKeys), load: (*run).callLoop},
	{name: Contended, defaults: keysOrDefault(DefaultContendedKeys), load: (*run).callLoop},
	{name: Admission, defaults: admissionDefaults, supports: lockdOnly, probesAtRate: true,
		setUp: (*run).admissionSetUp, load: (*run).admission,
		result: func(r *run, res *Result, steps [][numOutcomes]uint64) { res.Admission = r.admissionResult(steps) }},
	{name: Timeouts, defaults: timeoutsDefaults, probesAtRate: true,
		setUp: (*run).timeoutsSetUp, warmExtra: true, load: (*run).timeouts,
		result: func(r *run, res *Result, _ [][numOutcomes]uint64) { res.Timeouts = r.timeoutsResult() }},
	{name: Keepalive, defaults: keepaliveDefaults, supports: lockdClientOnly, probesAtRate: true,
		setUp: (*run).keepaliveSetUp, warmExtra: true, load: (*run).keepaliveLoad,
		result: func(r *run, res *Result, _ [][numOutcomes]uint64) { res.Keepalive = r.keepaliveResult() }},
}

// Workloads lists the workloads in the order a full run takes them.
var Workloads = workloadNames()

func workloadNames() []string {
	names := make([]string, len(workloads))
	for i, w := range workloads {
		names[i] = w.name
	}
	return names
}

func lookupWorkload(name string) (*workload, error) {
	for i := range workloads {
		if workloads[i].name == name {
			return &workloads[i], nil
		}
	}
	return nil, fmt.Errorf("unknown workload %q (want one of %s)", name, strings.Join(Workloads, ", "))
}

// CanRun says why the workload cannot run against spec (through bare
// frames when raw), or nil when it can.
func CanRun(name string, spec TargetSpec, raw bool) error {
	w, err := lookupWorkload(name)
	if err != nil || w.supports == nil {
		return err
	}
	return w.supports(spec, raw)
}

// ProbesAtRate says whether the workload measures probes at Config.Rate,
// open loop, whatever the rate asked.
func ProbesAtRate(name string) bool {
	w, err := lookupWorkload(name)
	return err == nil && w.probesAtRate
}

func lockdOnly(spec TargetSpec, _ bool) error {
	if spec.Scheme != SchemeLockd {
		return fmt.Errorf("%s has no admission gate", spec.Scheme)
	}
	return nil
}

func lockdClientOnly(spec TargetSpec, raw bool) error {
	if spec.Scheme != SchemeLockd || raw {
		kind := spec.Scheme
		if raw {
			kind = "lockd in bare frames"
		}
		return fmt.Errorf("%s renews no lease: only the lockd client does", kind)
	}
	return nil
}

// Defaults of a Config's zero fields.
const (
	DefaultUncontendedKeys = 1_000_000
	DefaultContendedKeys   = 4
	DefaultWait            = 5 * time.Second
	DefaultAdmissionLimit  = 2000
	// DefaultProbeRate is the arrival rate of the uncontended probe
	// stream of the admission and timeouts workloads.
	DefaultProbeRate     = 1000
	DefaultAdmissionWait = time.Second
	// The timeouts workload's waiting callers queue for one hot key, each
	// holding it DefaultTimeoutsHold, so that with 64 of them most waits
	// of DefaultTimeoutsWait run out.
	DefaultTimeoutsKeys = 1
	DefaultTimeoutsHold = 50 * time.Millisecond
	DefaultTimeoutsWait = time.Second
)

// DefaultAdmissionLoads are the admission phases' offered loads, as
// fractions of the limit: unloaded, comfortably open, past the 90 % close
// threshold, and back below the 75 % reopen threshold.
var DefaultAdmissionLoads = []float64{0, 0.5, 1.3, 0.5}

// maxCallerCycles bounds every caller's loop in count, whatever the clock
// does; the run's duration bounds it in time.
const maxCallerCycles = 1 << 26

// Config is one run of one workload.
type Config struct {
	Workload string
	Duration time.Duration
	// Callers is the number of concurrent callers. Closed loop: each calls
	// again as soon as its cycle ends. Open loop: the most cycles in
	// flight; an arrival that finds them all busy and the queue full is
	// dropped, and counted. The timeouts workload has Callers waiting
	// callers and as many probe workers.
	Callers int
	// Rate, when > 0, runs open loop: cycles start at this fixed rate per
	// second, and their latency is measured from the scheduled start, so a
	// slow answer cannot hide the arrivals it delayed.
	Rate float64
	// Keys is the key space: uncontended draws keys at random from Keys
	// keys, contended and timeouts from Keys hot keys.
	Keys int
	// Wait is how long a contended or timeouts acquire may queue.
	Wait time.Duration
	// Hold is the time between a grant and its release (the timeouts
	// workload's waiting callers only: 0 there means
	// DefaultTimeoutsHold).
	Hold time.Duration
	// Rounds is how many times the timeouts workload alternates a window
	// of probes alone with a window in which the waiting callers queue
	// too (0 means 1: two halves). More rounds interleave the two over
	// the run, so that a machine whose speed drifts, or that stalls now
	// and then, weighs on both alike.
	Rounds    int
	Admission AdmissionConfig
	Keepalive KeepaliveConfig
	// ServerPIDs, when not empty, are the processes of the target's
	// server on this machine (several for a cluster's nodes), whose CPU
	// time, syscalls and context switches, summed, the result then
	// reports; unknown when any of them cannot be read.
	ServerPIDs []int
	// Progress, when not nil, gets a line every ProgressEvery.
	Progress      io.Writer
	ProgressEvery time.Duration
}

// AdmissionConfig shapes the admission workload: a pressure stream of
// acquires that queue behind a held key fills the server's in-flight gate
// phase by phase, while a probe stream of uncontended cycles at Config.Rate
// measures what callers see.
type AdmissionConfig struct {
	// Limit is the server's in-flight limit (lockd --max-inflight).
	Limit int
	// Wait is how long each pressure acquire queues: with a pressure rate
	// of load*Limit/Wait, load*Limit acquires are queued at once.
	Wait time.Duration
	// Loads are the phases' offered pressure, as fractions of Limit.
	Loads []float64
}

// applyDefaults fills cfg's zero fields, and what its workload needs of
// opts, and returns the workload's entry.
func (cfg *Config) applyDefaults(opts *TargetOptions) (*workload, error) {
	w, err := lookupWorkload(cfg.Workload)
	if err != nil {
		return nil, err
	}
	if cfg.Duration <= 0 {
		return nil, errors.New("duration must be positive")
	}
	cfg.Callers = defaults.Or(cfg.Callers, 1)
	cfg.ProgressEvery = defaults.Or(cfg.ProgressEvery, time.Second)
	if w.defaults != nil {
		if err := w.defaults(cfg, opts); err != nil {
			return nil, err
		}
	}
	cfg.Wait = defaults.Or(cfg.Wait, DefaultWait)
	return w, nil
}

func keysOrDefault(keys int) func(*Config, *TargetOptions) error {
	return func(cfg *Config, _ *TargetOptions) error {
		cfg.Keys = defaults.Or(cfg.Keys, keys)
		return nil
	}
}

func timeoutsDefaults(cfg *Config, _ *TargetOptions) error {
	cfg.Keys = defaults.Or(cfg.Keys, DefaultTimeoutsKeys)
	cfg.Wait = defaults.Or(cfg.Wait, DefaultTimeoutsWait)
	cfg.Hold = defaults.Or(cfg.Hold, DefaultTimeoutsHold)
	cfg.Rate = defaults.Or(cfg.Rate, DefaultProbeRate)
	cfg.Rounds = defaults.Or(cfg.Rounds, 1)
	// Every window with the waiting callers must see waits run out
	// more than once.
	if least := 4 * cfg.Wait * time.Duration(cfg.Rounds); cfg.Duration < least {
		return fmt.Errorf("timeouts needs a run of at least 4 × the wait %v per round, half of each round with waits running out: use --duration ≥ %v", cfg.Wait, least)
	}
	return nil
}

func keepaliveDefaults(cfg *Config, opts *TargetOptions) error {
	cfg.Rate = defaults.Or(cfg.Rate, DefaultProbeRate)
	if err := cfg.Keepalive.applyDefaults(opts.Lease); err != nil {
		return err
	}
	opts.MaxInFlight += cfg.Keepalive.Holders
	return nil
}

func admissionDefaults(cfg *Config, _ *TargetOptions) error {
	cfg.Keys = defaults.Or(cfg.Keys, DefaultUncontendedKeys)
	cfg.Rate = defaults.Or(cfg.Rate, DefaultProbeRate)
	a := &cfg.Admission
	a.Limit = defaults.Or(a.Limit, DefaultAdmissionLimit)
	a.Wait = defaults.Or(a.Wait, DefaultAdmissionWait)
	a.Wait = time.Duration(wholeSeconds(a.Wait)) * time.Second // as the wire carries it
	if len(a.Loads) == 0 {
		a.Loads = DefaultAdmissionLoads
	}
	for _, l := range a.Loads {
		if !(l >= 0 && l <= 10) {
			return fmt.Errorf("admission load %v is not a fraction of the limit between 0 and 10", l)
		}
	}
	if phase := cfg.Duration / time.Duration(len(a.Loads)); phase < 3*a.Wait/2 {
		return fmt.Errorf("admission needs phases of at least 1.5 × the pressure wait %v to fill the gate: use --duration ≥ %v",
			a.Wait, time.Duration(len(a.Loads))*3*a.Wait/2)
	}
	return nil
}

// pressurePool is how many pressure acquires the admission workload can
// have outstanding: every acquire the highest load offers at once.
func (a AdmissionConfig) pressurePool() int {
	peak := 0.0
	for _, l := range a.Loads {
		peak = max(peak, l)
	}
	return int(math.Ceil(peak*float64(a.Limit))) + 1
}

// Run connects to the target, runs one workload, and closes the
// connection. Its time is bounded by cfg.Duration plus the longest wait
// any request may still be in.
func Run(ctx context.Context, spec TargetSpec, opts TargetOptions, cfg Config) (*Result, error) {
	opts.MaxInFlight = max(cfg.Callers, 1)
	w, err := cfg.applyDefaults(&opts)
	if err != nil {
		return nil, err
	}
	if w.supports != nil {
		if err := w.supports(spec, opts.Raw); err != nil {
			return nil, fmt.Errorf("the %s workload cannot run here: %w", w.name, err)
		}
	}
	target, err := Open(ctx, spec, opts)
	if err != nil {
		return nil, err
	}
	defer target.Close()
	r := &run{cfg: cfg, workload: w, spec: spec, opts: opts, target: target, keyPrefix: runKeyPrefix(cfg.Workload)}
	defer func() {
		if r.pressure != nil {
			r.pressure.Close()
		}
	}()
	res, err := r.execute(ctx)
	if err != nil {
		return nil, err
	}
	res.Target, res.Kind, res.Transport = spec.String(), target.Kind(), target.Transport()
	countCtx, cancel := context.WithTimeout(ctx, answerSlack)
	defer cancel()
	if res.Conns, err = target.Conns(countCtx); err != nil {
		res.Notes = append(res.Notes, fmt.Sprintf("connections unknown: %v", err))
	}
	return res, nil
}

// runKeyPrefix makes a run's keys its own, so that runs against one
// long-lived server never meet each other's locks.
func runKeyPrefix(workload string) string {
	var b [4]byte
	rand.Read(b[:])
	return "lb/" + hex.EncodeToString(b[:]) + "/" + workload[:1] + "/"
}

type run struct {
	cfg      Config
	workload *workload
	spec     TargetSpec
	opts     TargetOptions
	target   Target
	// pressure carries the admission workload's pressure stream and its
	// blocker.
	pressure  Target
	keyPrefix string
	rec       *recorder
	lag       Histogram // of the open loop's arrivals
	start     time.Time
	end       time.Time
	waits     timeoutsRun // the timeouts workload's
	keepalive *keepaliveRun
}

// Series of the admission and timeouts workloads: one per phase and
// stream. The probes are uncontended cycles measuring what callers see;
// the pressure stream is the admission workload's queued acquires and the
// timeouts workload's waiting callers.
const (
	probeStream    = 0
	pressureStream = 1
	streams        = 2
)

// timeoutsPhases are the phases the timeouts and keepalive workloads
// record the probes in: the baseline, with the probes alone, and the one
// with the load they measure too.
const timeoutsPhases = 2

func (r *run) execute(ctx context.Context) (*Result, error) {
	cfg, w := r.cfg, r.workload
	series := 1
	var callers, extra []Caller
	defer func() {
		for _, c := range append(callers, extra...) {
			c.Close()
		}
	}()
	var err error
	if callers, err = newCallers(ctx, r.target, 0, cfg.Callers); err != nil {
		return nil, err
	}
	warm := callers
	if w.setUp != nil {
		if extra, series, err = w.setUp(r, ctx); err != nil {
			return nil, err
		}
		if w.warmExtra {
			warm = append(callers[:len(callers):len(callers)], extra...)
		}
	}

	// Bound everything: a request still waiting after the run and its
	// longest wait is abandoned and counted as failed.
	longest := max(cfg.Wait, cfg.Admission.Wait) + answerSlack
	ctx, cancel := context.WithTimeout(ctx, cfg.Duration+longest+answerSlack)
	defer cancel()

	if err := r.warmUp(ctx, warm); err != nil {
		return nil, err
	}
	m := startMeter(procRoot, cfg.ServerPIDs)
	r.start = time.Now()
	r.end = r.start.Add(cfg.Duration)
	r.rec = newRecorder(r.start, series, cfg.Duration+longest, cfg.Rate > 0)
	stopProgress := r.startProgress()
	err = w.load(r, ctx, callers, extra)
	elapsed := time.Since(r.start)
	self, server, notes := m.stop()
	stopProgress()
	if err != nil {
		return nil, err
	}
	res := r.result(elapsed)
	res.setUsage(self, server)
	res.Notes = append(res.Notes, notes...)
	return res, nil
}

// callLoop runs the measured callers' lock cycles: open loop at
// Config.Rate when it is set, else closed loop.
func (r *run) callLoop(ctx context.Context, callers, _ []Caller) error {
	if r.cfg.Rate > 0 {
		r.openLoop(ctx, callers)
	} else {
		r.closedLoop(ctx, callers)
	}
	return nil
}

// admissionSetUp opens the admission workload's pressure target and makes
// its callers: the pressure pool, and the blocker first.
func (r *run) admissionSetUp(ctx context.Context) ([]Caller, int, error) {
	// The pressure only fills the gate; it is not what is measured, so it
	// goes in bare frames whatever the probes use. Through the client, a
	// queued acquire whose wait runs out would close its session (see
	// docs/performance.md) and take the probes on that session with it.
	a := r.cfg.Admission
	pool := a.pressurePool()
	opts := r.opts
	opts.Raw = true
	opts.MaxInFlight = pool
	// Below the server's default per-connection in-flight limit.
	opts.Conns = max(r.opts.Conns, defaultConns, pool/2048+1)
	// The blocker must hold its key for the whole run: if its lease
	// lapsed, the pressure would be granted instead of queued.
	opts.Lease = max(r.opts.Lease, r.cfg.Duration+a.Wait+answerSlack)
	var err error
	if r.pressure, err = Open(ctx, r.spec, opts); err != nil {
		return nil, 0, err
	}
	pressure, err := newCallers(ctx, r.pressure, 0, pool+1)
	return pressure, streams * len(a.Loads), err
}

// timeoutsSetUp makes the waiting callers: they share the probes' target,
// the client, its sessions, its connections.
func (r *run) timeoutsSetUp(ctx context.Context) ([]Caller, int, error) {
	waiting, err := newCallers(ctx, r.target, r.cfg.Callers, r.cfg.Callers)
	return waiting, streams * timeoutsPhases, err
}

// keepaliveSetUp makes the holders: they share the probes' client, as an
// application's would.
func (r *run) keepaliveSetUp(ctx context.Context) ([]Caller, int, error) {
	holders, err := newCallers(ctx, r.target, r.cfg.Callers, r.cfg.Keepalive.Holders)
	return holders, streams * timeoutsPhases, err
}

// warmUp runs one unrecorded lock cycle per caller before the clock
// starts, so that connections, sessions and first uses are paid for
// outside the measurement; it also proves the target answers.
func (r *run) warmUp(ctx context.Context, callers []Caller) error {
	return warmUpKeys(ctx, callers, r.keyPrefix+"warm/", 0)
}

// newCallers makes n callers of target, with ids from first on.
func newCallers(ctx context.Context, target Target, first, n int) ([]Caller, error) {
	callers := make([]Caller, 0, n)
	for i := range n {
		c, err := target.NewCaller(ctx, first+i)
		if err != nil {
			for _, c := range callers {
				c.Close()
			}
			return nil, err
		}
		callers = append(callers, c)
	}
	return callers, nil
}

// pickKey draws the key of the next cycle.
func (r *run) pickKey(rng *mrand.Rand) string {
	return r.keyPrefix + strconv.Itoa(rng.IntN(r.cfg.Keys))
}

// probeKey draws the key of a probe cycle, out of a key space of its
// own: probes never meet the timeouts workload's hot keys.
func (r *run) probeKey(rng *mrand.Rand) string {
	return r.keyPrefix + "p/" + strconv.Itoa(rng.IntN(DefaultUncontendedKeys))
}

// wait is the wait of the workload's cycles: uncontended cycles try once.
func (r *run) wait() time.Duration {
	if r.cfg.Workload == Contended {
		return r.cfg.Wait
	}
	return 0
}

// cycle runs one lock cycle: acquire, hold, release. The acquire's latency
// counts from scheduled, the instant the cycle was due.
func (r *run) cycle(ctx context.Context, c Caller, worker, series int, key string, wait, hold time.Duration, scheduled time.Time) {
	sent := time.Now()
	out, err := c.Acquire(ctx, key, wait)
	r.rec.record(worker, series, out, scheduled, sent, time.Now(), err)
	if out != Acquired {
		return
	}
	if hold > 0 {
		time.Sleep(hold)
	}
	sent = time.Now()
	out, err = c.Release(ctx)
	r.rec.record(worker, series, out, sent, sent, time.Now(), err)
	if out.endsCycle() {
		r.rec.cycles.Add(1)
	}
}

func (r *run) newRand(worker int) *mrand.Rand {
	return mrand.New(mrand.NewPCG(uint64(r.start.UnixNano()), uint64(worker)))
}

// closedLoop runs every caller back to back until the run ends.
func (r *run) closedLoop(ctx context.Context, callers []Caller) {
	var wg sync.WaitGroup
	for i, c := range callers {
		wg.Go(func() {
			rng := r.newRand(i)
			for range maxCallerCycles {
				now := time.Now()
				if !now.Before(r.end) || ctx.Err() != nil {
					return
				}
				r.cycle(ctx, c, i, 0, r.pickKey(rng), r.wait(), r.cfg.Hold, now)
			}
		})
	}
	wg.Wait()
}

// arrival is one scheduled request of an open loop.
type arrival struct {
	at    time.Time
	phase int
}

// openLoop starts cycles at the fixed rate; callers work them off.
func (r *run) openLoop(ctx context.Context, callers []Caller) {
	arrivals := make(chan arrival, len(callers))
	var wg sync.WaitGroup
	for i, c := range callers {
		wg.Go(func() {
			rng := r.newRand(i)
			for a := range arrivals {
				r.cycle(ctx, c, i, 0, r.pickKey(rng), r.wait(), r.cfg.Hold, a.at)
			}
		})
	}
	r.schedule(ctx, func(time.Duration) (float64, int, time.Duration) { return r.cfg.Rate, 0, r.cfg.Duration }, arrivals, &r.lag)
	wg.Wait()
}

// rateFunc gives the arrival rate at an instant of the run, the phase the
// instant belongs to, and when that phase ends.
type rateFunc func(at time.Duration) (rate float64, phase int, phaseEnd time.Duration)

// schedule sends arrivals at the rates rateAt gives, then closes out.
// Arrivals are due at fixed instants from the start, whatever the answers
// do; one that finds out full is dropped and counted rather than delayed.
//
// lag records how late each arrival was sent: the latency of a cycle
// counts from its scheduled instant, so this part of it is the load
// generator's own (timer granularity, a CPU shared with the server).
func (r *run) schedule(ctx context.Context, rateAt rateFunc, out chan<- arrival, lag *Histogram) {
	defer close(out)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	next := time.Duration(0)
	for next < r.cfg.Duration {
		rate, phase, phaseEnd := rateAt(next)
		if rate <= 0 {
			next = phaseEnd
			continue
		}
		at := r.start.Add(next)
		if d := time.Until(at); d > 0 {
			timer.Reset(d)
			select {
			case <-timer.C:
			case <-ctx.Done():
				return
			}
		}
		lag.Record(time.Since(at))
		select {
		case out <- arrival{at: at, phase: phase}:
		default:
			r.rec.drops.Add(1)
		}
		next += time.Duration(float64(time.Second) / rate)
	}
}

// admission runs the admission workload: a blocker holds the hot key, the
// pressure stream queues behind it at each phase's load, the probe stream
// runs uncontended cycles at Config.Rate throughout.
func (r *run) admission(ctx context.Context, probes, pool []Caller) error {
	blocker, pressure := pool[0], pool[1:]
	a := r.cfg.Admission
	hotKey := r.keyPrefix + "hot"
	if out, err := blocker.Acquire(ctx, hotKey, 0); out != Acquired {
		return fmt.Errorf("admission: the blocker could not take %q: %v %v", hotKey, out, err)
	}
	defer blocker.Release(context.WithoutCancel(ctx))
	phaseLen := r.cfg.Duration / time.Duration(len(a.Loads))
	phaseAt := func(at time.Duration) (int, time.Duration) {
		p := min(int(at/phaseLen), len(a.Loads)-1)
		return p, time.Duration(p+1) * phaseLen
	}

	var wg sync.WaitGroup
	probeArrivals := r.startProbes(ctx, &wg, probes, r.pickKey, r.cfg.Hold)
	pressureArrivals := make(chan arrival, len(pressure))
	for i, c := range pressure {
		worker := len(probes) + i
		wg.Go(func() {
			for arr := range pressureArrivals {
				// A grant would only come if the blocker's lease ran out;
				// cycle releases it at once.
				r.cycle(ctx, c, worker, streams*arr.phase+pressureStream, hotKey, a.Wait, r.cfg.Hold, arr.at)
			}
		})
	}
	var pressureLag Histogram
	wg.Go(func() {
		r.schedule(ctx, func(at time.Duration) (float64, int, time.Duration) {
			p, end := phaseAt(at)
			return a.Loads[p] * float64(a.Limit) / a.Wait.Seconds(), p, end
		}, pressureArrivals, &pressureLag)
	})
	r.schedule(ctx, func(at time.Duration) (float64, int, time.Duration) {
		p, end := phaseAt(at)
		return r.cfg.Rate, p, end
	}, probeArrivals, &r.lag)
	wg.Wait()
	r.lag.Merge(&pressureLag)
	return nil
}

// timeoutsRun is what the timeouts workload measures beside the
// recorder's series.
type timeoutsRun struct {
	// loaded is set while the waiting callers run, from the start of
	// their window until the last of their cycles has ended: the probes
	// scheduled meanwhile are the loaded phase's.
	loaded atomic.Bool
	// The client's reconnects and the time spent with the waiting
	// callers running; set when the workload returns.
	baselineReconnects, loadedReconnects uint64
	loadedTime                           time.Duration
	firstLoaded                          time.Duration // since the start
}

// timeouts runs the timeouts workload. A probe stream of uncontended
// cycles at Config.Rate runs throughout. The run is Config.Rounds rounds,
// each a window of probes alone, the baseline the probes' latency is
// compared with, then a window in which Callers waiting callers queue for
// Keys hot keys with Config.Wait too, each holding its grant Config.Hold,
// so that most of their waits run out while the probes share the same
// client. A loaded window lasts until the waiting callers' last cycles
// have ended, up to a wait and a hold past its end.
func (r *run) timeouts(ctx context.Context, probes, waiting []Caller) error {
	reconnects := r.reconnectCount()
	first := reconnects()
	window := r.cfg.Duration / time.Duration(2*r.cfg.Rounds)
	t := &r.waits
	t.firstLoaded = window
	loadedPhase := func(time.Duration) int {
		if t.loaded.Load() {
			return 1
		}
		return 0
	}
	r.probePhases(ctx, probes, loadedPhase, func() {
		timer := time.NewTimer(time.Hour)
		defer timer.Stop()
		for round := range r.cfg.Rounds {
			from := r.start.Add(time.Duration(2*round+1) * window)
			timer.Reset(time.Until(from))
			select {
			case <-timer.C:
			case <-ctx.Done():
				return
			}
			before, began := reconnects(), time.Now()
			t.loaded.Store(true)
			r.waitingWindow(ctx, len(probes), waiting, from.Add(window))
			t.loaded.Store(false)
			t.loadedReconnects += reconnects() - before
			t.loadedTime += time.Since(began)
		}
	})
	t.baselineReconnects = reconnects() - first - t.loadedReconnects
	return nil
}

// waitingWindow runs the timeouts workload's waiting callers back to back
// until until, and returns when the last of their cycles has ended.
func (r *run) waitingWindow(ctx context.Context, firstWorker int, waiting []Caller, until time.Time) {
	var callers sync.WaitGroup
	for i, c := range waiting {
		worker := firstWorker + i
		callers.Go(func() {
			rng := r.newRand(worker)
			for range maxCallerCycles {
				now := time.Now()
				if !now.Before(until) || ctx.Err() != nil {
					return
				}
				r.cycle(ctx, c, worker, streams+pressureStream, r.pickKey(rng), r.cfg.Wait, r.cfg.Hold, now)
			}
		})
	}
	callers.Wait()
}

// probeHalves runs the probe stream of the workloads measured in two
// halves (keepalive): phase 0 before the half and phase 1 after it, while
// atHalf, started at the half unless ctx ends first, adds the load whose
// cost the second half shows. It returns when both are done.
func (r *run) probeHalves(ctx context.Context, probes []Caller, atHalf func()) {
	half := r.cfg.Duration / timeoutsPhases
	halfOf := func(at time.Duration) int {
		if at < half {
			return 0
		}
		return 1
	}
	r.probePhases(ctx, probes, halfOf, func() {
		start := time.NewTimer(time.Until(r.start.Add(half)))
		defer start.Stop()
		select {
		case <-start.C:
		case <-ctx.Done():
			return
		}
		atHalf()
	})
}

// startProbes starts, in wg, one goroutine per probe caller that runs an
// uncontended cycle for each arrival on the channel it returns, on a key
// from pick held for hold, until the channel is closed.
func (r *run) startProbes(ctx context.Context, wg *sync.WaitGroup, probes []Caller, pick func(*mrand.Rand) string, hold time.Duration) chan arrival {
	arrivals := make(chan arrival, len(probes))
	for i, c := range probes {
		wg.Go(func() {
			rng := r.newRand(i)
			for arr := range arrivals {
				r.cycle(ctx, c, i, streams*arr.phase+probeStream, pick(rng), 0, hold, arr.at)
			}
		})
	}
	return arrivals
}

// probePhases runs the probe stream of the workloads measured in phases
// (timeouts, keepalive): uncontended cycles at Config.Rate throughout,
// each recorded in the phase phaseAt gives its scheduled instant, while
// load, on a goroutine of its own, adds the load whose cost the phase 1
// probes show. It returns when both are done.
func (r *run) probePhases(ctx context.Context, probes []Caller, phaseAt func(at time.Duration) int, load func()) {
	var wg sync.WaitGroup
	probeArrivals := r.startProbes(ctx, &wg, probes, r.probeKey, 0)
	wg.Go(load)
	r.schedule(ctx, func(at time.Duration) (float64, int, time.Duration) {
		return r.cfg.Rate, phaseAt(at), r.cfg.Duration
	}, probeArrivals, &r.lag)
	wg.Wait()
}

// reconnectCounter is a target whose client reconnects by itself and
// counts it: lockd's official client.
type reconnectCounter interface{ Reconnects() uint64 }

// reconnectCount reads the target's reconnect count; it always reads 0
// for a target that does not count them.
func (r *run) reconnectCount() func() uint64 {
	if rc, ok := r.target.(reconnectCounter); ok {
		return rc.Reconnects
	}
	return func() uint64 { return 0 }
}

// startProgress prints a line every ProgressEvery until the returned
// function is called.
func (r *run) startProgress() (stop func()) {
	if r.cfg.Progress == nil {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(r.cfg.ProgressEvery)
		defer tick.Stop()
		var lastCycles uint64
		last := r.start
		for {
			select {
			case <-done:
				return
			case now := <-tick.C:
				cycles := r.rec.cycles.Load()
				rate := float64(cycles-lastCycles) / now.Sub(last).Seconds()
				lastCycles, last = cycles, now
				fmt.Fprintf(r.cfg.Progress, "  %5.1fs  %s  cycles %d (%.0f/s)  A %d  T %d  B %d  R %d  N %d  W %d  I %d  errors %d  drops %d\n",
					now.Sub(r.start).Seconds(), r.cfg.Workload, cycles, rate,
					r.rec.totals[Acquired].Load(), r.rec.totals[TimedOut].Load(), r.rec.totals[Busy].Load(),
					r.rec.totals[Released].Load(), r.rec.totals[NotHeld].Load(),
					r.rec.totals[WaitElapsed].Load(), r.rec.totals[Indeterminate].Load(), r.rec.totals[Failed].Load(),
					r.rec.drops.Load())
			}
		}
	})
	return func() { close(done); wg.Wait() }
}
