package cluster

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/lockd/lockd/engine"
	"github.com/lockd/lockd/engine/rulestest"
)

// groupWrapper drives one group's replicated state the way the nodes do,
// on a fake clock: every command is a batch the group's leader dates with
// its monotonic clock (clock.go), the fake clock; Tick is the node's wait
// timers (TimedOut for a wait that elapsed) and then the leader's
// housekeeping (a lease end for every lease due on its clock); a queued
// request is answered once, by whichever comes first, as the node's
// request registry does. Cancel is the node's Cancel: the request leaves
// the registry and its replicated queue entry leaves by a cancel command,
// so no grant is ever handed to a request nobody waits for (the node
// releases such a grant, orphans.go, when a cancel applies too late).
type groupWrapper struct {
	s       replicated
	now     time.Duration
	term    uint64        // the leader's, which dates every batch
	lead    leadership    // the leader's
	index   uint64        // of the last batch applied
	stampAt time.Duration // now at the last batch applied
	// datedAt is when the leader applied the last batch: at once, but
	// for a new leader, whenever changeLeader says.
	datedAt  time.Duration
	nextID   uint64
	keyLimit uint32                    // the proposer's share of MaxKeys, carried in each acquire
	waiting  map[uint64]waitingAcquire // by owner: queued and unanswered
	resolved []rulestest.Resolution
	out      applied
}

// waitingAcquire is a queued acquire as its node's registry knows it.
type waitingAcquire struct {
	deadline    time.Duration // of its wait
	tenant, key string
}

func newGroupWrapper() *groupWrapper { return newLimitedGroupWrapper(rulestest.Limits{}) }

// newLimitedGroupWrapper is a group whose acquires carry l.MaxKeys as their
// key limit. The waiters and in-flight gates are the node's own, outside
// the replicated state, so l.MaxWaiters and l.MaxInflight do not apply.
func newLimitedGroupWrapper(l rulestest.Limits) *groupWrapper {
	keyLimit := uint32(1 << 20)
	if l.MaxKeys > 0 {
		keyLimit = uint32(l.MaxKeys)
	}
	w := &groupWrapper{
		s: newReplicated(1), now: 1_700_000_000 * time.Second, nextID: 1 << 40,
		keyLimit: keyLimit, waiting: make(map[uint64]waitingAcquire), term: 1,
	}
	w.s.format = logFormat5
	// The group's time and the leader's clock start together.
	w.s.now, w.stampAt, w.datedAt = w.now, w.now, w.now
	w.s.date(w.lead.stamp(w.term, 1, 1, w.now, 0, appliedBatch{at: w.now}), 0, &w.out)
	return w
}

// changeLeader is an election: the leader of the next term, which applied
// the last batch lag after it was stamped, dates the batches from now on.
func (w *groupWrapper) changeLeader(lag time.Duration) {
	w.term++
	w.datedAt = w.stampAt + lag
}

// groupNow is the group's time as the leader's clock says it is now: its
// time at the last batch, plus the leader's time since.
func (w *groupWrapper) groupNow() time.Duration { return w.s.now + w.now - w.stampAt }

var _ rulestest.AbandonWrapper = (*groupWrapper)(nil)

// apply runs c and returns the answer to request id, routing the others.
func (w *groupWrapper) apply(c *command, id uint64) engine.Result {
	w.index++
	last := appliedBatch{index: w.s.clock.dated, at: w.datedAt, term: w.s.clock.term, now: w.s.now}
	w.s.date(w.lead.stamp(w.term, 1, 1, w.now, w.index-1, last), w.index, &w.out)
	w.stampAt, w.datedAt = w.now, w.now
	w.s.apply(c, &w.out)
	w.s.endBatch()
	var got engine.Result
	for _, a := range w.out.answers {
		switch {
		case a.kind == answerDirect && a.id == id:
			got = a.r
		default: // a hand-off, or a waiter an abandon dropped
			w.answer(a.id, a.r)
		}
	}
	w.out.answers = w.out.answers[:0]
	w.out.leases = w.out.leases[:0]
	return got
}

