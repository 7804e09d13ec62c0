package rulestest

import (
	"encoding/binary"
	"flag"
	"fmt"
	"hash"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/lockd/lockd/engine"
)

// The model check drives a wrapper with random calls from simulated
// clients and checks every answer against a model of the lock rules. Each
// client holds its own tokens and believes it holds a lock from the grant
// until grant + lease, and it misbehaves the ways real clients do: it
// renews its lease (KEEP), sometimes too late, pauses past its lease and
// releases late, loses a release (the lock is only freed by its lease),
// drops its connection (every queued acquire of that client is cancelled
// at once, its locks stay), or releases with a token it does not hold.
//
// The model keeps, per key, the server's side — the current token, its
// validity, the FIFO of queued acquires — and checks mutual exclusion by
// validity intervals (a grant never starts before the previous holder's
// lease ended or it released), FIFO grant order, waits granted before and
// timed out at their deadline, tokens strictly increasing per key and
// every queued acquire resolved exactly once. On the clients' side it
// checks that no two clients each hold a grant they believe valid on the
// same key at one instant, and that a client within its validity is never
// refused its release or renewal. A wrapper that also exposes an engine's
// counters (Instrumented) has them held to the model too.
//
// With an AbandonWrapper, half the clients have a session (SPEC §6a) and
// sometimes lose an acquire's answer: they abandon a grant they were
// given (and forget it), a queued acquire, or one that never arrived, and
// later send the lost acquire again. The model checks that an abandon
// releases exactly the requester's own unexpired grant, drops exactly its
// waiter, and that a tombstoned acquire is refused for TombstoneLife and
// only then served as any other.

var (
	modelSeed  = flag.Uint64("model.seed", 0, "run TestModelCheck with this seed only")
	modelSteps = flag.Int("model.steps", 0, "steps per seed of TestModelCheck (default: the package's)")
)

// ModelSeeds are the seeds TestModelCheck runs: odd seeds without limits,
// even ones with the small limits of SeedLimits (Busy is then a valid
// answer).
var ModelSeeds = []uint64{11, 12, 13, 14, 15, 16, 17, 18}

// Limits are the admission limits (SPEC §8) a model run gives its
// wrapper; zero is the wrapper's default.
type Limits struct{ MaxKeys, MaxWaiters, MaxInflight int }

// SeedLimits are the limits of seed's run: small ones for even seeds,
// alternating which gate binds first, none for odd seeds.
func SeedLimits(seed uint64) Limits {
	switch seed % 4 {
	case 0:
		return Limits{MaxKeys: 8, MaxWaiters: 16, MaxInflight: 12}
	case 2:
		return Limits{MaxKeys: 8, MaxWaiters: 12, MaxInflight: 16}
	}
	return Limits{}
}

// Instrumented is a wrapper with an engine's counters, sweep and
// shutdown; the model check then also checks that the counters match the
// model, that a sweep resolves nothing, and that shutdown answers every
// queued acquire ShuttingDown.
type Instrumented interface {
	Stats() engine.Stats
	Sweep()
	Shutdown()
}

// ModelRun is how a package runs the model check on its wrapper.
type ModelRun struct {
	Package    string // the package's directory, for the line that reproduces a failure
	Steps      int    // per seed
	ShortSteps int    // per seed with -short
	// New returns a fresh wrapper with the given limits.
	New func(Limits) Wrapper
}

// CheckModel runs the model check on every seed of ModelSeeds (or the one
// -model.seed names) as parallel subtests. A failure names its seed and
// step and the command that replays it.
func CheckModel(t *testing.T, run ModelRun) {
	t.Helper()
	steps := *modelSteps
	if steps == 0 {
		steps = run.Steps
		if testing.Short() {
			steps = run.ShortSteps
		}
	}
	seeds := ModelSeeds
	if *modelSeed != 0 {
		seeds = []uint64{*modelSeed}
	}
	for _, seed := range seeds {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			t.Parallel()
			m := NewModel(seed, run.New)
			start := time.Now()
			if err := m.Run(steps); err != nil {
				t.Fatalf("seed %d: %v\nreproduce: go test %s -run 'TestModelCheck$' -model.seed=%d -model.steps=%d",
					seed, err, run.Package, seed, steps)
			}
			t.Logf("seed %d: %d steps in %v, simulated %v; %s; trace %016x",
				seed, steps, time.Since(start).Round(time.Millisecond), m.now, m.counts, m.Trace())
			m.mustHaveExercised(t)
		})
	}
}

