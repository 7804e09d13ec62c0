package bench

import (
	"context"
	"errors"
	"fmt"
	"github.com/lockd/lockd/internal/defaults"
	"io"
	"os"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/lockd/lockd/client"
)

// Failover is the workload that starts a 3-node cluster of its own, runs
// contended lock traffic through it, and hits one node with a fault in
// the middle of the run: how long do keys go without a grant, and what do
// callers see?
const Failover = "failover"

// Faults the failover workload can inflict on its victim node.
const (
	// FaultKill is kill -9, the node started again FailoverConfig.Down
	// after the fault.
	FaultKill = "kill"
	// FaultTerm is SIGTERM, a graceful stop; the node is started again
	// once it has exited, and no sooner than Down after the fault.
	FaultTerm = "term"
	// FaultStop is SIGSTOP, the node frozen for FailoverConfig.Frozen and
	// then continued with SIGCONT.
	FaultStop = "stop"
)

// Victims: which node the fault hits.
const (
	VictimLeader   = "leader"   // the leader of the cluster (lockd: of its only group)
	VictimFollower = "follower" // another node
)

// Systems the failover workload can start.
const (
	FailoverLockd = SchemeLockd
	FailoverEtcd  = SchemeEtcd
)

// Defaults of the failover workload: the shape of issue-sized reports of
// a node's loss under contended traffic with ordinary leases.
const (
	DefaultFailoverDuration = 30 * time.Second
	DefaultFailoverFaultAt  = 8 * time.Second
	DefaultFailoverDown     = 2 * time.Second
	DefaultFailoverFrozen   = 3 * time.Second
	DefaultFailoverCallers  = 24
	DefaultFailoverKeys     = 8
	DefaultFailoverLease    = 30 * time.Second
	DefaultFailoverWait     = 5 * time.Second
	DefaultFailoverHold     = 5 * time.Millisecond
	// DefaultFailoverWindow is the span before and after the fault whose
	// grants/s are compared.
	DefaultFailoverWindow = 10 * time.Second
)

// termGrace bounds a SIGTERM'd node's drain: past it the node is killed
// and the result says so.
const termGrace = 30 * time.Second

// FailoverConfig is one failover run. Zero fields take the defaults.
type FailoverConfig struct {
	// System is FailoverLockd or FailoverEtcd; Bin its server's binary.
	System string
	Bin    string
	Fault  string
	Victim string
	// Duration is the whole run; FaultAt when, from its start, the fault
	// hits; Down how long a killed or terminated node stays down; Frozen
	// how long a stopped one stays frozen.
	Duration time.Duration
	FaultAt  time.Duration
	Down     time.Duration
	Frozen   time.Duration
	// Callers each have a client of their own with all three nodes'
	// addresses, caller i's list starting at node i%3; each cycles over
	// Keys keys: acquire with Lease and Wait, hold Hold, release.
	Callers int
	Keys    int
	Lease   time.Duration
	Wait    time.Duration
	Hold    time.Duration
	// Window is the span after the fault whose grants/s are compared
	// with those of as long a span before it; each is cut to what the run
	// has on its side of the fault (8 s before it by default).
	Window time.Duration
	// PeerDelay, when set, puts a relay in front of every node's peer
	// (Raft) port that delays each byte PeerDelay ± PeerJitter each way
	// (delayRelay); the nodes' clients reach them directly.
	PeerDelay  time.Duration
	PeerJitter time.Duration
	// NodeFlags are more command-line flags for every node started (a
	// Raft tick that fits PeerDelay, say).
	NodeFlags []string
	// Dir is where the cluster's data directories and logs go, in a
	// directory of their own removed at the end (default: the system's
	// temporary directory). It should be on disk: both systems fsync.
	Dir      string
	Progress io.Writer
}