func (w *groupWrapper) answer(owner uint64, r engine.Result) {
	if _, ok := w.waiting[owner]; ok {
		delete(w.waiting, owner)
		w.resolved = append(w.resolved, rulestest.Resolution{Owner: owner, Result: r})
	}
}

func (w *groupWrapper) request() uint64 { w.nextID++; return w.nextID }

func (w *groupWrapper) Acquire(tenant, key string, owner uint64, lease, wait time.Duration) engine.Result {
	return w.AcquireFor(tenant, key, owner, 0, lease, wait)
}

// AcquireFor is the node's Acquire of a session's request: a cmdAcquireBy
// carrying its requester (the group is at log format 4).
func (w *groupWrapper) AcquireFor(tenant, key string, owner uint64, r engine.Requester, lease, wait time.Duration) engine.Result {
	kind := byte(cmdAcquire)
	if r != 0 {
		kind = cmdAcquireBy
	}
	c := command{kind: kind, node: 1, id: owner, requester: r, lease: uint16(lease / time.Second), wait: int64(wait), keyLimit: w.keyLimit, tenant: []byte(tenant), key: []byte(key)}
	// Registered before it is proposed, as the node registers it.
	if wait > 0 {
		w.waiting[owner] = waitingAcquire{deadline: w.now + wait, tenant: tenant, key: key}
	}
	got := w.apply(&c, owner)
	if got.Outcome != engine.Queued {
		delete(w.waiting, owner)
	}
	return got
}

// Abandon is the node's Abandon: a cmdAbandon, answered to its own
// request; a waiter it drops is answered TimedOut through the registry.
func (w *groupWrapper) Abandon(tenant, key string, r engine.Requester) engine.Result {
	id := w.request()
	c := command{kind: cmdAbandon, node: 1, id: id, requester: r, tenant: []byte(tenant), key: []byte(key)}
	return w.apply(&c, id)
}

func (w *groupWrapper) Release(tenant, key string, token uint64) engine.Result {
	id := w.request()
	c := command{kind: cmdRelease, node: 1, id: id, token: token, tenant: []byte(tenant), key: []byte(key)}
	return w.apply(&c, id)
}

func (w *groupWrapper) Keep(tenant, key string, token uint64, lease time.Duration) engine.Result {
	id := w.request()
	k := lockKey([]byte(tenant), []byte(key))
	var renewals uint32
	if l := w.s.locks[k]; l != nil && l.Token == token {
		renewals = l.renewals
	}
	c := command{kind: cmdKeep, node: 1, id: id, token: token, renewals: renewals, lease: uint16(lease / time.Second), tenant: []byte(tenant), key: []byte(key)}
	return w.apply(&c, id)
}

// Cancel is Node.Cancel: the registry forgets the request and, as it was
// queued, the cancel command removes its replicated entry. It reports
// whether the request was still waiting.
func (w *groupWrapper) Cancel(owner uint64) bool {
	a, queued := w.waiting[owner]
	if !queued {
		return false
	}
	delete(w.waiting, owner)
	c := command{kind: cmdCancel, node: 1, id: owner, tenant: []byte(a.tenant), key: []byte(a.key)}
	w.apply(&c, 0)
	return true
}

func (w *groupWrapper) Advance(d time.Duration) { w.now += d }

func (w *groupWrapper) Tick() {
	// What fell due, in the order of the instants it fell due at, as the
	// engine's timer heap and the node's timers with the leader's lease
	// heap take them.
	type event struct {
		at    time.Duration
		owner uint64 // a wait that elapsed
		key   string // a lease that ran out
	}
	var due []event
	for owner, a := range w.waiting {
		if a.deadline <= w.now {
			due = append(due, event{at: a.deadline, owner: owner})
		}
	}
	now := w.groupNow()
	for k, l := range w.s.locks {
		if l.Lapsed(now) {
			due = append(due, event{at: l.End + w.now - now, key: k})
		}
	}
	slices.SortFunc(due, func(a, b event) int {
		return cmp.Or(cmp.Compare(a.at, b.at), cmp.Compare(a.owner, b.owner), cmp.Compare(a.key, b.key))
	})
	for _, e := range due {
		if e.key == "" {
			w.answer(e.owner, engine.Result{Outcome: engine.TimedOut})
			continue
		}
		l := w.s.locks[e.key]
		if l == nil || !l.Lapsed(w.groupNow()) {
			continue
		}
		tenant, key := splitLockKey(e.key)
		c := command{kind: cmdLeaseEnd, tenant: []byte(tenant), key: key}
		w.apply(&c, 0)
	}
}