// ModelCounts counts what a run did, to show it tried every behaviour.
type ModelCounts struct {
	acquires, granted, queued, timedOut, busy    int
	released, notHeld, lateRefused, lostReleases int
	renewed, renewalsRefused                     int
	pauses, drops, cancelled                     int
	maxPending                                   int
	// SPEC §6a, with an AbandonWrapper only.
	abandonsReleased, abandonsDropped, abandonsNothing, tombstoneRefusals int
}

func (c ModelCounts) String() string {
	return fmt.Sprintf("acquires=%d granted=%d queued=%d timed_out=%d busy=%d released=%d not_held=%d "+
		"late_release_refused=%d lost_releases=%d renewed=%d renewals_refused=%d pauses=%d conn_drops=%d waits_cancelled=%d max_pending=%d "+
		"abandons_released=%d abandons_dropped=%d abandons_nothing=%d tombstone_refusals=%d",
		c.acquires, c.granted, c.queued, c.timedOut, c.busy, c.released, c.notHeld,
		c.lateRefused, c.lostReleases, c.renewed, c.renewalsRefused, c.pauses, c.drops, c.cancelled, c.maxPending,
		c.abandonsReleased, c.abandonsDropped, c.abandonsNothing, c.tombstoneRefusals)
}

// mustHaveExercised fails a run too short or too skewed to have tried
// each behaviour; it guards the model against silently testing nothing.
func (m *Model) mustHaveExercised(t *testing.T) {
	t.Helper()
	c := m.counts
	for name, n := range map[string]int{
		"grants": c.granted, "queued acquires": c.queued, "timeouts": c.timedOut,
		"releases": c.released, "late releases refused": c.lateRefused,
		"lost releases": c.lostReleases, "cancelled waits": c.cancelled,
		"renewals": c.renewed, "late renewals refused": c.renewalsRefused,
	} {
		if n == 0 {
			t.Errorf("the run never produced %s", name)
		}
	}
	if m.aw == nil {
		return
	}
	for name, n := range map[string]int{
		"abandons of a grant": c.abandonsReleased, "abandons of a waiter": c.abandonsDropped,
		"abandons of nothing": c.abandonsNothing, "tombstone refusals": c.tombstoneRefusals,
	} {
		if n == 0 {
			t.Errorf("the run never produced %s", name)
		}
	}
}

type modelKey struct{ tenant, name string }

// modelLock is the server's side of one key as the model expects it.
type modelLock struct {
	token      uint64           // the last token granted
	holder     engine.Requester // the requester it was granted to (0: none)
	validUntil time.Duration
	released   bool
	queue      []*modelWaiter // pending, in arrival order
}

// modelWaiter is a queued acquire and the client that made it.
type modelWaiter struct {
	owner     uint64
	requester engine.Requester
	client    *modelClient
	key       modelKey
	arrived   time.Duration
	deadline  time.Duration
	lease     time.Duration
	abandoned bool // its client abandoned it: answered TimedOut at once
}

// modelClient is one simulated client and what it believes.
type modelClient struct {
	id          int
	session     string        // its §6a session, "" for none
	holds       []modelHold   // grants it has not released or forgotten
	pausedUntil time.Duration // it does nothing before this instant
}

type modelHold struct {
	key        modelKey
	owner      uint64
	token      uint64
	validUntil time.Duration // grant instant + lease, as the client sees it
}

// modelAbandoned is an acquire its client abandoned: its tombstone, and
// what the client needs to send it again.
type modelAbandoned struct {
	client *modelClient
	owner  uint64
	key    modelKey
	laid   time.Duration
}

// Model is one seeded model check run on one wrapper.
type Model struct {
	rng          *rand.Rand
	w            Wrapper
	aw           AbandonWrapper // nil unless w is one
	instrumented Instrumented   // nil unless w is one
	limited      bool           // Busy is a valid answer
	now          time.Duration

	locks     map[modelKey]*modelLock
	pending   []*modelWaiter // every queued acquire, in arrival order
	finished  []uint64       // owners of the last waits resolved or cancelled
	nextOwner uint64
	clients   []*modelClient
	abandoned []modelAbandoned // in the order they were laid
	counts    ModelCounts
	trace     hash.Hash64
}