func (cfg *FailoverConfig) applyDefaults() error {
	cfg.Duration = defaults.Or(cfg.Duration, DefaultFailoverDuration)
	cfg.FaultAt = defaults.Or(cfg.FaultAt, DefaultFailoverFaultAt)
	cfg.Down = defaults.Or(cfg.Down, DefaultFailoverDown)
	cfg.Frozen = defaults.Or(cfg.Frozen, DefaultFailoverFrozen)
	cfg.Lease = defaults.Or(cfg.Lease, DefaultFailoverLease)
	cfg.Wait = defaults.Or(cfg.Wait, DefaultFailoverWait)
	cfg.Hold = defaults.Or(cfg.Hold, DefaultFailoverHold)
	cfg.Window = defaults.Or(cfg.Window, DefaultFailoverWindow)
	cfg.Callers = defaults.Or(cfg.Callers, DefaultFailoverCallers)
	cfg.Keys = defaults.Or(cfg.Keys, DefaultFailoverKeys)
	switch {
	case cfg.System != FailoverLockd && cfg.System != FailoverEtcd:
		return fmt.Errorf("failover: system %q (want %s or %s)", cfg.System, FailoverLockd, FailoverEtcd)
	case cfg.Bin == "":
		return fmt.Errorf("failover: no %s binary", cfg.System)
	case cfg.Fault != FaultKill && cfg.Fault != FaultTerm && cfg.Fault != FaultStop:
		return fmt.Errorf("failover: fault %q (want %s, %s or %s)", cfg.Fault, FaultKill, FaultTerm, FaultStop)
	case cfg.Victim != VictimLeader && cfg.Victim != VictimFollower:
		return fmt.Errorf("failover: victim %q (want %s or %s)", cfg.Victim, VictimLeader, VictimFollower)
	case cfg.PeerDelay < 0 || cfg.PeerJitter < 0 || cfg.PeerJitter > cfg.PeerDelay:
		return fmt.Errorf("failover: peer delay %v ± %v (want a jitter within the delay)", cfg.PeerDelay, cfg.PeerJitter)
	case cfg.FaultAt >= cfg.Duration:
		return fmt.Errorf("failover: the fault at %v does not fall within the %v run", cfg.FaultAt, cfg.Duration)
	}
	return nil
}

// FailoverResult is what the failover workload adds to a Result. Times
// are in seconds; those named ...AtS count from the run's start.
type FailoverResult struct {
	System string `json:"system"`
	Fault  string `json:"fault"`
	Victim string `json:"victim"`
	// VictimNode is the node hit (1-3); LeaderNode the leader just before.
	VictimNode int     `json:"victim_node"`
	LeaderNode int     `json:"leader_node"`
	FaultAtS   float64 `json:"fault_at_s"`
	// BackAtS is when the victim ran again: started again after kill or
	// term, continued after stop. TermExitS is how long a SIGTERM'd node
	// took to exit; TermKilled says it had not within its grace and was
	// killed.
	BackAtS    float64 `json:"back_at_s"`
	TermExitS  float64 `json:"term_exit_s,omitempty"`
	TermKilled bool    `json:"term_killed,omitempty"`
	LeaseS     float64 `json:"lease_s"`
	WaitS      float64 `json:"wait_s"`
	HoldS      float64 `json:"hold_s"`
	Keys       int     `json:"keys"`
	// PeerDelayS and PeerJitterS are FailoverConfig.PeerDelay and
	// PeerJitter.
	PeerDelayS  float64 `json:"peer_delay_s,omitempty"`
	PeerJitterS float64 `json:"peer_jitter_s,omitempty"`
	// LongestGapS is the longest time any key went without a grant,
	// counted from the fault (a gap open at the fault counts from it)
	// to the key's next grant or the end of the run; LongestGapKey the
	// key (0-based) and LongestGapAtS where that gap began.
	LongestGapS   float64 `json:"longest_gap_s"`
	LongestGapKey int     `json:"longest_gap_key"`
	LongestGapAtS float64 `json:"longest_gap_at_s"`
	// GrantsPerSBefore is the grants/s in the BeforeS before the fault,
	// GrantsPerSAfter in the AfterS after it; RateRatio is After ÷ Before.
	BeforeS          float64 `json:"before_s"`
	AfterS           float64 `json:"after_s"`
	GrantsPerSBefore float64 `json:"grants_per_s_before"`
	GrantsPerSAfter  float64 `json:"grants_per_s_after"`
	RateRatio        float64 `json:"rate_after_over_before"`
	// GrantsAfter is the grants in each half second of the AfterS after
	// the fault: where the rate went, not only how much of it was lost.
	GrantsAfter []int `json:"grants_after_by_half_second"`
	// Acquires and Releases count the outcomes of the whole run by kind;
	// AtFault those of the requests in flight when the fault hit.
	Acquires FailoverKinds `json:"acquires"`
	Releases FailoverKinds `json:"releases"`
	AtFault  FailoverKinds `json:"at_fault"`
}