func (w *groupWrapper) Resolutions() []rulestest.Resolution {
	r := w.resolved
	w.resolved = nil
	return r
}

// The cluster's state machine answers the lock rules' scripts as the
// engine does (engine.TestRuleScenarios): a lapsed lease is free, a late
// release or keep is NotHeld, judged on the group's clock.
func TestRuleScenarios(t *testing.T) {
	rulestest.Run(t, func(*testing.T) rulestest.Wrapper { return newGroupWrapper() })
}

// TestModelCheck runs the model check (engine/rulestest) on a group's
// replicated state, driven as the nodes drive it: 8 seeds × 200k steps
// (25k with -short), as in engine; the even seeds' key limit binds through
// the replicated keys gate (the waiters and in-flight gates are the
// node's, outside the replicated state). A failure names its seed and
// step; rerun it alone with -model.seed.
//
// A dropped connection's queued acquires leave the replicated queue by
// cancel commands, as Node.Cancel proposes them. A cancel that only
// forgot the request on its node left the entry to be handed a lapsed
// lock and released as an orphan, and until that release committed an
// acquire there was queued or answered TimedOut where SPEC §5 grants it:
// every seed failed (seed 15 at step 1124).
func TestModelCheck(t *testing.T) {
	rulestest.CheckModel(t, rulestest.ModelRun{
		Package: "./cluster", Steps: 200_000, ShortSteps: 25_000,
		New: func(l rulestest.Limits) rulestest.Wrapper { return newLimitedGroupWrapper(l) },
	})
}

// Random histories of acquires, releases, keeps and time on one key get
// the same answers from the engine and from the cluster's state machine,
// step by step; whether those answers keep the lock rules is the model
// check's to say (TestModelCheck, here and in engine).
// One key, because the rules are per key and because on several keys two
// leases that end at the same instant are taken in an order neither mode
// promises, which numbers the tokens they hand off differently.
func TestRulesAgreeWithTheEngine(t *testing.T) {
	for seed := uint64(1); seed <= 8; seed++ {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 99))
			single, group := rulestest.NewEngineWrapper(engine.Config{Shards: 1}), newGroupWrapper()
			// Releases and keeps mostly name a recent grant, so that many
			// are current and some are late; the rest name any token.
			type holding struct {
				tenant, key string
				token       uint64
			}
			var grants []holding
			pick := func() (string, string, uint64) {
				switch {
				case len(grants) > 0 && rng.IntN(4) > 0:
					h := grants[max(0, len(grants)-1-rng.IntN(8))]
					return h.tenant, h.key, h.token
				case rng.IntN(2) == 0:
					return []string{"t1", "t2"}[rng.IntN(2)], []string{"k", "other"}[rng.IntN(2)], uint64(rng.IntN(len(grants) + 2))
				}
				return "t1", "k", uint64(rng.IntN(len(grants) + 2))
			}
			exercised := map[engine.Outcome]int{}
			owner := uint64(0)
			for step := range 5000 {
				// Every call at its own instant, so that no two deadlines
				// tie and the order things fall due in is the same for both.
				d := time.Duration(1 + rng.IntN(1_000_000))
				single.Advance(d)
				group.Advance(d)
				// Acquires all go to t1/k; a release or keep sometimes names
				// another tenant's key of the same name, or another key.
				tenant, key := "t1", "k"
				lease := time.Duration(1+rng.IntN(8)) * time.Second
				var a, b engine.Result
				var what string
				switch rng.IntN(10) {
				case 0, 1, 2:
					owner++
					var wait time.Duration
					if rng.IntN(3) > 0 {
						wait = time.Duration(1+rng.IntN(8)) * time.Second
					}
					what = fmt.Sprintf("acquire %s/%s %d lease=%v wait=%v", tenant, key, owner, lease, wait)
					a, b = single.Acquire(tenant, key, owner, lease, wait), group.Acquire(tenant, key, owner, lease, wait)
					if a.Outcome == engine.Granted {
						grants = append(grants, holding{tenant, key, a.Token})
					}
				case 3, 4:
					tenant, key, token := pick()
					what = fmt.Sprintf("release %s/%s token=%d", tenant, key, token)
					a, b = single.Release(tenant, key, token), group.Release(tenant, key, token)
				case 5, 6:
					tenant, key, token := pick()
					what = fmt.Sprintf("keep %s/%s token=%d lease=%v", tenant, key, token, lease)
					a, b = single.Keep(tenant, key, token, lease), group.Keep(tenant, key, token, lease)
				default:
					d := time.Duration(rng.IntN(1500)) * time.Millisecond
					what = fmt.Sprintf("advance %v; tick", d)
					single.Advance(d)
					group.Advance(d)
					single.Tick()
					group.Tick()
				}
				if a != b {
					t.Fatalf("step %d: %s: engine %+v, cluster %+v", step, what, a, b)
				}
				exercised[a.Outcome]++
				ra, rb := sorted(single.Resolutions()), sorted(group.Resolutions())
				if !slices.Equal(ra, rb) {
					t.Fatalf("step %d: %s: engine resolved %v, cluster %v", step, what, ra, rb)
				}
				for _, r := range ra {
					exercised[r.Result.Outcome]++
					if r.Result.Outcome == engine.Granted {
						grants = append(grants, holding{"t1", "k", r.Result.Token})
					}
				}
			}
			for _, o := range []engine.Outcome{engine.Granted, engine.Queued, engine.TimedOut, engine.Released, engine.NotHeld, engine.Renewed} {
				if exercised[o] == 0 {
					t.Fatalf("the history never produced %v: %v", o, exercised)
				}
			}
		})
	}
}

