package engine

import (
	"encoding/binary"
	"flag"
	"fmt"
	"hash"
	"hash/fnv"
	"maps"
	"slices"
	"testing"
	"time"
)

// The model check extends TestSimulation (sim_test.go) with clients: each
// simulated client holds its own tokens and believes it holds a lock from
// the grant until grant + lease, and it misbehaves the ways real clients
// do — it renews its lease (KEEP), sometimes too late, pauses past its
// lease and releases late, loses a release (the lock is only freed by its
// lease), or drops its connection (every queued acquire of that client is
// cancelled at once, its locks stay). It reuses
// the sim's model of the engine (FIFO queues, validity intervals, tokens,
// counters) and adds the clients' side of mutual exclusion: at no instant
// do two clients each hold a grant they believe valid on the same key, and
// a client within its validity is never refused its release or renewal.

var (
	modelSeed  = flag.Uint64("model.seed", 0, "run TestModelCheck with this seed only")
	modelSteps = flag.Int("model.steps", 0, "steps per seed of TestModelCheck (default 200000, 25000 with -short)")
)

// modelSeeds: odd seeds run without limits, even ones with the small
// limits of newSim (Busy is then a valid answer).
var modelSeeds = []uint64{11, 12, 13, 14, 15, 16, 17, 18}

// TestModelCheck runs 8 seeds × 200k steps (1.6M in all; 200k with -short).
// A failure names its seed and step; rerun it alone with -model.seed.
func TestModelCheck(t *testing.T) {
	steps := *modelSteps
	if steps == 0 {
		steps = 200_000
		if testing.Short() {
			steps = 25_000
		}
	}
	seeds := modelSeeds
	if *modelSeed != 0 {
		seeds = []uint64{*modelSeed}
	}
	for _, seed := range seeds {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			t.Parallel()
			m := newModel(seed)
			start := time.Now()
			if err := m.run(steps); err != nil {
				t.Fatalf("seed %d: %v\nreproduce: go test ./engine -run 'TestModelCheck$' -model.seed=%d -model.steps=%d",
					seed, err, seed, steps)
			}
			t.Logf("seed %d: %d steps in %v, simulated %v; %s; trace %016x",
				seed, steps, time.Since(start).Round(time.Millisecond), m.clock.Now(), m.counts, m.trace.Sum64())
			m.counts.mustHaveExercised(t)
		})
	}
}

// TestModelCheckIsDeterministic proves that a seed reproduces exactly: two
// runs of one seed make the same engine calls and get the same answers.
func TestModelCheckIsDeterministic(t *testing.T) {
	const steps = 20_000
	for _, seed := range []uint64{11, 12} {
		a, b := newModel(seed), newModel(seed)
		if err := a.run(steps); err != nil {
			t.Fatal(err)
		}
		if err := b.run(steps); err != nil {
			t.Fatal(err)
		}
		if a.trace.Sum64() != b.trace.Sum64() || a.counts != b.counts {
			t.Fatalf("seed %d: traces %016x and %016x, counts %s and %s",
				seed, a.trace.Sum64(), b.trace.Sum64(), a.counts, b.counts)
		}
	}
	if newModelTrace(t, 11) == newModelTrace(t, 13) {
		t.Fatal("different seeds gave the same trace: the trace does not record the run")
	}
}

func newModelTrace(t *testing.T, seed uint64) uint64 {
	m := newModel(seed)
	if err := m.run(5_000); err != nil {
		t.Fatal(err)
	}
	return m.trace.Sum64()
}

// TestModelCheckCatchesViolations feeds the client-side checks a forged
// double grant and a refused valid release, so the model is known to fail
// when the engine misbehaves.
func TestModelCheckCatchesViolations(t *testing.T) {
	m := newModel(11)
	a, b := m.clients[0], m.clients[1]
	k := simKey{0, "key0"}
	m.waitsOf[1] = modelWait{client: a, key: k, lease: 5 * time.Second}
	m.waitsOf[2] = modelWait{client: b, key: k, lease: 5 * time.Second}
	m.news = []resolution{{1, Result{Outcome: Granted, Token: 1}}, {2, Result{Outcome: Granted, Token: 2}}}
	if err := m.settle(); err == nil {
		t.Fatal("two clients holding one key at once went unnoticed")
	}
	if err := m.checkRelease(a, modelHold{key: k, token: 1, validUntil: time.Hour}, NotHeld); err == nil {
		t.Fatal("a valid holder refused its release went unnoticed")
	}
}