// NewModel returns the run of seed on a wrapper made by fresh with the
// seed's limits.
func NewModel(seed uint64, fresh func(Limits) Wrapper) *Model {
	limits := SeedLimits(seed)
	m := &Model{
		rng:     rand.New(rand.NewPCG(seed, seed)),
		w:       fresh(limits),
		limited: limits != Limits{},
		locks:   make(map[modelKey]*modelLock),
		trace:   fnv.New64a(),
	}
	m.instrumented, _ = m.w.(Instrumented)
	m.aw, _ = m.w.(AbandonWrapper)
	for i := range 12 {
		c := &modelClient{id: i}
		if m.aw != nil && i%2 == 0 {
			c.session = fmt.Sprint("model-c", i)
		}
		m.clients = append(m.clients, c)
	}
	return m
}

// Trace is a hash of every call the run made and every answer it got.
func (m *Model) Trace() uint64 { return m.trace.Sum64() }

// Counts is what the run did so far.
func (m *Model) Counts() ModelCounts { return m.counts }

// Run makes steps random steps, checking each, then shuts an Instrumented
// wrapper down.
func (m *Model) Run(steps int) error {
	for i := range steps {
		if err := m.step(); err != nil {
			return fmt.Errorf("step %d at %v: %w", i, m.now, err)
		}
	}
	return m.shutdown()
}

func (m *Model) record(vals ...uint64) {
	var b [8]byte
	for _, v := range vals {
		binary.LittleEndian.PutUint64(b[:], v)
		m.trace.Write(b[:])
	}
}

func (m *Model) step() error {
	c := m.clients[m.rng.IntN(len(m.clients))]
	var err error
	switch p := m.rng.IntN(100); {
	case c.pausedUntil > m.now && p < 70:
		// A paused client does nothing; the world moves on without it.
	case c.pausedUntil != 0 && c.pausedUntil <= m.now:
		err = m.resume(c)
	case p < 34:
		err = m.acquire(c)
	case p < 46:
		err = m.releaseOne(c)
	case p < 52:
		err = m.renewOne(c)
	case p < 55:
		m.loseRelease(c)
	case p < 58:
		m.pause(c)
	case p < 61:
		err = m.dropConnection(c)
	case p < 63:
		err = m.cancelFinished()
	case p < 67:
		err = m.forgedRelease()
	case p < 70 && m.aw != nil:
		// Without an AbandonWrapper these fall to the next case, so that
		// the run of such a wrapper is the same as before §6a.
		err = m.abandonStep(c)
	case p < 84:
		steps := []time.Duration{0, 250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second, 7 * time.Second}
		d := steps[m.rng.IntN(len(steps))]
		m.w.Advance(d)
		m.now += d
		m.record(9, uint64(d))
	case p < 99:
		err = m.tick()
	default:
		err = m.sweep()
	}
	if err == nil {
		// Time passing resolves nothing by itself; this also catches a
		// resolution a step forgot to look at.
		err = m.absorb()
	}
	if err != nil {
		return err
	}
	m.counts.maxPending = max(m.counts.maxPending, len(m.pending))
	return m.checkCounters()
}

func (m *Model) lock(k modelKey) *modelLock {
	l := m.locks[k]
	if l == nil {
		l = &modelLock{}
		m.locks[k] = l
	}
	return l
}

func (m *Model) held(l *modelLock) bool {
	return l.token != 0 && !l.released && m.now < l.validUntil
}

func (m *Model) pickKey() modelKey {
	return modelKey{fmt.Sprint("t", m.rng.IntN(2)), fmt.Sprint("key", m.rng.IntN(6))}
}

func (m *Model) acquire(c *modelClient) error {
	m.nextOwner++
	return m.acquireAs(c, m.pickKey(), m.nextOwner)
}

