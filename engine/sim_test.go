package engine

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

var simSeed = flag.Uint64("sim.seed", 0, "run TestSimulation with this seed only")

// TestSimulation drives the engine with random calls on a FakeClock and
// checks every answer against a model: mutual exclusion by validity
// intervals (a grant never starts before the previous holder's lease ended
// or it released), FIFO grant order, waits ended exactly when due, tokens
// strictly increasing per key, exactly-once resolution, and the counters.
func TestSimulation(t *testing.T) {
	seeds := []uint64{1, 2, 3, 4}
	if *simSeed != 0 {
		seeds = []uint64{*simSeed}
	}
	for _, seed := range seeds {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			t.Parallel()
			if err := newSim(seed).run(50_000); err != nil {
				t.Fatalf("seed %d: %v\nreproduce: go test ./engine -run TestSimulation -sim.seed=%d", seed, err, seed)
			}
		})
	}
}

type simKey struct {
	tenant int
	name   string
}

type simWaiter struct {
	owner    uint64
	key      simKey
	arrived  time.Duration
	deadline time.Duration
	lease    time.Duration
	handle   *Wait
}

type simLock struct {
	token      uint64 // the last token granted
	validUntil time.Duration
	released   bool
	queue      []*simWaiter // pending, in arrival order
}

type sim struct {
	rng     *rand.Rand
	clock   *FakeClock
	e       *Engine
	ns      [2]Namespace
	limited bool // small limits: Busy is a valid answer

	locks     map[simKey]*simLock
	pending   []*simWaiter // by owner, for deterministic picks
	finished  []*Wait      // handles already resolved or cancelled
	nextOwner uint64
	refused   uint64
	resolved  []resolution // filled by Resolve during an engine call
}

func newSim(seed uint64) *sim {
	rng := rand.New(rand.NewPCG(seed, seed))
	clock := NewFakeClock()
	cfg := Config{Shards: 4, Clock: clock}
	// Even seeds run with small limits, alternating which gate binds first.
	limited := seed%2 == 0
	switch seed % 4 {
	case 0:
		cfg.MaxKeys, cfg.MaxWaiters, cfg.MaxInflight = 8, 16, 12
	case 2:
		cfg.MaxKeys, cfg.MaxWaiters, cfg.MaxInflight = 8, 12, 16
	}
	e := New(cfg)
	return &sim{
		rng:     rng,
		clock:   clock,
		e:       e,
		ns:      [2]Namespace{e.Namespace("t0"), e.Namespace("t1")},
		limited: limited,
		locks:   make(map[simKey]*simLock),
	}
}

func (s *sim) Resolve(owner uint64, r Result) {
	s.resolved = append(s.resolved, resolution{owner, r})
}

func (s *sim) run(steps int) error {
	for i := range steps {
		if err := s.step(); err != nil {
			return fmt.Errorf("step %d at %v: %w", i, s.clock.Now(), err)
		}
	}
	return s.shutdown()
}

func (s *sim) step() error {
	var err error
	switch p := s.rng.IntN(100); {
	case p < 40:
		err = s.acquire()
	case p < 65:
		err = s.release()
	case p < 72:
		err = s.cancel()
	case p < 88:
		steps := []time.Duration{0, 250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second}
		s.clock.Advance(steps[s.rng.IntN(len(steps))])
	case p < 98:
		err = s.tick()
	default:
		s.e.Sweep()
		if len(s.resolved) != 0 {
			err = fmt.Errorf("sweep resolved %v", s.resolved)
		}
	}
	if err != nil {
		return err
	}
	return s.checkInvariants()
}

func (s *sim) pickKey() (simKey, Namespace, []byte) {
	k := simKey{s.rng.IntN(2), fmt.Sprint("key", s.rng.IntN(6))}
	return k, s.ns[k.tenant], []byte(k.name)
}

func (s *sim) lock(k simKey) *simLock {
	l := s.locks[k]
	if l == nil {
		l = &simLock{}
		s.locks[k] = l
	}
	return l
}

func (s *sim) held(l *simLock) bool {
	return l.token != 0 && !l.released && s.clock.Now() < l.validUntil
}

// simAcquire is one randomly drawn acquire.
type simAcquire struct {
	k           simKey
	ns          Namespace
	key         []byte
	owner       uint64
	lease, wait time.Duration
}

