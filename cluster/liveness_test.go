package cluster

import (
	"testing"
	"time"

	"github.com/lockd/lockd/engine"
)

// A waiter whose node died is dropped from the queue once the group's
// leader has not heard from that node for ForgetAfter: the lock then goes
// to the next waiter, on a live node, at its release — not to the dead
// node's waiter, which nobody could receive, for a whole lease.
func TestDeadNodesWaitersAreDropped(t *testing.T) {
	tc := newTestCluster(t, 3, func(c *Config) { c.FixedLeaders = true })
	rec := newRecorder()
	key := "liveness"
	leader := tc.leaderOf(key)
	dead, live := 1+leader%3, 1+(leader+1)%3
	holder := acquire(t, tc.node(leader), rec, 1, key, time.Minute, 0)
	if holder.Outcome != engine.Granted {
		t.Fatal(holder)
	}
	startAcquire(t, tc.node(dead), rec, 2, key, time.Minute, 30*time.Second)
	waitUntil(t, 10*time.Second, "the doomed waiter queued", func() bool { return queueLen(tc.node(leader), key) == 1 })
	startAcquire(t, tc.node(live), rec, 3, key, time.Minute, 30*time.Second)
	waitUntil(t, 10*time.Second, "the live waiter queued", func() bool { return queueLen(tc.node(leader), key) == 2 })

	tc.stop(dead)
	waitUntil(t, 10*time.Second, "the dead node's waiter dropped", func() bool { return queueLen(tc.node(leader), key) == 1 })
	if r := release(t, tc.node(leader), rec, 4, key, holder.Token); r.Outcome != engine.Released {
		t.Fatalf("release: %+v", r)
	}
	if r := rec.wait(t, 3, 10*time.Second); r.Outcome != engine.Granted || r.Token <= holder.Token {
		t.Fatalf("the live waiter after the release: %+v", r)
	}
}

// A restarted node drops its earlier runs' queued waiters with its first
// proposal in each group, without waiting to be taken for dead.
func TestRestartedNodeDropsItsOldWaiters(t *testing.T) {
	tc := newTestCluster(t, 3, func(c *Config) { c.FixedLeaders = true; c.ForgetAfter = time.Hour })
	rec := newRecorder()
	key := "restart-waiters"
	leader := tc.leaderOf(key)
	restarted := 1 + leader%3
	holder := acquire(t, tc.node(leader), rec, 1, key, time.Minute, 0)
	if holder.Outcome != engine.Granted {
		t.Fatal(holder)
	}
	startAcquire(t, tc.node(restarted), rec, 2, key, time.Minute, 30*time.Second)
	waitUntil(t, 10*time.Second, "the waiter queued", func() bool { return queueLen(tc.node(leader), key) == 1 })
	tc.stop(restarted)
	if queueLen(tc.node(leader), key) != 1 {
		t.Fatal("the waiter was dropped before its node restarted: ForgetAfter did not hold")
	}
	n := tc.restart(restarted)
	waitUntil(t, 20*time.Second, "the old run's waiter dropped", func() bool { return queueLen(tc.node(leader), key) == 0 })
	// The new run's own waiters stay.
	startAcquire(t, n, rec, 3, key, time.Minute, 30*time.Second)
	waitUntil(t, 10*time.Second, "the new run's waiter queued", func() bool { return queueLen(tc.node(leader), key) == 1 })
	if r := release(t, tc.node(leader), rec, 4, key, holder.Token); r.Outcome != engine.Released {
		t.Fatalf("release: %+v", r)
	}
	if r := rec.wait(t, 3, 10*time.Second); r.Outcome != engine.Granted {
		t.Fatalf("the restarted node's new waiter: %+v", r)
	}
}