// acquireAs sends c's acquire owner of k.
func (m *Model) acquireAs(c *modelClient, k modelKey, owner uint64) error {
	lease := time.Duration(1+m.rng.IntN(6)) * time.Second
	var wait time.Duration
	if m.rng.IntN(3) > 0 {
		wait = time.Duration(1+m.rng.IntN(8)) * time.Second
	}
	m.counts.acquires++
	// A re-sent owner may be queued again: its cancel is no longer one
	// of a wait that is over.
	m.finished = slices.DeleteFunc(m.finished, func(o uint64) bool { return o == owner })
	req := RequesterOf(c.session, owner)
	var r engine.Result
	if req != 0 {
		r = m.aw.AcquireFor(k.tenant, k.name, owner, req, lease, wait)
	} else {
		r = m.w.Acquire(k.tenant, k.name, owner, lease, wait)
	}
	m.record(2, owner, uint64(r.Outcome), r.Token)
	if m.tombstoned(c, owner, k) {
		// Refused before anything else: no handoff runs, nothing changes.
		if r.Outcome != engine.TimedOut {
			return fmt.Errorf("acquire %v of abandoned owner %d = %v, want timedout", k, owner, r.Outcome)
		}
		m.counts.tombstoneRefusals++
		return nil
	}
	// A due handoff runs inside Acquire, before the answer.
	if err := m.absorb(); err != nil {
		return err
	}
	l := m.lock(k)
	switch r.Outcome {
	case engine.Granted:
		if len(l.queue) > 0 {
			return fmt.Errorf("acquire %v granted past %d waiters", k, len(l.queue))
		}
		if r.Waited != 0 {
			return fmt.Errorf("immediate grant waited %v", r.Waited)
		}
		return m.granted(c, k, owner, req, r.Token, lease)
	case engine.Queued:
		if !m.held(l) || wait == 0 {
			return fmt.Errorf("acquire %v (wait %v) queued on a lock that is not held", k, wait)
		}
		w := &modelWaiter{owner: owner, requester: req, client: c, key: k, arrived: m.now, deadline: m.now + wait, lease: lease}
		l.queue = append(l.queue, w)
		m.pending = append(m.pending, w)
		m.counts.queued++
	case engine.TimedOut:
		if !m.held(l) || wait != 0 {
			return fmt.Errorf("acquire %v (wait %v) timed out on a lock that is not held", k, wait)
		}
		m.counts.timedOut++
	case engine.Busy:
		if !m.limited {
			return fmt.Errorf("acquire %v busy without limits", k)
		}
		m.counts.busy++
	default:
		return fmt.Errorf("acquire %v: unexpected %v", k, r.Outcome)
	}
	return nil
}

// absorb checks the resolutions of queued acquires the last calls made,
// in order, and gives each grant to its client.
func (m *Model) absorb() error { return m.absorbEach(m.w.Resolutions(), nil) }

// absorbEach is absorb of rs, calling then (if set) after each.
func (m *Model) absorbEach(rs []Resolution, then func(*modelWaiter, engine.Result)) error {
	for _, res := range rs {
		i := slices.IndexFunc(m.pending, func(w *modelWaiter) bool { return w.owner == res.Owner })
		if i < 0 {
			return fmt.Errorf("owner %d resolved %v but it is not pending", res.Owner, res.Result)
		}
		w := m.pending[i]
		r := res.Result
		m.record(1, res.Owner, uint64(r.Outcome), r.Token, uint64(m.now))
		switch r.Outcome {
		case engine.Granted:
			if head := m.locks[w.key].queue[0]; head != w {
				return fmt.Errorf("FIFO: owner %d granted behind owner %d", w.owner, head.owner)
			}
			if m.now >= w.deadline {
				return fmt.Errorf("owner %d granted at %v after its deadline %v", w.owner, m.now, w.deadline)
			}
			if r.Waited != m.now-w.arrived {
				return fmt.Errorf("owner %d waited %v, want %v", w.owner, r.Waited, m.now-w.arrived)
			}
			if err := m.granted(w.client, w.key, w.owner, w.requester, r.Token, w.lease); err != nil {
				return err
			}
		case engine.TimedOut:
			if m.now < w.deadline && !w.abandoned {
				return fmt.Errorf("owner %d timed out at %v before its deadline %v", w.owner, m.now, w.deadline)
			}
			m.counts.timedOut++
		default:
			return fmt.Errorf("owner %d resolved with %v", w.owner, r.Outcome)
		}
		m.finish(w)
		if then != nil {
			then(w, r)
		}
	}
	return nil
}