func (s *sim) drawAcquire() simAcquire {
	k, ns, key := s.pickKey()
	a := simAcquire{k: k, ns: ns, key: key, lease: time.Duration(1+s.rng.IntN(6)) * time.Second}
	if s.rng.IntN(3) > 0 {
		a.wait = time.Duration(1+s.rng.IntN(8)) * time.Second
	}
	s.nextOwner++
	a.owner = s.nextOwner
	return a
}

func (s *sim) acquire() error {
	a := s.drawAcquire()
	r, h := s.e.Acquire(a.ns, a.key, a.owner, a.lease, a.wait, s)
	return s.checkAcquire(a, r, h)
}

// checkAcquire checks the engine's immediate answer to a against the lock
// model, recording a grant or a queued waiter.
func (s *sim) checkAcquire(a simAcquire, r Result, h *Wait) error {
	// A due handoff runs inside Acquire, before the answer.
	if err := s.absorb(); err != nil {
		return err
	}
	k, l, now := a.k, s.lock(a.k), s.clock.Now()
	if (h != nil) != (r.Outcome == Queued) {
		return fmt.Errorf("acquire %v: handle %v with %v", k, h, r.Outcome)
	}
	switch r.Outcome {
	case Granted:
		if len(l.queue) > 0 {
			return fmt.Errorf("acquire %v granted past %d waiters", k, len(l.queue))
		}
		if r.Waited != 0 {
			return fmt.Errorf("immediate grant waited %v", r.Waited)
		}
		return s.granted(k, r, a.lease)
	case Queued:
		if !s.held(l) || a.wait == 0 {
			return fmt.Errorf("acquire %v (wait %v) queued on a lock that is not held", k, a.wait)
		}
		w := &simWaiter{owner: a.owner, key: k, arrived: now, deadline: now + a.wait, lease: a.lease, handle: h}
		l.queue = append(l.queue, w)
		s.pending = append(s.pending, w)
		return nil
	case TimedOut:
		if !s.held(l) || a.wait != 0 {
			return fmt.Errorf("acquire %v (wait %v) timed out on a lock that is not held", k, a.wait)
		}
		return nil
	case Busy:
		if !s.limited {
			return fmt.Errorf("acquire %v busy without limits", k)
		}
		s.refused++
		return nil
	}
	return fmt.Errorf("acquire %v: unexpected %v", k, r.Outcome)
}

func (s *sim) release() error {
	k, ns, key := s.pickKey()
	l := s.lock(k)
	token := l.token
	switch s.rng.IntN(5) {
	case 0:
		token--
	case 1:
		token = s.rng.Uint64N(l.token + 1)
	}
	want := NotHeld
	if token != 0 && token == l.token && s.held(l) {
		want = Released
	}
	r := s.e.Release(ns, key, token)
	if r.Outcome != want {
		return fmt.Errorf("release %v token %d (current %d, valid until %v, released %v) = %v, want %v",
			k, token, l.token, l.validUntil, l.released, r.Outcome, want)
	}
	if r.Outcome == Released {
		l.released, l.validUntil = true, s.clock.Now()
	}
	return s.absorb()
}

func (s *sim) cancel() error {
	if len(s.finished) > 0 && s.rng.IntN(4) == 0 {
		if s.e.Cancel(s.finished[s.rng.IntN(len(s.finished))]) {
			return fmt.Errorf("cancel of a finished wait returned true")
		}
		return nil
	}
	if len(s.pending) == 0 {
		return nil
	}
	w := s.pending[s.rng.IntN(len(s.pending))]
	if !s.e.Cancel(w.handle) {
		return fmt.Errorf("cancel of pending waiter %d returned false", w.owner)
	}
	s.finish(w)
	return nil
}

func (s *sim) tick() error {
	s.e.Tick()
	if err := s.absorb(); err != nil {
		return err
	}
	now := s.clock.Now()
	for _, w := range s.pending {
		if w.deadline <= now {
			return fmt.Errorf("waiter %d still pending after its deadline %v", w.owner, w.deadline)
		}
	}
	for k, l := range s.locks {
		if len(l.queue) > 0 && !s.held(l) {
			return fmt.Errorf("key %v has waiters but its lease ended at %v", k, l.validUntil)
		}
	}
	return nil
}