// FailoverKinds counts outcomes by kind. Unavailable is a definite
// refusal that names the node's state (lockd: E unavailable, E
// shutting_down, or a request no session could send); Indeterminate is
// any outcome the client could not settle (lockd's W and I); Other every
// other error (for etcd, whose client does not tell these apart, every
// error).
type FailoverKinds struct {
	Granted       uint64 `json:"granted,omitempty"`
	Released      uint64 `json:"released,omitempty"`
	NotHeld       uint64 `json:"not_held,omitempty"`
	Timeout       uint64 `json:"timeout"`
	Busy          uint64 `json:"busy"`
	Indeterminate uint64 `json:"indeterminate"`
	Unavailable   uint64 `json:"unavailable"`
	Other         uint64 `json:"other_errors"`
}

func (k *FailoverKinds) add(out Outcome, err error) {
	switch out {
	case Acquired:
		k.Granted++
	case Released:
		k.Released++
	case NotHeld:
		k.NotHeld++
	case TimedOut:
		k.Timeout++
	case Busy:
		k.Busy++
	case WaitElapsed, Indeterminate:
		k.Indeterminate++
	default:
		if errors.Is(err, client.ErrUnavailable) || errors.Is(err, client.ErrShuttingDown) || errors.Is(err, client.ErrNotConnected) {
			k.Unavailable++
		} else {
			k.Other++
		}
	}
}

func (k *FailoverKinds) merge(o FailoverKinds) {
	k.Granted += o.Granted
	k.Released += o.Released
	k.NotHeld += o.NotHeld
	k.Timeout += o.Timeout
	k.Busy += o.Busy
	k.Indeterminate += o.Indeterminate
	k.Unavailable += o.Unavailable
	k.Other += o.Other
}

// grantEvent is one grant: its key and when the caller had it.
type grantEvent struct {
	key int
	at  time.Time
}

// failoverCaller is what one caller saw; it is merged at the end.
type failoverCaller struct {
	grants             []grantEvent
	acquires, releases FailoverKinds
	atFault            FailoverKinds
}

// failoverRun is one run of the failover workload under way.
type failoverRun struct {
	cfg     FailoverConfig
	cluster failoverCluster
	rec     *recorder
	start   time.Time
	end     time.Time

	faultMu sync.Mutex
	faultAt time.Time // zero until the fault has hit
	res     FailoverResult
}