// granted checks a grant of token on k to c's acquire owner (tagged req),
// now, for lease, on both sides: the server's (tokens increase, the
// previous lease is over) and the clients' (nobody else believes it holds
// k), and records it.
func (m *Model) granted(c *modelClient, k modelKey, owner uint64, req engine.Requester, token uint64, lease time.Duration) error {
	l := m.lock(k)
	if token <= l.token {
		return fmt.Errorf("key %v: token %d after %d", k, token, l.token)
	}
	if m.held(l) {
		return fmt.Errorf("mutual exclusion: key %v granted at %v while token %d is valid until %v", k, m.now, l.token, l.validUntil)
	}
	for _, other := range m.clients {
		for _, oh := range other.holds {
			if oh.key == k && m.now < oh.validUntil {
				return fmt.Errorf("mutual exclusion: client %d granted %v token %d while client %d holds token %d valid until %v",
					c.id, k, token, other.id, oh.token, oh.validUntil)
			}
		}
	}
	l.token, l.holder, l.validUntil, l.released = token, req, m.now+lease, false
	c.holds = append(c.holds, modelHold{key: k, owner: owner, token: token, validUntil: m.now + lease})
	m.counts.granted++
	return nil
}

func (m *Model) finish(w *modelWaiter) {
	l := m.locks[w.key]
	l.queue = slices.DeleteFunc(l.queue, func(x *modelWaiter) bool { return x == w })
	m.pending = slices.DeleteFunc(m.pending, func(x *modelWaiter) bool { return x == w })
	if len(m.finished) == 16 {
		m.finished = m.finished[1:]
	}
	m.finished = append(m.finished, w.owner)
}

// releaseOne releases one of c's holds with its own token.
func (m *Model) releaseOne(c *modelClient) error {
	if len(c.holds) == 0 {
		return nil
	}
	i := m.rng.IntN(len(c.holds))
	h := c.holds[i]
	c.holds = slices.Delete(c.holds, i, i+1)
	return m.releaseHold(c, h)
}

func (m *Model) releaseHold(c *modelClient, h modelHold) error {
	l := m.lock(h.key)
	want := engine.NotHeld
	if h.token == l.token && m.held(l) {
		want = engine.Released
	}
	if err := m.checkRelease(c, h, want); err != nil {
		return err
	}
	r := m.w.Release(h.key.tenant, h.key.name, h.token)
	m.record(3, h.token, uint64(r.Outcome))
	if r.Outcome != want {
		return fmt.Errorf("client %d release %v token %d (current %d, valid until %v, released %v) = %v, want %v",
			c.id, h.key, h.token, l.token, l.validUntil, l.released, r.Outcome, want)
	}
	switch r.Outcome {
	case engine.Released:
		m.counts.released++
		l.released, l.validUntil = true, m.now
	case engine.NotHeld:
		m.counts.notHeld++
		if h.validUntil <= m.now {
			m.counts.lateRefused++
		}
	}
	return m.absorb()
}

// checkRelease: a client still within its validity must get Released.
func (m *Model) checkRelease(c *modelClient, h modelHold, want engine.Outcome) error {
	if m.now < h.validUntil && want != engine.Released {
		return fmt.Errorf("client %d holds %v token %d valid until %v, but its release would be refused",
			c.id, h.key, h.token, h.validUntil)
	}
	return nil
}

// renewOne renews one of c's holds for a fresh lease, which may be shorter
// than what is left of the old one. A refused renewal tells the client it
// lost the lock.
func (m *Model) renewOne(c *modelClient) error {
	if len(c.holds) == 0 {
		return nil
	}
	i := m.rng.IntN(len(c.holds))
	h := c.holds[i]
	l := m.lock(h.key)
	want := engine.NotHeld
	if h.token == l.token && m.held(l) {
		want = engine.Renewed
	}
	if m.now < h.validUntil && want != engine.Renewed {
		return fmt.Errorf("client %d holds %v token %d valid until %v, but its renewal would be refused",
			c.id, h.key, h.token, h.validUntil)
	}
	lease := time.Duration(1+m.rng.IntN(6)) * time.Second
	r := m.w.Keep(h.key.tenant, h.key.name, h.token, lease)
	m.record(10, h.token, uint64(lease), uint64(r.Outcome), r.Token)
	if r.Outcome != want || (want == engine.Renewed && r.Token != h.token) {
		return fmt.Errorf("client %d keep %v token %d (current %d, valid until %v, released %v) = %+v, want %v",
			c.id, h.key, h.token, l.token, l.validUntil, l.released, r, want)
	}
	if r.Outcome == engine.Renewed {
		m.counts.renewed++
		l.validUntil = m.now + lease
		c.holds[i].validUntil = m.now + lease
	} else {
		m.counts.renewalsRefused++
		c.holds = slices.Delete(c.holds, i, i+1)
	}
	return m.absorb()
}

