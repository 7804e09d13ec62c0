package engine

import (
	"fmt"
	"math"
	"slices"
	"testing"
	"time"
)

// The scripted scenarios run on one shard, so tokens come out as 1, 2, 3...
// and can be asserted exactly.

type op uint8

const (
	opAcquire op = iota + 1
	opRelease
	opKeep
	opAdvance
	opTick
	opSweep
	opCancel
	opShutdown
	opStats
)

type step struct {
	op     op
	tenant string // default "t1"
	key    string
	owner  uint64 // acquire: requester; release, keep: whose token, unless token is set; cancel: whose Wait
	token  uint64
	lease  time.Duration
	wait   time.Duration
	by     time.Duration

	want          Result       // acquire, release, keep
	wantCancelled bool         // cancel
	keys, waiters int          // stats
	resolved      []resolution // resolutions this step must cause, in order
}

func acquire(key string, owner uint64, lease, wait time.Duration, want Result) step {
	return step{op: opAcquire, key: key, owner: owner, lease: lease, wait: wait, want: want}
}

// release uses the token last granted to owner.
func release(key string, owner uint64, want Outcome) step {
	return step{op: opRelease, key: key, owner: owner, want: Result{Outcome: want}}
}

func releaseToken(key string, token uint64, want Outcome) step {
	return step{op: opRelease, key: key, token: token, want: Result{Outcome: want}}
}

// keep renews with the token last granted to owner.
func keep(key string, owner uint64, lease time.Duration, want Result) step {
	return step{op: opKeep, key: key, owner: owner, lease: lease, want: want}
}

func renewed(token uint64) Result { return Result{Outcome: Renewed, Token: token} }

func advance(d time.Duration) step { return step{op: opAdvance, by: d} }
func tick() step                   { return step{op: opTick} }
func sweep() step                  { return step{op: opSweep} }
func shutdown() step               { return step{op: opShutdown} }
func cancel(owner uint64, want bool) step {
	return step{op: opCancel, owner: owner, wantCancelled: want}
}
func stats(keys, waiters int) step { return step{op: opStats, keys: keys, waiters: waiters} }

func (s step) resolves(rs ...resolution) step { s.resolved = rs; return s }

func granted(token uint64, waited time.Duration) Result {
	return Result{Outcome: Granted, Token: token, Waited: waited}
}

func outcome(o Outcome) Result { return Result{Outcome: o} }

func res(owner uint64, r Result) resolution { return resolution{owner, r} }

// script runs steps against a fresh one-shard engine on a FakeClock.
type script struct {
	t      *testing.T
	clock  *FakeClock
	e      *Engine
	rec    recorder
	tokens map[uint64]uint64 // owner -> last token granted
	waits  map[uint64]*Wait  // owner -> handle of its queued acquire
}

func newScript(t *testing.T, cfg Config) *script {
	cfg.Shards = 1
	clock := NewFakeClock()
	cfg.Clock = clock
	return &script{
		t:      t,
		clock:  clock,
		e:      New(cfg),
		tokens: make(map[uint64]uint64),
		waits:  make(map[uint64]*Wait),
	}
}

func (sc *script) run(steps ...step) {
	sc.t.Helper()
	for i, st := range steps {
		where := fmt.Sprintf("step %d (at %v)", i, sc.clock.Now())
		sc.do(where, st)
		got := sc.rec.take()
		for _, r := range got {
			if r.r.Outcome == Granted {
				sc.tokens[r.owner] = r.r.Token
			}
		}
		if !slices.Equal(got, st.resolved) {
			sc.t.Fatalf("%s: resolutions %v, want %v", where, got, st.resolved)
		}
	}
}