// RunFailover starts a 3-node cluster of cfg.System in a temporary
// directory, runs the failover workload through it with the fault cfg
// names, stops the cluster and returns what the run measured.
func RunFailover(ctx context.Context, cfg FailoverConfig) (*Result, error) {
	if err := cfg.applyDefaults(); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(cfg.Dir, "lockbench-failover-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	var cluster failoverCluster
	link := peerLink{delay: cfg.PeerDelay, jitter: cfg.PeerJitter}
	if cfg.System == FailoverLockd {
		cluster, err = startLockdCluster(ctx, cfg.Bin, dir, link, cfg.NodeFlags)
	} else {
		cluster, err = startEtcdCluster(ctx, cfg.Bin, dir, link, cfg.NodeFlags)
	}
	if err != nil {
		return nil, err
	}
	defer stopAll(cluster)
	r := &failoverRun{cfg: cfg, cluster: cluster}
	res, err := r.execute(ctx)
	if err != nil {
		return nil, err
	}
	res.Target = fmt.Sprintf("%s (%s: %s of the %s)", cluster.describe(), Failover, faultName(cfg.Fault), cfg.Victim)
	return res, nil
}

func faultName(fault string) string {
	switch fault {
	case FaultKill:
		return "kill -9"
	case FaultTerm:
		return "SIGTERM"
	}
	return "SIGSTOP"
}

func (r *failoverRun) execute(ctx context.Context) (*Result, error) {
	cfg := r.cfg
	callers := make([]Caller, 0, cfg.Callers)
	var closers []func()
	defer func() {
		for _, c := range closers {
			c()
		}
	}()
	for i := range cfg.Callers {
		c, closer, err := r.cluster.newCaller(ctx, i, cfg.Lease)
		if err != nil {
			return nil, fmt.Errorf("caller %d: %w", i, err)
		}
		callers, closers = append(callers, c), append(closers, closer)
	}
	// A warm-up cycle per caller pays for connections and sessions
	// before the clock starts, and proves the cluster serves.
	if err := warmUpKeys(ctx, callers, "failover/warm/", answerSlack); err != nil {
		return nil, err
	}

	longest := cfg.Wait + answerSlack
	ctx, cancel := context.WithTimeout(ctx, cfg.Duration+longest+termGrace)
	defer cancel()
	m := startMeter(procRoot, nil)
	r.start = time.Now()
	r.end = r.start.Add(cfg.Duration)
	r.rec = newRecorder(r.start, 1, cfg.Duration+longest, false)
	seen := make([]failoverCaller, len(callers))
	faultDone := make(chan error, 1)
	go func() { faultDone <- r.inflict(ctx) }()
	var wg sync.WaitGroup
	for i, c := range callers {
		wg.Go(func() { r.caller(ctx, i, c, &seen[i]) })
	}
	stopProgress := r.progress()
	wg.Wait()
	stopProgress()
	elapsed := time.Since(r.start)
	self, _, notes := m.stop()
	if err := <-faultDone; err != nil {
		return nil, err
	}
	return r.result(elapsed, seen, self, notes), nil
}

// warmUpKeys runs one acquire (waiting up to wait) and release per caller
// on a key of its own, prefix and the caller's number.
func warmUpKeys(ctx context.Context, callers []Caller, prefix string, wait time.Duration) error {
	errs := make([]error, len(callers))
	var wg sync.WaitGroup
	for i, c := range callers {
		wg.Go(func() {
			key := prefix + strconv.Itoa(i)
			if out, err := c.Acquire(ctx, key, wait); out != Acquired {
				errs[i] = fmt.Errorf("warm-up acquire of %q: %v %v", key, out, err)
				return
			}
			if out, err := c.Release(ctx); !out.endsCycle() {
				errs[i] = fmt.Errorf("warm-up release of %q: %v %v", key, out, err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// caller runs caller i's cycles until the run ends: key after key in
// turn, starting at key i%Keys.
func (r *failoverRun) caller(ctx context.Context, i int, c Caller, seen *failoverCaller) {
	for n := 0; n < maxCallerCycles; n++ {
		sent := time.Now()
		if !sent.Before(r.end) || ctx.Err() != nil {
			return
		}
		key := (i + n) % r.cfg.Keys
		out, err := c.Acquire(ctx, "failover/"+strconv.Itoa(key), r.cfg.Wait)
		got := time.Now()
		r.rec.record(i, 0, out, sent, sent, got, err)
		seen.acquires.add(out, err)
		r.countAtFault(seen, sent, got, out, err)
		if out != Acquired {
			continue
		}
		seen.grants = append(seen.grants, grantEvent{key: key, at: got})
		time.Sleep(r.cfg.Hold)
		sent = time.Now()
		out, err = c.Release(ctx)
		got = time.Now()
		r.rec.record(i, 0, out, sent, sent, got, err)
		seen.releases.add(out, err)
		r.countAtFault(seen, sent, got, out, err)
		if out.endsCycle() {
			r.rec.cycles.Add(1)
		}
	}
}

// countAtFault counts the outcome of a request that was in flight when
// the fault hit.
func (r *failoverRun) countAtFault(seen *failoverCaller, sent, got time.Time, out Outcome, err error) {
	r.faultMu.Lock()
	at := r.faultAt
	r.faultMu.Unlock()
	if !at.IsZero() && sent.Before(at) && !got.Before(at) {
		seen.atFault.add(out, err)
	}
}

// inflict waits for the fault's instant, hits the victim, and brings it
// back.
func (r *failoverRun) inflict(ctx context.Context) error {
	cfg := r.cfg
	if err := sleepUntil(ctx, r.start.Add(cfg.FaultAt)); err != nil {
		return err
	}
	leader, err := r.cluster.leader(ctx)
	if err != nil {
		return fmt.Errorf("failover: finding the leader at the fault: %w", err)
	}
	victim := leader
	if cfg.Victim == VictimFollower {
		victim = (leader + 1) % len(r.cluster.nodes())
	}
	p := r.cluster.nodes()[victim]
	sig := map[string]syscall.Signal{FaultKill: syscall.SIGKILL, FaultTerm: syscall.SIGTERM, FaultStop: syscall.SIGSTOP}[cfg.Fault]
	r.faultMu.Lock()
	r.faultAt = time.Now()
	faultAt := r.faultAt
	r.faultMu.Unlock()
	if err := p.signal(sig); err != nil {
		return fmt.Errorf("failover: %s node %d: %w", faultName(cfg.Fault), victim+1, err)
	}
	res := &r.res
	res.VictimNode, res.LeaderNode = victim+1, leader+1
	res.FaultAtS = faultAt.Sub(r.start).Seconds()
	switch cfg.Fault {
	case FaultStop:
		if err := sleepUntil(ctx, faultAt.Add(cfg.Frozen)); err != nil {
			p.kill()
			return err
		}
		if err := p.signal(syscall.SIGCONT); err != nil {
			return fmt.Errorf("failover: SIGCONT node %d: %w", victim+1, err)
		}
	default:
		exited := p.awaitExit(termGrace)
		if cfg.Fault == FaultTerm {
			res.TermExitS, res.TermKilled = time.Since(faultAt).Seconds(), !exited
		}
		if err := sleepUntil(ctx, faultAt.Add(cfg.Down)); err != nil {
			return err
		}
		if err := p.start(); err != nil {
			return fmt.Errorf("failover: starting node %d again: %w", victim+1, err)
		}
	}
	res.BackAtS = time.Since(r.start).Seconds()
	return nil
}

// sleepUntil sleeps until t or until ctx ends, whichever comes first.
func sleepUntil(ctx context.Context, t time.Time) error {
	timer := time.NewTimer(time.Until(t))
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// progress prints a line every ProgressEvery-like second until stopped.
func (r *failoverRun) progress() (stop func()) {
	if r.cfg.Progress == nil {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case now := <-tick.C:
				fmt.Fprintf(r.cfg.Progress, "  %5.1fs  failover  cycles %d  A %d  T %d  B %d  W %d  I %d  errors %d\n",
					now.Sub(r.start).Seconds(), r.rec.cycles.Load(), r.rec.totals[Acquired].Load(), r.rec.totals[TimedOut].Load(),
					r.rec.totals[Busy].Load(), r.rec.totals[WaitElapsed].Load(), r.rec.totals[Indeterminate].Load(), r.rec.totals[Failed].Load())
			}
		}
	})
	return func() { close(done); wg.Wait() }
}

func (r *failoverRun) result(elapsed time.Duration, seen []failoverCaller, self usage, notes []string) *Result {
	cfg := r.cfg
	all := r.rec.merged(sinceScheduled, 0)
	res := &Result{
		Kind:       cfg.System,
		Workload:   Failover,
		Mode:       "closed",
		Callers:    cfg.Callers,
		Conns:      cfg.Callers,
		Transport:  fmt.Sprintf("a client per caller, each given the 3 nodes (caller i's list starting at node i%%3), lease %v, wait %v, hold %v", cfg.Lease, cfg.Wait, cfg.Hold),
		Keys:       cfg.Keys,
		DurationS:  elapsed.Seconds(),
		Cycles:     r.rec.cycles.Load(),
		CyclesPerS: float64(r.rec.cycles.Load()) / elapsed.Seconds(),
		Requests:   requests(all),
		Errors:     all[Failed].Count(),
		Outcomes:   outcomeTable(all),
		Timeline:   timeline(r.rec.counts()),
		Notes:      notes,
	}
	if r.rec.firstErr != nil {
		res.FirstError = r.rec.firstErr.Error()
	}
	res.setUsage(self, usage{})
	f := r.res
	f.System, f.Fault, f.Victim, f.Keys = cfg.System, cfg.Fault, cfg.Victim, cfg.Keys
	f.LeaseS, f.WaitS, f.HoldS = cfg.Lease.Seconds(), cfg.Wait.Seconds(), cfg.Hold.Seconds()
	f.PeerDelayS, f.PeerJitterS = cfg.PeerDelay.Seconds(), cfg.PeerJitter.Seconds()
	var grants []grantEvent
	for _, s := range seen {
		grants = append(grants, s.grants...)
		f.Acquires.merge(s.acquires)
		f.Releases.merge(s.releases)
		f.AtFault.merge(s.atFault)
	}
	f.measureGaps(grants, cfg.Keys, r.start, r.faultAt, r.end)
	f.measureRates(grants, r.faultAt, min(cfg.Window, r.faultAt.Sub(r.start)), min(cfg.Window, r.end.Sub(r.faultAt)))
	res.Failover = &f
	return res
}

// measureGaps finds the longest time a key went without a grant from the
// fault on, up to the end of the run.
func (f *FailoverResult) measureGaps(grants []grantEvent, keys int, start, faultAt, end time.Time) {
	byKey := make([][]time.Time, keys)
	for _, g := range grants {
		byKey[g.key] = append(byKey[g.key], g.at)
	}
	for key, times := range byKey {
		slices.SortFunc(times, func(a, b time.Time) int { return a.Compare(b) })
		last := faultAt
		for _, at := range append(times, end) {
			if at.After(end) {
				at = end
			}
			if !at.After(last) {
				continue
			}
			if gap := at.Sub(last).Seconds(); gap > f.LongestGapS {
				f.LongestGapS, f.LongestGapKey, f.LongestGapAtS = gap, key, last.Sub(start).Seconds()
			}
			last = at
		}
	}
}

// measureRates compares the grants/s in the span before the fault with
// those in the span after it.
func (f *FailoverResult) measureRates(grants []grantEvent, faultAt time.Time, before, after time.Duration) {
	f.BeforeS, f.AfterS = before.Seconds(), after.Seconds()
	if before <= 0 || after <= 0 {
		return
	}
	var nBefore, nAfter int
	f.GrantsAfter = make([]int, (after+halfSecond-1)/halfSecond)
	for _, g := range grants {
		switch d := g.at.Sub(faultAt); {
		case d < 0 && d >= -before:
			nBefore++
		case d >= 0 && d < after:
			nAfter++
			f.GrantsAfter[d/halfSecond]++
		}
	}
	f.GrantsPerSBefore = float64(nBefore) / before.Seconds()
	f.GrantsPerSAfter = float64(nAfter) / after.Seconds()
	if f.GrantsPerSBefore > 0 {
		f.RateRatio = f.GrantsPerSAfter / f.GrantsPerSBefore
	}
}

const halfSecond = 500 * time.Millisecond

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// writeFailover prints what the failover workload measured.
func writeFailover(w io.Writer, f *FailoverResult) {
	fmt.Fprintf(w, "  failover: %s of node %d (the %s; leader was node %d) at %.1fs, running again at %.1fs",
		faultName(f.Fault), f.VictimNode, f.Victim, f.LeaderNode, f.FaultAtS, f.BackAtS)
	if f.Fault == FaultTerm {
		fmt.Fprintf(w, " (exited %.2fs after SIGTERM", f.TermExitS)
		if f.TermKilled {
			fmt.Fprintf(w, ", killed: it had not exited within %v", termGrace)
		}
		fmt.Fprintf(w, ")")
	}
	fmt.Fprintf(w, "; %d keys, lease %v, wait %v, hold %v", f.Keys, seconds(f.LeaseS), seconds(f.WaitS), seconds(f.HoldS))
	if f.PeerDelayS > 0 {
		fmt.Fprintf(w, "; %s", peerLink{delay: seconds(f.PeerDelayS), jitter: seconds(f.PeerJitterS)})
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "  longest a key went without a grant from the fault: %.2fs (key %d, from %.1fs)\n",
		f.LongestGapS, f.LongestGapKey, f.LongestGapAtS)
	fmt.Fprintf(w, "  grants/s %.0f in the %v before the fault, %.0f in the %v after: %.0f%%\n",
		f.GrantsPerSBefore, seconds(f.BeforeS).Round(time.Millisecond), f.GrantsPerSAfter, seconds(f.AfterS).Round(time.Millisecond), 100*f.RateRatio)
	fmt.Fprintf(w, "  grants in each half second after the fault:")
	for _, n := range f.GrantsAfter {
		fmt.Fprintf(w, " %d", n)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "  outcomes\tgranted\treleased\tnot held\ttimeout\tbusy\tindeterminate\tunavailable\tother errors\t\n")
	for _, row := range []struct {
		name string
		k    FailoverKinds
	}{{"acquires", f.Acquires}, {"releases", f.Releases}, {"in flight at the fault", f.AtFault}} {
		k := row.k
		fmt.Fprintf(tw, "  %s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t\n", row.name,
			k.Granted, k.Released, k.NotHeld, k.Timeout, k.Busy, k.Indeterminate, k.Unavailable, k.Other)
	}
	tw.Flush()
}