// loseRelease: the client believes it released, but the request never
// reached the server. Only the lease frees the lock.
func (m *Model) loseRelease(c *modelClient) {
	if len(c.holds) == 0 {
		return
	}
	i := m.rng.IntN(len(c.holds))
	c.holds = slices.Delete(c.holds, i, i+1)
	m.counts.lostReleases++
	m.record(4, uint64(c.id))
}

// pause stops c (a GC pause, a swapped process) for up to three leases.
func (m *Model) pause(c *modelClient) {
	d := time.Duration(1+m.rng.IntN(18)) * time.Second
	c.pausedUntil = m.now + d
	m.counts.pauses++
	m.record(5, uint64(c.id), uint64(d))
}

// resume: a client back from a pause releases what it thinks it holds;
// the grants whose lease ended meanwhile must be refused.
func (m *Model) resume(c *modelClient) error {
	c.pausedUntil = 0
	holds := c.holds
	c.holds = nil
	for _, h := range holds {
		if err := m.releaseHold(c, h); err != nil {
			return err
		}
	}
	return nil
}

// dropConnection cancels every queued acquire of c, as the server does
// when a connection closes. Its locks stay, releasable by token later.
func (m *Model) dropConnection(c *modelClient) error {
	m.counts.drops++
	var queued []*modelWaiter
	for _, w := range m.pending {
		if w.client == c {
			queued = append(queued, w)
		}
	}
	for _, w := range queued {
		if !m.w.Cancel(w.owner) {
			return fmt.Errorf("cancel of pending owner %d returned false", w.owner)
		}
		if res := m.w.Resolutions(); len(res) != 0 {
			return fmt.Errorf("cancel resolved %v", res)
		}
		m.finish(w)
		m.counts.cancelled++
		m.record(6, w.owner)
	}
	return nil
}

func (m *Model) cancelFinished() error {
	if len(m.finished) == 0 {
		return nil
	}
	if owner := m.finished[m.rng.IntN(len(m.finished))]; m.w.Cancel(owner) {
		return fmt.Errorf("cancel of owner %d, whose wait is over, returned true", owner)
	}
	return nil
}

// forgedRelease: some client releases with a token it does not hold: a
// stale one, a guess below the current token, or (only when no handoff can
// run inside the call and mint it) a token not issued yet. Only the current
// holder's token may release.
func (m *Model) forgedRelease() error {
	k := m.pickKey()
	l := m.lock(k)
	var token uint64
	switch m.rng.IntN(3) {
	case 0:
		token = l.token - 1 // wraps to MaxUint64 for a key never granted
	case 1:
		token = m.rng.Uint64N(l.token + 1)
	default:
		if len(l.queue) > 0 {
			return nil // a due handoff would issue the next token first
		}
		token = l.token + 1 + m.rng.Uint64N(3)
	}
	if token == l.token {
		return nil // that is a release by the holder, covered elsewhere
	}
	r := m.w.Release(k.tenant, k.name, token)
	m.record(7, token, uint64(r.Outcome))
	if r.Outcome != engine.NotHeld {
		return fmt.Errorf("release %v with token %d (current %d) = %v", k, token, l.token, r.Outcome)
	}
	m.counts.notHeld++
	return m.absorb()
}

// tick lets the wrapper's due timers act: every wait that elapsed is
// answered, every lapsed lease with waiters handed on.
func (m *Model) tick() error {
	m.w.Tick()
	if err := m.absorb(); err != nil {
		return err
	}
	for _, w := range m.pending {
		if w.deadline <= m.now {
			return fmt.Errorf("waiter %d still pending after its deadline %v", w.owner, w.deadline)
		}
	}
	for k, l := range m.locks {
		if len(l.queue) > 0 && !m.held(l) {
			return fmt.Errorf("key %v has waiters but its lease ended at %v", k, l.validUntil)
		}
	}
	return nil
}