func (sc *script) do(where string, st step) {
	sc.t.Helper()
	tenant := st.tenant
	if tenant == "" {
		tenant = "t1"
	}
	ns := sc.e.Namespace(tenant)
	switch st.op {
	case opAcquire:
		r, w := sc.e.Acquire(ns, []byte(st.key), st.owner, 0, st.lease, st.wait, &sc.rec)
		if r != st.want {
			sc.t.Fatalf("%s: acquire %q by %d = %+v, want %+v", where, st.key, st.owner, r, st.want)
		}
		if (w != nil) != (r.Outcome == Queued) {
			sc.t.Fatalf("%s: acquire returned Wait %v with outcome %v", where, w, r.Outcome)
		}
		if r.Outcome == Granted {
			sc.tokens[st.owner] = r.Token
		}
		if w != nil {
			sc.waits[st.owner] = w
		}
	case opRelease:
		token := st.token
		if token == 0 {
			token = sc.tokens[st.owner]
		}
		if r := sc.e.Release(ns, []byte(st.key), token); r != st.want {
			sc.t.Fatalf("%s: release %q token %d = %+v, want %+v", where, st.key, token, r, st.want)
		}
	case opKeep:
		token := st.token
		if token == 0 {
			token = sc.tokens[st.owner]
		}
		if r := sc.e.Keep(ns, []byte(st.key), token, st.lease); r != st.want {
			sc.t.Fatalf("%s: keep %q token %d for %v = %+v, want %+v", where, st.key, token, st.lease, r, st.want)
		}
	case opAdvance:
		sc.clock.Advance(st.by)
	case opTick:
		sc.e.Tick()
	case opSweep:
		sc.e.Sweep()
	case opCancel:
		if got := sc.e.Cancel(sc.waits[st.owner]); got != st.wantCancelled {
			sc.t.Fatalf("%s: cancel %d = %v, want %v", where, st.owner, got, st.wantCancelled)
		}
	case opShutdown:
		sc.e.Shutdown()
	case opStats:
		s := sc.e.Stats()
		if s.Keys != st.keys || s.Waiters != st.waiters || s.Inflight != st.waiters {
			sc.t.Fatalf("%s: stats keys=%d waiters=%d inflight=%d, want keys=%d waiters=inflight=%d",
				where, s.Keys, s.Waiters, s.Inflight, st.keys, st.waiters)
		}
	default:
		sc.t.Fatalf("%s: unknown op %d", where, st.op)
	}
}

const sec = time.Second

// TestScenarios covers the engine's own mechanics beside the rules:
// cancellation, the sweep, shutdown, and its counts.
func TestScenarios(t *testing.T) {
	tests := []struct {
		name  string
		steps []step
	}{
		{"tokens increase across release, expiry, sweep and reuse", []step{
			acquire("a", 1, 10*sec, 0, granted(1, 0)),
			release("a", 1, Released), // free entry kept
			acquire("a", 2, 10*sec, 0, granted(2, 0)),
			advance(10 * sec), // expired, not swept
			acquire("a", 3, 10*sec, 0, granted(3, 0)),
			advance(10 * sec),
			sweep(), // entry deleted
			stats(0, 0),
			acquire("a", 4, 10*sec, 0, granted(4, 0)),
			release("a", 4, Released),
			sweep(), // free entry deleted
			acquire("a", 5, 10*sec, 30*sec, granted(5, 0)),
			acquire("a", 6, 10*sec, 30*sec, outcome(Queued)),
			release("a", 5, Released).resolves(res(6, granted(6, 0))),
		}},
		{"a cancelled waiter is never resolved and the next one gets the lock", []step{
			acquire("a", 1, 10*sec, 0, granted(1, 0)),
			acquire("a", 2, 10*sec, 5*sec, outcome(Queued)),
			acquire("a", 3, 10*sec, 30*sec, outcome(Queued)),
			stats(1, 2),
			cancel(2, true),
			cancel(2, false),
			cancel(99, false), // never queued: a nil *Wait
			stats(1, 1),
			advance(5 * sec),
			tick(),
			advance(1 * sec),
			release("a", 1, Released).resolves(res(3, granted(2, 6*sec))),
			cancel(3, false),
			release("a", 3, Released),
		}},
		{"cancelling the last waiter leaves the lock to its holder", []step{
			acquire("a", 1, 10*sec, 0, granted(1, 0)),
			acquire("a", 2, 10*sec, 30*sec, outcome(Queued)),
			cancel(2, true),
			advance(10 * sec),
			tick(), // the lease timer is stale now
			stats(1, 0),
			release("a", 1, NotHeld),
			stats(0, 0),
		}},
		{"shutdown resolves every waiter and refuses acquires", []step{
			acquire("a", 1, 10*sec, 0, granted(1, 0)),
			acquire("a", 2, 10*sec, 10*sec, outcome(Queued)),
			acquire("a", 3, 10*sec, 20*sec, outcome(Queued)),
			acquire("b", 4, 10*sec, 0, granted(2, 0)),
			acquire("b", 5, 10*sec, 30*sec, outcome(Queued)),
			shutdown().resolves(
				res(2, outcome(ShuttingDown)),
				res(3, outcome(ShuttingDown)),
				res(5, outcome(ShuttingDown))),
			stats(2, 0),
			cancel(2, false),
			acquire("c", 6, 10*sec, 0, outcome(ShuttingDown)),
			acquire("a", 7, 10*sec, 5*sec, outcome(ShuttingDown)),
			release("a", 1, Released),
			advance(60 * sec),
			tick(),
		}},
		{"keys without waiters expire lazily and the sweep reclaims them", []step{
			acquire("a", 1, 10*sec, 0, granted(1, 0)),
			acquire("b", 2, 20*sec, 0, granted(2, 0)),
			advance(10 * sec),
			tick(),
			stats(2, 0),
			sweep(),
			stats(1, 0),
			advance(10 * sec),
			sweep(),
			stats(0, 0),
		}},
		{"the sweep leaves expired keys with waiters to the tick", []step{
			acquire("a", 1, 10*sec, 0, granted(1, 0)),
			acquire("a", 2, 10*sec, 60*sec, outcome(Queued)),
			acquire("b", 3, 5*sec, 0, granted(2, 0)),
			advance(20 * sec),
			sweep(),
			stats(1, 1),
			tick().resolves(res(2, granted(3, 20*sec))),
			stats(1, 0),
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			newScript(t, Config{}).run(tt.steps...)
		})
	}
}