type modelCounts struct {
	acquires, granted, queued, timedOut, busy    int
	released, notHeld, lateRefused, lostReleases int
	renewed, renewalsRefused                     int
	pauses, drops, cancelled                     int
	maxPending                                   int
}

func (c modelCounts) String() string {
	return fmt.Sprintf("acquires=%d granted=%d queued=%d timed_out=%d busy=%d released=%d not_held=%d "+
		"late_release_refused=%d lost_releases=%d renewed=%d renewals_refused=%d pauses=%d conn_drops=%d waits_cancelled=%d max_pending=%d",
		c.acquires, c.granted, c.queued, c.timedOut, c.busy, c.released, c.notHeld,
		c.lateRefused, c.lostReleases, c.renewed, c.renewalsRefused, c.pauses, c.drops, c.cancelled, c.maxPending)
}

// mustHaveExercised fails a run too short or too skewed to have tried
// each behaviour; it guards the model against silently testing nothing.
func (c modelCounts) mustHaveExercised(t *testing.T) {
	t.Helper()
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
}

// modelClient is one simulated client and what it believes.
type modelClient struct {
	id          int
	waits       map[uint64]bool // owners of its queued acquires
	holds       []modelHold     // grants it has not released or forgotten
	pausedUntil time.Duration   // it does nothing before this instant
}

type modelHold struct {
	key        simKey
	token      uint64
	validUntil time.Duration // grant instant + lease, as the client sees it
}

// modelWait remembers who queued an acquire, for when it resolves.
type modelWait struct {
	client *modelClient
	key    simKey
	lease  time.Duration
}

type model struct {
	*sim
	clients []*modelClient
	waitsOf map[uint64]modelWait
	news    []resolution // resolutions not yet seen by the clients
	counts  modelCounts
	trace   hash.Hash64
}

func newModel(seed uint64) *model {
	m := &model{sim: newSim(seed), waitsOf: make(map[uint64]modelWait), trace: fnv.New64a()}
	for i := range 12 {
		m.clients = append(m.clients, &modelClient{id: i, waits: make(map[uint64]bool)})
	}
	return m
}

// Resolve is the Waiter of every acquire the model makes: the sim checks
// the resolution against the lock model, the clients learn of it.
func (m *model) Resolve(owner uint64, r Result) {
	m.sim.Resolve(owner, r)
	m.news = append(m.news, resolution{owner, r})
}

func (m *model) record(vals ...uint64) {
	var b [8]byte
	for _, v := range vals {
		binary.LittleEndian.PutUint64(b[:], v)
		m.trace.Write(b[:])
	}
}

func (m *model) run(steps int) error {
	for i := range steps {
		if err := m.step(); err != nil {
			return fmt.Errorf("step %d at %v: %w", i, m.clock.Now(), err)
		}
	}
	if err := m.shutdown(); err != nil {
		return err
	}
	m.news = nil
	return nil
}

func (m *model) step() error {
	c := m.clients[m.rng.IntN(len(m.clients))]
	now := m.clock.Now()
	var err error
	switch p := m.rng.IntN(100); {
	case c.pausedUntil > now && p < 70:
		// A paused client does nothing; the world moves on without it.
	case c.pausedUntil != 0 && c.pausedUntil <= now:
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
	case p < 84:
		steps := []time.Duration{0, 250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second, 7 * time.Second}
		d := steps[m.rng.IntN(len(steps))]
		m.clock.Advance(d)
		m.record(9, uint64(d))
	case p < 99:
		err = m.tick()
	default:
		m.e.Sweep()
		if len(m.resolved) != 0 {
			err = fmt.Errorf("sweep resolved %v", m.resolved)
		}
	}
	if err == nil {
		err = m.settle()
	}
	if err != nil {
		return err
	}
	m.counts.maxPending = max(m.counts.maxPending, len(m.pending))
	return m.checkInvariants()
}