// sweep runs an Instrumented wrapper's expiry sweep, which reclaims keys
// and must resolve nobody.
func (m *Model) sweep() error {
	if m.instrumented == nil {
		return nil
	}
	m.instrumented.Sweep()
	if res := m.w.Resolutions(); len(res) != 0 {
		return fmt.Errorf("sweep resolved %v", res)
	}
	return nil
}

// checkCounters holds an Instrumented wrapper's counters to the model.
func (m *Model) checkCounters() error {
	for k, l := range m.locks {
		if len(l.queue) > 0 && l.released {
			return fmt.Errorf("key %v released with waiters left", k)
		}
	}
	if m.instrumented == nil {
		return nil
	}
	st := m.instrumented.Stats()
	if st.Waiters != len(m.pending) || st.Inflight != len(m.pending) {
		return fmt.Errorf("stats waiters=%d inflight=%d, model has %d pending", st.Waiters, st.Inflight, len(m.pending))
	}
	if refused := st.KeysGate.Refused + st.WaitersGate.Refused + st.InflightGate.Refused; refused != uint64(m.counts.busy) {
		return fmt.Errorf("gates refused %d, model saw %d Busy", refused, m.counts.busy)
	}
	if m.aw != nil {
		c := m.counts
		if st.AbandonsReleased != uint64(c.abandonsReleased) || st.AbandonsDroppedWaiter != uint64(c.abandonsDropped) ||
			st.AbandonsNothing != uint64(c.abandonsNothing) || st.TombstoneRefusals != uint64(c.tombstoneRefusals) {
			return fmt.Errorf("stats abandons released=%d dropped=%d nothing=%d refusals=%d, model %d %d %d %d",
				st.AbandonsReleased, st.AbandonsDroppedWaiter, st.AbandonsNothing, st.TombstoneRefusals,
				c.abandonsReleased, c.abandonsDropped, c.abandonsNothing, c.tombstoneRefusals)
		}
	}
	heldKeys := 0
	for _, l := range m.locks {
		if m.held(l) {
			heldKeys++
		}
	}
	if st.Keys < heldKeys || st.Keys > st.KeysGate.Limit {
		return fmt.Errorf("stats keys=%d, model holds %d, limit %d", st.Keys, heldKeys, st.KeysGate.Limit)
	}
	return nil
}

// shutdown shuts an Instrumented wrapper down: every queued acquire must
// be answered ShuttingDown, once, and the counters drop to zero.
func (m *Model) shutdown() error {
	if m.instrumented == nil {
		return nil
	}
	m.instrumented.Shutdown()
	waiting := make(map[uint64]bool, len(m.pending))
	for _, w := range m.pending {
		waiting[w.owner] = true
	}
	for _, res := range m.w.Resolutions() {
		if res.Result.Outcome != engine.ShuttingDown || !waiting[res.Owner] {
			return fmt.Errorf("shutdown resolved owner %d with %v", res.Owner, res.Result)
		}
		delete(waiting, res.Owner)
	}
	if len(waiting) != 0 {
		return fmt.Errorf("shutdown left %d waiters unresolved", len(waiting))
	}
	if st := m.instrumented.Stats(); st.Waiters != 0 || st.Inflight != 0 {
		return fmt.Errorf("after shutdown: %d waiters, %d in flight", st.Waiters, st.Inflight)
	}
	return nil
}

// tombstoned reports whether c's acquire owner of k is refused now: c
// abandoned it less than TombstoneLife ago.
func (m *Model) tombstoned(c *modelClient, owner uint64, k modelKey) bool {
	for _, a := range m.abandoned {
		if a.client == c && a.owner == owner && a.key == k && m.now < a.laid+engine.TombstoneLife {
			return true
		}
	}
	return false
}

