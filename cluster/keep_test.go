package cluster

import (
	"testing"
	"time"

	sm "github.com/lni/dragonboat/v4/statemachine"
	"github.com/lockd/lockd/engine"
)

// applyOne applies one command batch stamped with state-machine time now.
func applyOne(t *testing.T, f *fsm, now int64, cmd func([]byte) []byte) {
	t.Helper()
	b := cmd(make([]byte, headerLen))
	putHeader(b, now, 1)
	if _, err := f.Update(sm.Entry{Cmd: b}); err != nil {
		t.Fatal(err)
	}
}

// keepRequest registers a KEEP's request of owner on n, as Node.Keep
// does, and returns its id.
func keepRequest(n *Node, rec *recorder, owner uint64) uint64 {
	p := &pending{id: n.nextID(), w: rec, owner: owner, start: n.clock(), deadline: n.clock() + time.Minute, ungated: true}
	n.register(p)
	return p.id
}

// A KEEP of the current token renews it in place (same token, new lease,
// a fresh heap entry); the heap entry and any lease end proposed for
// the lease it replaced free nothing, in either format; the lease end of
// the renewal frees the key.
func TestFSMKeepInvalidatesTheOldLeaseEnd(t *testing.T) {
	n, _, f := localNode()
	rec := newRecorder()
	ask := func(owner uint64) uint64 { return keepRequest(n, rec, owner) }
	key := []byte("k")
	k := lockKey([]byte("t"), key)
	now := time.Duration(100)
	f.clock = func() time.Duration { return now }
	applyOne(t, f, 1, func(b []byte) []byte { return appendAcquire(b, 2, 1, 10, 0, 1<<20, 0, "t", key) })
	token := f.state.locks[k].Token

	now = 100 + 5e9
	applyOne(t, f, 2, func(b []byte) []byte { return appendKeep(b, 1, ask(1), token, 0, 30, "t", key) })
	if got := rec.wait(t, 1, time.Second); got != (engine.Result{Outcome: engine.Renewed, Token: token}) {
		t.Fatalf("KEEP of the current token: %+v", got)
	}
	if l := f.state.locks[k]; l.Token != token || l.leaseSeconds != 30 || l.renewals != 1 {
		t.Fatalf("renewed lock %+v", *l)
	}
	if due := f.due(100+10e9, 5e8, nil); len(due) != 0 {
		t.Fatalf("the replaced lease's end reported due: %+v", due)
	}
	// A lease end the leader proposed before the KEEP applied names the
	// replaced lease.
	applyOne(t, f, 3, func(b []byte) []byte { return appendLeaseEnd(b, "t", key) })
	if l := f.state.locks[k]; l == nil || l.Token != token {
		t.Fatal("the replaced lease's end freed the renewed lock")
	}

	// KEEP of another token, or another tenant's key of the same name: N.
	applyOne(t, f, 5, func(b []byte) []byte { return appendKeep(b, 1, ask(2), token+1, 1, 30, "t", key) })
	applyOne(t, f, 6, func(b []byte) []byte { return appendKeep(b, 1, ask(3), token, 1, 30, "u", key) })
	for _, owner := range []uint64{2, 3} {
		if got := rec.wait(t, owner, time.Second); got.Outcome != engine.NotHeld {
			t.Fatalf("owner %d: %+v, want NotHeld", owner, got)
		}
	}
	if l := f.state.locks[k]; l.renewals != 1 {
		t.Fatalf("a refused KEEP renewed: %+v", *l)
	}

	due := f.due(100+35e9, 5e8, nil)
	if len(due) != 1 || due[0].token != token || due[0].renewals != 1 {
		t.Fatalf("renewed lease's end: %+v", due)
	}
	applyOne(t, f, 7, func(b []byte) []byte { return appendLeaseEnd(b, "t", key) })
	if f.state.locks[k] == nil {
		t.Fatal("a lease end applied before the renewed lease ran out on the group's clock freed the key")
	}
	applyOne(t, f, 2+30e9, func(b []byte) []byte { return appendLeaseEnd(b, "t", key) })
	if f.state.locks[k] != nil {
		t.Fatal("the renewed lease's end did not free the key")
	}
	applyOne(t, f, 8, func(b []byte) []byte { return appendKeep(b, 1, ask(4), token, 1, 30, "t", key) })
	if got := rec.wait(t, 4, time.Second); got.Outcome != engine.NotHeld {
		t.Fatalf("KEEP after the lease ended: %+v", got)
	}
}