func TestTokenExhaustion(t *testing.T) {
	sc := newScript(t, Config{FirstToken: math.MaxUint64 - 1})
	sc.run(
		acquire("a", 1, 10*sec, 0, granted(math.MaxUint64-1, 0)),
		acquire("a", 2, 10*sec, 30*sec, outcome(Queued)),
		acquire("a", 3, 10*sec, 30*sec, outcome(Queued)),
		// The last token goes to the head waiter; the next one finds none.
		release("a", 1, Released).resolves(res(2, granted(math.MaxUint64, 0))),
		release("a", 2, Released).resolves(res(3, outcome(TokenExhausted))),
		stats(0, 0),
		acquire("b", 4, 10*sec, 0, outcome(TokenExhausted)),
		acquire("a", 5, 10*sec, 0, outcome(TokenExhausted)),
		stats(0, 0),
	)
}

func TestFirstToken(t *testing.T) {
	for _, tt := range []struct{ first, want uint64 }{
		{0, 1}, {1, 1}, {1000, 1000}, {math.MaxUint64, math.MaxUint64},
	} {
		t.Run(fmt.Sprint(tt.first), func(t *testing.T) {
			sc := newScript(t, Config{FirstToken: tt.first})
			sc.run(acquire("a", 1, 10*sec, 0, granted(tt.want, 0)))
			if got := sc.e.Stats().LastToken; got != tt.want {
				t.Fatalf("Stats.LastToken = %d, want %d", got, tt.want)
			}
			if tt.want == math.MaxUint64 {
				sc.run(release("a", 1, Released), acquire("a", 2, 10*sec, 0, outcome(TokenExhausted)))
			}
		})
	}
}