// abandonStep: a client with a session loses an acquire's answer and
// abandons it (a grant it was given, which it forgets; one of its queued
// acquires; or one that never reached the server), or sends an abandoned
// acquire again, as a late copy would arrive.
func (m *Model) abandonStep(c *modelClient) error {
	if c.session == "" {
		return nil
	}
	switch m.rng.IntN(4) {
	case 0:
		if len(c.holds) == 0 {
			return nil
		}
		i := m.rng.IntN(len(c.holds))
		h := c.holds[i]
		c.holds = slices.Delete(c.holds, i, i+1)
		return m.abandon(c, h.key, h.owner)
	case 1:
		var mine []*modelWaiter
		for _, w := range m.pending {
			if w.client == c {
				mine = append(mine, w)
			}
		}
		if len(mine) == 0 {
			return nil
		}
		w := mine[m.rng.IntN(len(mine))]
		return m.abandon(c, w.key, w.owner)
	case 2:
		m.nextOwner++
		return m.abandon(c, m.pickKey(), m.nextOwner)
	default:
		var mine []modelAbandoned
		for _, a := range m.abandoned {
			if a.client == c {
				mine = append(mine, a)
			}
		}
		if len(mine) == 0 {
			return nil
		}
		a := mine[m.rng.IntN(len(mine))]
		if slices.ContainsFunc(m.pending, func(w *modelWaiter) bool { return w.owner == a.owner }) {
			return nil // still queued: no copy of it can arrive while it waits
		}
		return m.acquireAs(c, a.key, a.owner)
	}
}

// abandon sends c's ABANDON of its acquire owner of k and checks it. A
// due handoff runs first, as for any command on the key: it answers the
// waits that elapsed until it reaches a waiter it grants, which may be
// the abandoned acquire itself. Then the requester's own unexpired grant
// is released (and handed on), or its waiter still queued is dropped and
// answered TimedOut, or nothing happens.
func (m *Model) abandon(c *modelClient, k modelKey, owner uint64) error {
	req := RequesterOf(c.session, owner)
	l := m.lock(k)
	due := len(l.queue) > 0 && !m.held(l)
	var waiter *modelWaiter
	reached := due // whether the handoff reaches the waiter
	for _, w := range l.queue {
		if w.requester == req {
			waiter = w
			break
		}
		reached = reached && w.deadline <= m.now
	}
	want, outcome := engine.NotHeld, &m.counts.abandonsNothing
	switch {
	case req == l.holder && m.held(l):
		want, outcome = engine.Released, &m.counts.abandonsReleased
		m.abandonRelease(c, l, k, owner)
	case waiter != nil && reached && waiter.deadline > m.now:
		want, outcome = engine.Released, &m.counts.abandonsReleased
	case waiter != nil && !reached:
		outcome = &m.counts.abandonsDropped
	}
	if waiter != nil {
		waiter.abandoned = true // its TimedOut may come before its deadline
	}
	r := m.aw.Abandon(k.tenant, k.name, req)
	m.record(11, owner, uint64(r.Outcome))
	err := m.absorbEach(m.w.Resolutions(), func(w *modelWaiter, r engine.Result) {
		if w == waiter && r.Outcome == engine.Granted {
			m.abandonRelease(c, l, k, owner) // before the next grant
		}
	})
	if err != nil {
		return err
	}
	if r.Outcome != want {
		return fmt.Errorf("client %d abandon %v owner %d (holder %#x, token %d, valid until %v, released %v) = %v, want %v",
			c.id, k, owner, l.holder, l.token, l.validUntil, l.released, r.Outcome, want)
	}
	if waiter != nil && slices.Contains(m.pending, waiter) {
		return fmt.Errorf("abandon of queued owner %d left it queued", owner)
	}
	*outcome++
	if !m.tombstoned(c, owner, k) {
		m.abandoned = append(m.abandoned, modelAbandoned{client: c, owner: owner, key: k, laid: m.now})
	}
	// Long expired ones are sent again no more.
	m.abandoned = slices.DeleteFunc(m.abandoned, func(a modelAbandoned) bool { return m.now >= a.laid+2*engine.TombstoneLife })
	return nil
}

// abandonRelease is what an abandon does to the requester's grant of k:
// released, and forgotten by its client, who never saw it.
func (m *Model) abandonRelease(c *modelClient, l *modelLock, k modelKey, owner uint64) {
	l.released, l.validUntil = true, m.now
	c.holds = slices.DeleteFunc(c.holds, func(h modelHold) bool { return h.key == k && h.owner == owner })
}
