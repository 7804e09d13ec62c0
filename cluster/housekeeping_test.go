package cluster

import (
	"testing"
	"time"

	"github.com/lockd/lockd/engine"
	"github.com/valyala/bytebufferpool"
)

// Answered requests do not pile up in the node's timer heap until their
// deadlines: with a 60 s propose timeout every request below would
// otherwise stay there for a minute.
func TestAnsweredRequestsLeaveTheTimerHeap(t *testing.T) {
	tc := newTestCluster(t, 3, func(c *Config) { c.ProposeTimeout = time.Minute })
	rec := newRecorder()
	n := tc.node(1)
	owner := uint64(0)
	for i := range 200 {
		owner++
		r := acquire(t, n, rec, owner, "heap", 30*time.Second, 0)
		if r.Outcome != engine.Granted {
			t.Fatalf("cycle %d: acquire %+v", i, r)
		}
		owner++
		if rr := release(t, n, rec, owner, "heap", r.Token); rr.Outcome != engine.Released {
			t.Fatalf("cycle %d: release %+v", i, rr)
		}
	}
	n.regMu.Lock()
	timers, live := len(n.timers), len(n.reg)
	n.regMu.Unlock()
	if timers > 64+3*live {
		t.Fatalf("%d timer entries for %d live requests after 400 answered ones", timers, live)
	}
}

// An orphaned grant whose release proposal was given up (its group had
// no quorum for the whole propose timeout) is released again once the
// group is back, long before its lease would end.
func TestGivenUpOrphanReleaseIsRetried(t *testing.T) {
	tc := newTestCluster(t, 3, func(c *Config) { c.ProposeTimeout = 300 * time.Millisecond })
	rec := newRecorder()
	const key = "orphan-retry"
	n := tc.node(1)
	r := acquire(t, n, rec, 1, key, time.Minute, 0)
	if r.Outcome != engine.Granted {
		t.Fatal(r)
	}
	tc.stop(2)
	tc.stop(3)
	g := n.groups[n.GroupOf("default", []byte(key))]
	failed := n.ClusterStats().ProposeFailures
	g.orphan(lockKey([]byte("default"), []byte(key)), r.Token) // as if its waiter had gone
	waitUntil(t, 10*time.Second, "the orphan release to be given up", func() bool {
		return n.ClusterStats().ProposeFailures > failed
	})
	tc.restart(2)
	tc.restart(3)
	waitUntil(t, 20*time.Second, "the orphaned lock to be released", func() bool {
		return n.Token("default", []byte(key)) == 0
	})
}

// A request a follower forwarded to a leader that then died is proposed
// again as soon as the follower sees the group's new leader. With an
// attempt timeout of an hour it would otherwise be answered E unavailable
// at its propose timeout.
func TestForwardedRequestFollowsTheNewLeader(t *testing.T) {
	tc := newTestCluster(t, 3, func(c *Config) {
		c.ProposeTimeout = 30 * time.Second
		c.FixedLeaders = true
		c.AttemptTimeout = time.Hour // only a leader change can send it again
	})
	rec := newRecorder()
	const key = "forwarded"
	leader := tc.leaderOf(key)
	via := 1 + leader%3
	n := tc.node(via)
	tc.stop(leader) // the follower learns of it only at its election timeout
	startAcquire(t, n, rec, 1, key, 30*time.Second, 0)
	if r := rec.wait(t, 1, 15*time.Second); r.Outcome != engine.Granted {
		t.Fatalf("acquire forwarded to a dead leader: %+v", r)
	}
	if leader == n.Leader(n.GroupOf("default", []byte(key))) {
		t.Fatal("the dead node still leads the group")
	}
}

// A batch sent with less time left than dragonboat's smallest timeout
// (one tick) is still proposed and applied, not refused with a warning.
func TestNearDeadlineBatchIsProposed(t *testing.T) {
	tc := newTestCluster(t, 1, nil)
	rec := newRecorder()
	const key = "near-deadline"
	n := tc.node(1)
	r := acquire(t, n, rec, 1, key, time.Minute, 0)
	if r.Outcome != engine.Granted {
		t.Fatal(r)
	}
	g := n.groups[n.GroupOf("default", []byte(key))]
	b := appendRelease(make([]byte, headerLen), n.cfg.NodeID, 0, r.Token, "default", []byte(key))
	putHeader(b, time.Now().UnixNano(), 1)
	failed := n.ClusterStats().ProposeFailures
	g.slots <- struct{}{} // the slot the watcher gives back
	if !g.send(n.ctx, &bytebufferpool.ByteBuffer{B: b}, time.Now().Add(time.Millisecond)) {
		t.Fatalf("a batch 1 ms from its deadline was not proposed (%d failures before, %d after)", failed, n.ClusterStats().ProposeFailures)
	}
	waitUntil(t, 10*time.Second, "the release to apply", func() bool { return n.Token("default", []byte(key)) == 0 })
	if got := n.ClusterStats().ProposeFailures; got != failed {
		t.Fatalf("propose failures went from %d to %d", failed, got)
	}
}