func TestTickReportsTheNextDeadline(t *testing.T) {
	sc := newScript(t, Config{})
	if d := sc.e.Tick(); d != math.MaxInt64 {
		t.Fatalf("idle Tick = %v, want math.MaxInt64", d)
	}
	sc.run(
		acquire("a", 1, 10*sec, 0, granted(1, 0)),
		acquire("a", 2, 10*sec, 30*sec, outcome(Queued)),
		advance(4*sec),
	)
	if d := sc.e.Tick(); d != 6*sec {
		t.Fatalf("Tick = %v, want the 6s left of the lease", d)
	}
	sc.run(release("a", 1, Released).resolves(res(2, granted(2, 4*sec))))
	// Both timers are stale now. Stale timers are dropped only when they
	// come due, so Tick may report one: an early wake, never a late one.
	if d := sc.e.Tick(); d != 6*sec {
		t.Fatalf("Tick = %v, want 6s to the stale lease timer", d)
	}
	sc.run(advance(6 * sec))
	if d := sc.e.Tick(); d != 20*sec {
		t.Fatalf("Tick = %v, want 20s to the stale wait timer", d)
	}
	sc.run(advance(20 * sec))
	if d := sc.e.Tick(); d != math.MaxInt64 {
		t.Fatalf("drained Tick = %v, want math.MaxInt64", d)
	}
}

func TestOutcomeString(t *testing.T) {
	for o, want := range map[Outcome]string{
		Granted: "Granted", Queued: "Queued", TimedOut: "TimedOut", Busy: "Busy",
		Released: "Released", NotHeld: "NotHeld", TokenExhausted: "TokenExhausted",
		ShuttingDown: "ShuttingDown", 0: "Outcome(0)", 200: "Outcome(200)",
	} {
		if got := o.String(); got != want {
			t.Errorf("Outcome(%d).String() = %q, want %q", uint8(o), got, want)
		}
	}
}

func TestNamespaceInterning(t *testing.T) {
	e := New(Config{Shards: 1, Clock: NewFakeClock()})
	a, b := e.Namespace("alpha"), e.Namespace("beta")
	if a == b {
		t.Fatalf("distinct tenants share namespace %d", a)
	}
	if e.Namespace("alpha") != a || e.Namespace("beta") != b {
		t.Fatal("interning a tenant twice gave a different namespace")
	}
}

func TestShardsRoundUpToAPowerOfTwo(t *testing.T) {
	for _, tt := range []struct{ in, want int }{{0, 256}, {-3, 256}, {1, 1}, {3, 4}, {16, 16}, {100, 128}} {
		if got := len(New(Config{Shards: tt.in}).shards); got != tt.want {
			t.Errorf("Shards %d -> %d shards, want %d", tt.in, got, tt.want)
		}
	}
}

func TestFreeEntriesAreBoundedAndSweptWhenUnused(t *testing.T) {
	// One shard, MaxKeys 40: at most 40/4 = 10 free entries are kept.
	sc := newScript(t, Config{MaxKeys: 40})
	s := &sc.e.shards[0]
	for i := range 20 {
		key := fmt.Sprint("k", i)
		sc.run(acquire(key, uint64(i+1), 10*sec, 0, granted(uint64(i+1), 0)))
	}
	for i := range 20 {
		sc.run(release(fmt.Sprint("k", i), uint64(i+1), Released))
	}
	if s.table.count != 0 || len(s.free) != 10 {
		t.Fatalf("after releasing 20 keys: %d live, %d free; want none live and 10 free", s.table.count, len(s.free))
	}
	// Three new keys take free entries; the seven left sat unused since
	// the first sweep and go at the second.
	sc.run(stats(0, 0), sweep())
	for i := range 3 {
		sc.run(acquire(fmt.Sprint("n", i), uint64(i+1), 10*sec, 0, granted(uint64(21+i), 0)))
	}
	if len(s.free) != 7 {
		t.Fatalf("%d free after three new keys, want 7", len(s.free))
	}
	sc.run(sweep())
	if s.table.count != 3 || len(s.free) != 0 {
		t.Fatalf("after the second sweep: %d live, %d free; want 3 live and none free", s.table.count, len(s.free))
	}
	// An expired key nobody waits for is retired when touched.
	sc.run(
		acquire("x", 9, 10*sec, 0, granted(24, 0)),
		advance(10*sec),
		releaseToken("x", 24, NotHeld),
	)
	ns, x := sc.e.Namespace("t1"), []byte("x")
	if s.table.get(sc.e.hash(ns, x), ns, x) != nil || len(s.free) != 1 {
		t.Fatalf("expired key touched by release: still live, or %d free, want 1", len(s.free))
	}
}