func sorted(rs []rulestest.Resolution) []rulestest.Resolution {
	slices.SortFunc(rs, func(a, b rulestest.Resolution) int { return cmp.Compare(a.Owner, b.Owner) })
	return rs
}

// A cancelled acquire leaves the replicated queue and nobody is answered:
// a lock that frees later goes to the live waiter behind it with the next
// token, none spent on the cancelled entry. A cancel applied again, or
// naming an entry not queued (yet), changes nothing.
func TestCancelledWaiterLeavesTheQueue(t *testing.T) {
	w := newGroupWrapper()
	if r := w.Acquire("t1", "k", 1, 5*time.Second, 0); r.Outcome != engine.Granted || r.Token != 1 {
		t.Fatalf("first acquire: %+v", r)
	}
	for owner := uint64(2); owner <= 3; owner++ {
		if r := w.Acquire("t1", "k", owner, 5*time.Second, 10*time.Second); r.Outcome != engine.Queued {
			t.Fatalf("acquire of owner %d: %+v, want queued", owner, r)
		}
	}
	if !w.Cancel(2) {
		t.Fatal("cancel of a queued acquire returned false")
	}
	if w.Cancel(2) {
		t.Fatal("a second cancel returned true")
	}
	k := lockKey([]byte("t1"), []byte("k"))
	again := command{kind: cmdCancel, node: 1, id: 2, tenant: []byte("t1"), key: []byte("k")}
	notQueued := command{kind: cmdCancel, node: 1, id: 99, tenant: []byte("t1"), key: []byte("k")}
	otherNode := command{kind: cmdCancel, node: 2, id: 3, tenant: []byte("t1"), key: []byte("k")}
	for _, c := range []*command{&again, &notQueued, &otherNode} {
		w.apply(c, 0)
	}
	if q := w.s.locks[k].queue; len(q) != 1 || q[0].id != 3 || w.s.queued != 1 {
		t.Fatalf("queue %+v (%d queued), want only owner 3", q, w.s.queued)
	}
	if got := w.Resolutions(); len(got) != 0 {
		t.Fatalf("cancels resolved %v", got)
	}
	w.Advance(time.Second)
	if r := w.Release("t1", "k", 1); r.Outcome != engine.Released {
		t.Fatalf("release: %+v", r)
	}
	want := []rulestest.Resolution{{Owner: 3, Result: engine.Result{Outcome: engine.Granted, Token: 2, Waited: time.Second}}}
	if got := w.Resolutions(); !slices.Equal(got, want) {
		t.Fatalf("resolutions %v, want %v", got, want)
	}
}