// A KEEP names the renewal it extends. A retried proposal applied a
// second time names an older one and changes nothing — not even a lease
// the holder has since renewed for longer — and nobody is answered twice;
// a KEEP proposed from a lagging replica whose request still waits is
// proposed again, naming the current renewal.
func TestFSMKeepAppliedTwiceRenewsOnce(t *testing.T) {
	n, g, f := localNode()
	rec := newRecorder()
	ask := func(owner uint64) uint64 { return keepRequest(n, rec, owner) }
	key := []byte("k")
	k := lockKey([]byte("t"), key)
	applyOne(t, f, 1, func(b []byte) []byte { return appendAcquire(b, 2, 1, 10, 0, 1<<20, 0, "t", key) })
	token := f.state.locks[k].Token
	short := func(id uint64) func([]byte) []byte {
		return func(b []byte) []byte { return appendKeep(b, 1, id, token, 0, 5, "t", key) }
	}
	first := ask(1)
	applyOne(t, f, 2, short(first))
	applyOne(t, f, 3, func(b []byte) []byte { return appendKeep(b, 1, ask(2), token, 1, 60, "t", key) })
	for _, owner := range []uint64{1, 2} {
		if got := rec.wait(t, owner, time.Second); got.Outcome != engine.Renewed {
			t.Fatalf("owner %d: %+v", owner, got)
		}
	}
	deadlines := len(f.heap)
	applyOne(t, f, 4, short(first)) // the first KEEP's batch, applied again
	if l := f.state.locks[k]; l.leaseSeconds != 60 || l.renewals != 2 || len(f.heap) != deadlines {
		t.Fatalf("a duplicate KEEP changed the lock: %+v, %d heap entries (was %d)", *l, len(f.heap), deadlines)
	}
	g.mu.Lock()
	queued := g.count
	g.mu.Unlock()
	if queued != 0 {
		t.Fatalf("the duplicate of an answered KEEP was proposed again (%d commands)", queued)
	}

	lagging := ask(3)
	applyOne(t, f, 5, func(b []byte) []byte { return appendKeep(b, 1, lagging, token, 1, 30, "t", key) })
	if _, answered := rec.peek(3); answered || f.state.locks[k].renewals != 2 {
		t.Fatal("a KEEP naming an old renewal took effect or was answered")
	}
	g.mu.Lock()
	var again command
	_, err := readCommand(g.buf, &again)
	g.mu.Unlock()
	if err != nil || again.kind != cmdKeep || again.id != lagging || again.renewals != 2 || again.lease != 30 || again.token != token {
		t.Fatalf("re-proposed %+v (%v), want the waiting KEEP naming renewal 2", again, err)
	}
}

// A leader's rebuild keeps the deadline of the latest renewal, not the
// longer one of the lease it replaced: a KEEP may shorten a lease.
func TestRebuildKeepsTheRenewedDeadline(t *testing.T) {
	f := detachedFSM()
	now := time.Duration(100)
	f.clock = func() time.Duration { return now }
	key := []byte("k")
	applyOne(t, f, 1, func(b []byte) []byte { return appendAcquire(b, 2, 1, 60, 0, 1<<20, 0, "t", key) })
	token := f.state.locks[lockKey([]byte("t"), key)].Token
	now = 100 + 1e9
	applyOne(t, f, 2, func(b []byte) []byte { return appendKeep(b, 2, 0, token, 0, 5, "t", key) })
	f.rebuild(100 + 2e9)
	if len(f.heap) != 1 || f.heap[0].At != 100+1e9+5e9 || f.heap[0].Item.renewals != 1 {
		t.Fatalf("rebuilt heap %+v", f.heap)
	}
}