func TestStaleTimersAreCompacted(t *testing.T) {
	sc := newScript(t, Config{})
	s := &sc.e.shards[0]
	sc.run(acquire("a", 1, 10*sec, 0, granted(1, 0)))
	for owner := uint64(2); owner < 1000; owner++ {
		sc.run(
			acquire("a", owner, 10*sec, 200*sec, outcome(Queued)),
			cancel(owner, true),
		)
	}
	if n := len(s.timers); n > 4*s.waiting+minCompact {
		t.Fatalf("%d timers kept for %d waiters", n, s.waiting)
	}
}

func TestKeysSpreadOverShards(t *testing.T) {
	e := New(Config{Shards: 64, Clock: NewFakeClock()})
	perShard := make(map[*shard]int)
	for _, tenant := range []string{"a", "b"} {
		ns := e.Namespace(tenant)
		for i := range 3200 {
			s, _ := e.locate(ns, fmt.Appendf(nil, "job/%d", i))
			perShard[s]++
		}
	}
	// 100 keys per shard on average; a poor mix would leave shards empty or
	// crowded.
	for _, n := range perShard {
		if n < 50 || n > 150 {
			t.Fatalf("a shard got %d of 6400 keys", n)
		}
	}
	if len(perShard) != 64 {
		t.Fatalf("%d of 64 shards used", len(perShard))
	}
}

// Compaction may drop a held key's lease timer while the key momentarily
// has no waiters (its only waiter cancelled); the next waiter must still be
// handed the lock when the lease ends, by the timer, not by chance traffic.
func TestLeaseTimerSurvivesCompaction(t *testing.T) {
	clock := NewFakeClock()
	e := New(Config{Shards: 1, Clock: clock})
	ns := e.Namespace("t")
	rec := &recorder{}
	if r, _ := e.Acquire(ns, []byte("K"), 1, 0, 30*time.Second, 0, rec); r.Outcome != Granted {
		t.Fatalf("first acquire: %v", r.Outcome)
	}
	_, w := e.Acquire(ns, []byte("K"), 2, 0, 30*time.Second, 255*time.Second, rec)
	e.Cancel(w) // its connection closed: K has no waiters, its lease timer is stale
	e.Acquire(ns, []byte("X"), 3, 0, time.Hour, 0, rec)
	for owner := uint64(100); owner < 100+2*minCompact; owner++ {
		_, w := e.Acquire(ns, []byte("X"), owner, 0, time.Hour, 255*time.Second, rec)
		e.Cancel(w) // stale timers pile up until the shard compacts them
	}
	if _, w := e.Acquire(ns, []byte("K"), 4, 0, 30*time.Second, 255*time.Second, rec); w == nil {
		t.Fatal("the acquire of a held key did not queue")
	}
	rec.take()
	clock.Advance(30 * time.Second)
	e.Tick()
	if got := rec.take(); len(got) != 1 || got[0].owner != 4 || got[0].r.Outcome != Granted {
		t.Fatalf("at K's lease end: %+v, want owner 4 Granted", got)
	}
}

// A holder renewing while a waiter queues leaves one stale lease timer per
// renewal: they are compacted, and the lease in force still hands off on
// time.
func TestRenewalsLeaveNoPileOfTimers(t *testing.T) {
	sc := newScript(t, Config{})
	s := &sc.e.shards[0]
	sc.run(
		acquire("a", 1, 10*sec, 0, granted(1, 0)),
		acquire("a", 2, 10*sec, 255*sec, outcome(Queued)),
	)
	for range 200 {
		sc.run(advance(1*sec), keep("a", 1, 10*sec, renewed(1)), tick())
	}
	if n := len(s.timers); n > 4*s.waiting+minCompact {
		t.Fatalf("%d timers kept for %d waiters", n, s.waiting)
	}
	sc.run(
		advance(10*sec-1),
		tick(),
		advance(1),
		tick().resolves(res(2, granted(2, 210*sec))),
	)
}