// Cancelling the head waiter of a lapsed lease grants nothing by itself,
// as in single mode; the lease end that settles the key hands the lock to
// the next live waiter, or frees the key when none is left.
func TestCancelOfTheHeadOfALapsedLease(t *testing.T) {
	w := newGroupWrapper()
	if r := w.Acquire("t1", "k", 1, time.Second, 0); r.Outcome != engine.Granted {
		t.Fatalf("first acquire: %+v", r)
	}
	for owner := uint64(2); owner <= 3; owner++ {
		if r := w.Acquire("t1", "k", owner, 5*time.Second, 10*time.Second); r.Outcome != engine.Queued {
			t.Fatalf("acquire of owner %d: %+v, want queued", owner, r)
		}
	}
	w.Advance(2 * time.Second)
	w.Cancel(2)
	if got := w.Resolutions(); len(got) != 0 {
		t.Fatalf("the cancel resolved %v", got)
	}
	w.Tick()
	want := []rulestest.Resolution{{Owner: 3, Result: engine.Result{Outcome: engine.Granted, Token: 2, Waited: 2 * time.Second}}}
	if got := w.Resolutions(); !slices.Equal(got, want) {
		t.Fatalf("after the lease end: %v, want %v", got, want)
	}
	w.Advance(time.Second)
	if r := w.Acquire("t1", "k", 4, time.Second, 10*time.Second); r.Outcome != engine.Queued {
		t.Fatalf("acquire behind owner 3: %+v", r)
	}
	w.Cancel(4)
	w.Advance(5 * time.Second)
	w.Tick()
	if got := w.Resolutions(); len(got) != 0 {
		t.Fatalf("resolutions %v after the only waiter was cancelled", got)
	}
	if _, held := w.s.locks[lockKey([]byte("t1"), []byte("k"))]; held {
		t.Fatal("a lapsed lease with its only waiter cancelled is still held after its lease end")
	}
}

// A leader change in the middle of a lease: the new leader applied the
// grant 500 ms after its leader stamped it, and then the election took
// 3 s. The group's time goes on from the grant plus the new leader's own
// time since it applied it, so the lease ends 500 ms late on the real
// clock, never early, and the waiter behind it is granted then.
func TestLeaderChangeInTheMiddleOfALease(t *testing.T) {
	w := newGroupWrapper()
	if r := w.Acquire("t1", "k", 1, 10*time.Second, 0); r.Outcome != engine.Granted {
		t.Fatalf("first acquire: %+v", r)
	}
	if r := w.Acquire("t1", "k", 2, 10*time.Second, time.Minute); r.Outcome != engine.Queued {
		t.Fatalf("acquire behind it: %+v", r)
	}
	w.Advance(4 * time.Second)
	w.changeLeader(500 * time.Millisecond)
	w.Advance(6 * time.Second) // 10 s of the lease on the real clock
	w.Tick()
	if r := w.Acquire("t1", "k", 3, time.Second, 0); r.Outcome == engine.Granted {
		t.Fatalf("an acquire 10 s into the lease, 9.5 s on the group's clock, was granted: %+v", r)
	}
	if got := w.Resolutions(); len(got) != 0 {
		t.Fatalf("resolutions %v before the lease ended on the group's clock", got)
	}
	w.Advance(500 * time.Millisecond)
	w.Tick()
	want := []rulestest.Resolution{{Owner: 2, Result: engine.Result{Outcome: engine.Granted, Token: 2, Waited: 10 * time.Second}}}
	if got := w.Resolutions(); !slices.Equal(got, want) {
		t.Fatalf("at 10.5 s: %v, want %v", got, want)
	}
}