// Over three nodes on one fake clock: a lock renewed through a follower
// stays held past its granted lease while the group's leader changes,
// keeps its token, and a waiter gets it (with a larger token) only after
// the renewals stop and the last renewed lease ends.
func TestKeepAcrossLeaderChange(t *testing.T) {
	clock := new(fakeClock)
	tc := newTestCluster(t, 3, func(c *Config) {
		c.Clock = clock.now
		c.FixedLeaders = true     // the test moves the leader itself
		c.ForgetAfter = time.Hour // the clock jumps between two messages
	})
	rec := newRecorder()
	const key = "renewed"
	const lease = 2 * time.Second
	leader := tc.leaderOf(key)
	via := 1 + leader%3
	r := acquire(t, tc.node(via), rec, 1, key, lease, 0)
	if r.Outcome != engine.Granted {
		t.Fatal(r)
	}
	token := r.Token
	waiterNode := 1 + via%3
	if waiterNode == leader {
		waiterNode = 1 + waiterNode%3
	}
	startAcquire(t, tc.node(waiterNode), rec, 2, key, lease, 60*time.Second)

	owner := uint64(10)
	renew := func() time.Duration {
		t.Helper()
		for attempt := 0; ; attempt++ {
			owner++
			sent := clock.now()
			got := keep(t, tc.node(via), rec, owner, key, token, lease)
			if got.Outcome == engine.Unavailable && attempt < 10 {
				continue // an election in progress
			}
			if got != (engine.Result{Outcome: engine.Renewed, Token: token}) {
				t.Fatalf("KEEP via %d: %+v", via, got)
			}
			return sent
		}
	}
	var lastSent time.Duration
	for range 4 {
		lastSent = renew()
		tc.advance(clock, lease/4)
	}
	// Hand the group to the waiter's node: the new leader expires leases
	// from its own heap, where the renewal's deadline must be the one.
	tc.transferLeader(key, waiterNode)
	for range 4 {
		lastSent = renew()
		tc.advance(clock, lease/4)
	}
	// Two leases after the grant, once the new leader has applied and
	// dated the last renewal (via answered it), its deadline for the lock
	// is that renewal's, no earlier than its client's own bound.
	fsmOf := func(id uint64) *fsm {
		return tc.node(id).groups[tc.node(id).GroupOf("default", []byte(key))].fsm.Load()
	}
	k := lockKey([]byte("default"), []byte(key))
	viaFSM := fsmOf(via)
	viaFSM.mu.Lock()
	renewals := viaFSM.state.locks[k].renewals
	viaFSM.mu.Unlock()
	var deadline time.Duration
	waitUntil(t, 10*time.Second, "the new leader's deadline for the last renewal", func() bool {
		f := fsmOf(waiterNode)
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, d := range f.heap {
			if e := d.Item; e.key == k && e.token == token && e.renewals == renewals && f.valid(e) {
				deadline = d.At
			}
		}
		return deadline != 0
	})
	if deadline < lastSent+lease {
		t.Fatalf("the new leader ends the renewed lease at %v, before the last renewal's bound %v", deadline, lastSent+lease)
	}
	if r, done := rec.peek(2); done {
		t.Fatalf("the waiter was answered while the lock was renewed: %+v", r)
	}
	tc.advance(clock, deadline-clock.now())
	// From the deadline on the clock runs at twice real time: a lease end
	// lost with a leader is proposed again only once it has moved on.
	var got engine.Result
	waitUntil(t, 20*time.Second, "the waiter's answer", func() bool {
		r, answered := rec.peek(2)
		got = r
		tc.advance(clock, 10*time.Millisecond)
		return answered
	})
	if got.Outcome != engine.Granted || got.Token <= token {
		t.Fatalf("waiter after the renewals stopped: %+v", got)
	}
}

// keep runs a KEEP on n through the Backend and returns its outcome.
func keep(t testing.TB, n *Node, rec *recorder, owner uint64, key string, token uint64, lease time.Duration) engine.Result {
	t.Helper()
	r := n.Keep(n.Namespace("default"), []byte(key), owner, token, lease, rec)
	if r.Outcome != engine.Queued {
		return r
	}
	n.Flush()
	return rec.wait(t, owner, 10*time.Second)
}

// transferLeader moves the leadership of key's group to node to and waits
// until every live node sees it.
func (tc *testCluster) transferLeader(key string, to uint64) {
	tc.t.Helper()
	n := tc.node(to)
	idx := n.GroupOf("default", []byte(key))
	var asked time.Time
	waitUntil(tc.t, 20*time.Second, "leader transfer", func() bool {
		if n.Leader(idx) == to {
			return true
		}
		if time.Since(asked) > 50*time.Millisecond { // once more: Raft gave the last one up
			asked = time.Now()
			_ = n.NodeHost().RequestLeaderTransfer(shardID(len(n.groups), idx), to)
		}
		return false
	})
	for _, other := range tc.nodes {
		if other != nil {
			waitUntil(tc.t, 20*time.Second, "leader seen", func() bool { return other.Leader(idx) == to })
		}
	}
}