// absorb checks the resolutions the last engine call made, in order.
func (s *sim) absorb() error {
	got := s.resolved
	s.resolved = nil
	now := s.clock.Now()
	for _, res := range got {
		i := slices.IndexFunc(s.pending, func(w *simWaiter) bool { return w.owner == res.owner })
		if i < 0 {
			return fmt.Errorf("owner %d resolved %v but it is not pending", res.owner, res.r)
		}
		w := s.pending[i]
		l := s.locks[w.key]
		switch res.r.Outcome {
		case Granted:
			if l.queue[0] != w {
				return fmt.Errorf("FIFO: owner %d granted behind owner %d", w.owner, l.queue[0].owner)
			}
			if now >= w.deadline {
				return fmt.Errorf("owner %d granted at %v after its deadline %v", w.owner, now, w.deadline)
			}
			if res.r.Waited != now-w.arrived {
				return fmt.Errorf("owner %d waited %v, want %v", w.owner, res.r.Waited, now-w.arrived)
			}
			if err := s.granted(w.key, res.r, w.lease); err != nil {
				return err
			}
		case TimedOut:
			if now < w.deadline {
				return fmt.Errorf("owner %d timed out at %v before its deadline %v", w.owner, now, w.deadline)
			}
		default:
			return fmt.Errorf("owner %d resolved with %v", w.owner, res.r.Outcome)
		}
		s.finish(w)
	}
	return nil
}

func (s *sim) granted(k simKey, r Result, lease time.Duration) error {
	l := s.lock(k)
	now := s.clock.Now()
	if r.Token <= l.token {
		return fmt.Errorf("key %v: token %d after %d", k, r.Token, l.token)
	}
	if l.token != 0 && now < l.validUntil {
		return fmt.Errorf("mutual exclusion: key %v granted at %v while token %d is valid until %v", k, now, l.token, l.validUntil)
	}
	l.token, l.validUntil, l.released = r.Token, now+lease, false
	return nil
}

func (s *sim) finish(w *simWaiter) {
	l := s.locks[w.key]
	l.queue = slices.DeleteFunc(l.queue, func(x *simWaiter) bool { return x == w })
	s.pending = slices.DeleteFunc(s.pending, func(x *simWaiter) bool { return x == w })
	if len(s.finished) == 16 {
		s.finished = s.finished[1:]
	}
	s.finished = append(s.finished, w.handle)
}

func (s *sim) checkInvariants() error {
	st := s.e.Stats()
	if st.Waiters != len(s.pending) || st.Inflight != len(s.pending) {
		return fmt.Errorf("stats waiters=%d inflight=%d, model has %d pending", st.Waiters, st.Inflight, len(s.pending))
	}
	if refused := st.KeysGate.Refused + st.WaitersGate.Refused + st.InflightGate.Refused; refused != s.refused {
		return fmt.Errorf("gates refused %d, model saw %d Busy", refused, s.refused)
	}
	heldKeys := 0
	for k, l := range s.locks {
		if s.held(l) {
			heldKeys++
		}
		if len(l.queue) > 0 && l.released {
			return fmt.Errorf("key %v released with waiters left", k)
		}
	}
	if st.Keys < heldKeys || st.Keys > st.KeysGate.Limit {
		return fmt.Errorf("stats keys=%d, model holds %d, limit %d", st.Keys, heldKeys, st.KeysGate.Limit)
	}
	return nil
}

func (s *sim) shutdown() error {
	s.e.Shutdown()
	waiting := make(map[uint64]bool, len(s.pending))
	for _, w := range s.pending {
		waiting[w.owner] = true
	}
	for _, res := range s.resolved {
		if res.r.Outcome != ShuttingDown || !waiting[res.owner] {
			return fmt.Errorf("shutdown resolved owner %d with %v", res.owner, res.r)
		}
		delete(waiting, res.owner)
	}
	if len(waiting) != 0 {
		return fmt.Errorf("shutdown left %d waiters unresolved", len(waiting))
	}
	if st := s.e.Stats(); st.Waiters != 0 || st.Inflight != 0 {
		return fmt.Errorf("after shutdown: %d waiters, %d in flight", st.Waiters, st.Inflight)
	}
	return nil
}
