package cluster

import (
	"testing"
	"time"

	"github.com/lockd/lockd/engine"
)

// SPEC §5: closing a connection drops its queued waiters. A waiter on
// another node than the holder is cancelled; once the holder's lease
// lapses, an acquire with wait 0 is granted the next token, as in single
// mode: the lapsed lock is neither handed to the cancelled entry nor held
// by an orphan grant awaiting its release.
func TestCancelledWaiterDoesNotHoldALapsedLock(t *testing.T) {
	tc := newTestCluster(t, 3, nil)
	rec := newRecorder()
	const key = "cancel/lapsed"
	held := acquire(t, tc.node(1), rec, 1, key, 3*time.Second, 0)
	if held.Outcome != engine.Granted {
		t.Fatalf("holder: %+v", held)
	}
	h := startAcquire(t, tc.node(2), rec, 2, key, 30*time.Second, 60*time.Second)
	waitUntil(t, 10*time.Second, "the waiter queued", func() bool { return isQueued(tc.node(2), h) })
	tc.node(2).Cancel(h)
	// Node 2's replica has applied the acquire (it is queued there).
	waitUntil(t, 10*time.Second, "the cancelled waiter to leave the replicated queue", func() bool {
		return queueLen(tc.node(2), key) == 0
	})
	if tok := tc.node(2).Token("default", []byte(key)); tok != held.Token {
		t.Fatalf("the queue emptied with the key at token %d, not the holder's %d: the lock passed to the cancelled entry", tok, held.Token)
	}
	waitLeaseEnd(t, tc.node(3), key, held.Token)
	r := acquire(t, tc.node(3), rec, 3, key, 30*time.Second, 0)
	if r.Outcome != engine.Granted || r.Token != held.Token+1 {
		t.Fatalf("acquire with wait 0 after the lease lapsed: %+v, want granted token %d", r, held.Token+1)
	}
	if _, ok := rec.peek(2); ok {
		t.Fatal("the cancelled waiter was answered")
	}
	if n := tc.node(2).ClusterStats().OrphanReleases; n != 0 {
		t.Fatalf("%d orphan releases on the cancelled waiter's node: a grant reached it", n)
	}
}

// A waiter cancelled before its acquire applied (its connection closed
// while the proposal was out) is cancelled when the acquire applies as
// Queued and finds its request gone: its entry does not wait for the lock
// either, and the lock goes to the next acquire when the lease lapses.
func TestWaiterCancelledBeforeItsAcquireApplied(t *testing.T) {
	tc := newTestCluster(t, 3, nil)
	rec := newRecorder()
	const key = "cancel/early"
	held := acquire(t, tc.node(1), rec, 1, key, 3*time.Second, 0)
	if held.Outcome != engine.Granted {
		t.Fatalf("holder: %+v", held)
	}
	n := tc.node(2)
	// Not flushed yet: the acquire waits in its group's next batch.
	r, h := n.Acquire(n.Namespace("default"), []byte(key), 2, 0, 30*time.Second, 60*time.Second, rec)
	if r.Outcome != engine.Queued {
		t.Fatalf("acquire: %+v", r)
	}
	n.Cancel(h)
	n.Flush()
	waitLeaseEnd(t, n, key, held.Token)
	if got := acquire(t, tc.node(3), rec, 3, key, 30*time.Second, 0); got.Outcome != engine.Granted || got.Token != held.Token+1 {
		t.Fatalf("acquire with wait 0 after the lease lapsed: %+v, want granted token %d", got, held.Token+1)
	}
	if _, ok := rec.peek(2); ok {
		t.Fatal("the cancelled waiter was answered")
	}
	if n := n.ClusterStats().OrphanReleases; n != 0 {
		t.Fatalf("%d orphan releases: the cancelled entry was granted", n)
	}
}