// settle tells the clients what the engine resolved: a grant becomes a
// hold, after checking no other client believes it holds the same key.
func (m *model) settle() error {
	news := m.news
	m.news = nil
	now := m.clock.Now()
	for _, res := range news {
		w, ok := m.waitsOf[res.owner]
		if !ok {
			return fmt.Errorf("owner %d resolved %v but no client waits for it", res.owner, res.r)
		}
		delete(m.waitsOf, res.owner)
		delete(w.client.waits, res.owner)
		m.record(1, res.owner, uint64(res.r.Outcome), res.r.Token, uint64(now))
		switch res.r.Outcome {
		case Granted:
			m.counts.granted++
			if err := m.addHold(w.client, modelHold{w.key, res.r.Token, now + w.lease}); err != nil {
				return err
			}
		case TimedOut:
			m.counts.timedOut++
		}
	}
	return nil
}

func (m *model) addHold(c *modelClient, h modelHold) error {
	now := m.clock.Now()
	for _, other := range m.clients {
		for _, oh := range other.holds {
			if oh.key == h.key && now < oh.validUntil {
				return fmt.Errorf("mutual exclusion: client %d granted %v token %d while client %d holds token %d valid until %v",
					c.id, h.key, h.token, other.id, oh.token, oh.validUntil)
			}
		}
	}
	c.holds = append(c.holds, h)
	return nil
}

func (m *model) acquire(c *modelClient) error {
	a := m.drawAcquire()
	m.counts.acquires++
	m.waitsOf[a.owner] = modelWait{client: c, key: a.k, lease: a.lease} // if it queues
	r, h := m.e.Acquire(a.ns, a.key, a.owner, a.lease, a.wait, m)
	m.record(2, a.owner, uint64(r.Outcome), r.Token)
	if r.Outcome != Queued {
		delete(m.waitsOf, a.owner)
	}
	now := m.clock.Now()
	if err := m.checkAcquire(a, r, h); err != nil {
		return err
	}
	switch r.Outcome {
	case Granted:
		// The immediate grant comes after any resolution the call made.
		if err := m.settle(); err != nil {
			return err
		}
		m.counts.granted++
		return m.addHold(c, modelHold{a.k, r.Token, now + a.lease})
	case Queued:
		m.counts.queued++
		c.waits[a.owner] = true
	case TimedOut:
		m.counts.timedOut++
	case Busy:
		m.counts.busy++
	}
	return nil
}

// releaseOne releases one of c's holds with its own token.
func (m *model) releaseOne(c *modelClient) error {
	if len(c.holds) == 0 {
		return nil
	}
	i := m.rng.IntN(len(c.holds))
	h := c.holds[i]
	c.holds = slices.Delete(c.holds, i, i+1)
	return m.releaseHold(c, h)
}

func (m *model) releaseHold(c *modelClient, h modelHold) error {
	l := m.lock(h.key)
	want := NotHeld
	if h.token == l.token && m.held(l) {
		want = Released
	}
	if err := m.checkRelease(c, h, want); err != nil {
		return err
	}
	r := m.e.Release(m.ns[h.key.tenant], []byte(h.key.name), h.token)
	m.record(3, h.token, uint64(r.Outcome))
	if r.Outcome != want {
		return fmt.Errorf("client %d release %v token %d (current %d, valid until %v, released %v) = %v, want %v",
			c.id, h.key, h.token, l.token, l.validUntil, l.released, r.Outcome, want)
	}
	now := m.clock.Now()
	switch r.Outcome {
	case Released:
		m.counts.released++
		l.released, l.validUntil = true, now
	case NotHeld:
		m.counts.notHeld++
		if h.validUntil <= now {
			m.counts.lateRefused++
		}
	}
	return m.absorb()
}

// renewOne renews one of c's holds for a fresh lease, which may be shorter
// than what is left of the old one. A refused renewal tells the client it
// lost the lock.
func (m *model) renewOne(c *modelClient) error {
	if len(c.holds) == 0 {
		return nil
	}
	i := m.rng.IntN(len(c.holds))
	h := c.holds[i]
	l := m.lock(h.key)
	want := NotHeld
	if h.token == l.token && m.held(l) {
		want = Renewed
	}
	now := m.clock.Now()
	if now < h.validUntil && want != Renewed {
		return fmt.Errorf("client %d holds %v token %d valid until %v, but its renewal would be refused",
			c.id, h.key, h.token, h.validUntil)
	}
	lease := time.Duration(1+m.rng.IntN(6)) * time.Second
	r := m.e.Keep(m.ns[h.key.tenant], []byte(h.key.name), h.token, lease)
	m.record(10, h.token, uint64(lease), uint64(r.Outcome), r.Token)
	if r.Outcome != want || (want == Renewed && r.Token != h.token) {
		return fmt.Errorf("client %d keep %v token %d (current %d, valid until %v, released %v) = %+v, want %v",
			c.id, h.key, h.token, l.token, l.validUntil, l.released, r, want)
	}
	if r.Outcome == Renewed {
		m.counts.renewed++
		l.validUntil = now + lease
		c.holds[i].validUntil = now + lease
	} else {
		m.counts.renewalsRefused++
		c.holds = slices.Delete(c.holds, i, i+1)
	}
	return m.absorb()
}

// checkRelease: a client still within its validity must get Released.
func (m *model) checkRelease(c *modelClient, h modelHold, want Outcome) error {
	if m.clock.Now() < h.validUntil && want != Released {
		return fmt.Errorf("client %d holds %v token %d valid until %v, but its release would be refused",
			c.id, h.key, h.token, h.validUntil)
	}
	return nil
}

// loseRelease: the client believes it released, but the request never
// reached the server. Only the lease frees the lock.
func (m *model) loseRelease(c *modelClient) {
	if len(c.holds) == 0 {
		return
	}
	i := m.rng.IntN(len(c.holds))
	c.holds = slices.Delete(c.holds, i, i+1)
	m.counts.lostReleases++
	m.record(4, uint64(c.id))
}

// pause stops c (a GC pause, a swapped process) for up to three leases.
func (m *model) pause(c *modelClient) {
	d := time.Duration(1+m.rng.IntN(18)) * time.Second
	c.pausedUntil = m.clock.Now() + d
	m.counts.pauses++
	m.record(5, uint64(c.id), uint64(d))
}

// resume: a client back from a pause releases what it thinks it holds;
// the grants whose lease ended meanwhile must be refused.
func (m *model) resume(c *modelClient) error {
	c.pausedUntil = 0
	holds := c.holds
	c.holds = nil
	for _, h := range holds {
		if err := m.releaseHold(c, h); err != nil {
			return err
		}
		if err := m.settle(); err != nil {
			return err
		}
	}
	return nil
}

// dropConnection cancels every queued acquire of c, as the server does
// when a connection closes. Its locks stay, releasable by token later.
func (m *model) dropConnection(c *modelClient) error {
	m.counts.drops++
	for _, owner := range slices.Sorted(maps.Keys(c.waits)) {
		i := slices.IndexFunc(m.pending, func(w *simWaiter) bool { return w.owner == owner })
		if i < 0 {
			return fmt.Errorf("client %d waits for owner %d, which is not pending", c.id, owner)
		}
		w := m.pending[i]
		if !m.e.Cancel(w.handle) {
			return fmt.Errorf("cancel of pending owner %d returned false", owner)
		}
		if len(m.resolved) != 0 {
			return fmt.Errorf("cancel resolved %v", m.resolved)
		}
		m.finish(w)
		delete(c.waits, owner)
		delete(m.waitsOf, owner)
		m.counts.cancelled++
		m.record(6, owner)
	}
	return nil
}

func (m *model) cancelFinished() error {
	if len(m.finished) == 0 {
		return nil
	}
	if m.e.Cancel(m.finished[m.rng.IntN(len(m.finished))]) {
		return fmt.Errorf("cancel of a finished wait returned true")
	}
	return nil
}

// forgedRelease: some client releases with a token it does not hold: a
// stale one, a guess below the current token, or (only when no handoff can
// run inside the call and mint it) a token not issued yet. Only the current
// holder's token may release.
func (m *model) forgedRelease() error {
	k, ns, key := m.pickKey()
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
	r := m.e.Release(ns, key, token)
	m.record(7, token, uint64(r.Outcome))
	if r.Outcome != NotHeld {
		return fmt.Errorf("release %v with token %d (current %d) = %v", k, token, l.token, r.Outcome)
	}
	m.counts.notHeld++
	return m.absorb()
}