// A waiter its group queued but its node's waiters gate refuses is
// answered Busy and leaves the replicated queue, like a cancelled one.
func TestWaiterRefusedByTheWaitersGateLeavesTheQueue(t *testing.T) {
	tc := newTestCluster(t, 3, func(c *Config) { c.MaxWaiters = 2 })
	rec := newRecorder()
	const key = "cancel/busy"
	held := acquire(t, tc.node(1), rec, 1, key, 30*time.Second, 0)
	if held.Outcome != engine.Granted {
		t.Fatalf("holder: %+v", held)
	}
	n := tc.node(2)
	for owner := uint64(2); owner <= 3; owner++ {
		h := startAcquire(t, n, rec, owner, key, 30*time.Second, 60*time.Second)
		waitUntil(t, 10*time.Second, "the waiter queued", func() bool { return isQueued(n, h) })
	}
	if r := acquire(t, n, rec, 4, key, 30*time.Second, 60*time.Second); r.Outcome != engine.Busy {
		t.Fatalf("third waiter on a node with 2 waiters at most: %+v, want busy", r)
	}
	waitUntil(t, 10*time.Second, "the refused waiter to leave the replicated queue", func() bool { return queueLen(n, key) == 2 })
	if rel := release(t, tc.node(1), rec, 5, key, held.Token); rel.Outcome != engine.Released {
		t.Fatalf("release: %+v", rel)
	}
	if r := rec.wait(t, 2, 10*time.Second); r.Outcome != engine.Granted || r.Token != held.Token+1 {
		t.Fatalf("first waiter: %+v, want granted token %d", r, held.Token+1)
	}
}

// waitLeaseEnd waits until n's replica has seen token granted on key and
// then the key freed.
func waitLeaseEnd(t *testing.T, n *Node, key string, token uint64) {
	t.Helper()
	waitUntil(t, 10*time.Second, "the grant to reach the replica", func() bool { return n.Token("default", []byte(key)) >= token })
	waitUntil(t, 20*time.Second, "the lease to end", func() bool { return n.Token("default", []byte(key)) == 0 })
}

// BenchmarkDroppedWaiters measures what a closed connection's queued
// waiters cost now that each leaves its queue by a replicated cancel:
// rounds of 64 waiters on one node queue behind a held key, are cancelled
// together, and the round ends when the node's replica shows the queue
// empty. It reports the commands and proposals per dropped waiter (its
// acquire and its cancel, batched) across the cluster.
func BenchmarkDroppedWaiters(b *testing.B) {
	tc := newTestCluster(b, 3, nil)
	rec := newRecorder()
	const key = "bench/dropped"
	if r := acquire(b, tc.node(1), rec, 1, key, 3600*time.Second, 0); r.Outcome != engine.Granted {
		b.Fatalf("holder: %+v", r)
	}
	n := tc.node(2)
	ns := n.Namespace("default")
	var before [3]ClusterStats
	for i, node := range tc.nodes {
		before[i] = node.ClusterStats()
	}
	const round = 64
	handles := make([]engine.Handle, 0, round)
	owner := uint64(1)
	b.ResetTimer()
	for done := 0; done < b.N; done += round {
		handles = handles[:0]
		for range min(round, b.N-done) {
			owner++
			r, h := n.Acquire(ns, []byte(key), owner, 0, 30*time.Second, 3600*time.Second, rec)
			if r.Outcome != engine.Queued {
				b.Fatalf("acquire: %+v", r)
			}
			handles = append(handles, h)
		}
		n.Flush()
		waitUntil(b, 10*time.Second, "the round queued", func() bool { return isQueued(n, handles[len(handles)-1]) })
		for _, h := range handles {
			n.Cancel(h)
		}
		waitUntil(b, 10*time.Second, "the round cancelled", func() bool { return queueLen(n, key) == 0 })
	}
	b.StopTimer()
	var props, cmds uint64
	for i, node := range tc.nodes {
		s := node.ClusterStats()
		props += s.Proposals - before[i].Proposals
		cmds += s.Commands - before[i].Commands
	}
	b.ReportMetric(float64(cmds)/float64(b.N), "cmds/waiter")
	b.ReportMetric(float64(props)/float64(b.N), "proposals/waiter")
}
