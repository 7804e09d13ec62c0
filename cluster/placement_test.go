package cluster

import (
	"fmt"
	"testing"
	"time"

	sm "github.com/lni/dragonboat/v4/statemachine"
	"github.com/lockd/lockd/cluster/placement"
	"github.com/lockd/lockd/engine"
	"github.com/lockd/lockd/internal/poll"
)

// The state machine counts each node's acquires and releases (not the
// leader's expiries) and takeLoad reports the busiest other node.
func TestTakeLoadCountsProposers(t *testing.T) {
	f := detachedFSM()
	b := make([]byte, headerLen)
	for i := range 5 {
		b = appendAcquire(b, 3, uint64(2*i+1), 30, 0, 1<<20, 0, "t", []byte{'a', byte(i)})
	}
	for i := range 2 {
		b = appendAcquire(b, 1, uint64(100+2*i+1), 30, 0, 1<<20, 0, "t", []byte{'b', byte(i)})
	}
	b = appendRelease(b, 3, 0, 1, "t", []byte{'a', 0})
	b = appendRelease(b, 2, 7, 1, "t", []byte("x"))
	b = appendLeaseEnd(b, "t", []byte{'a', 1})
	putHeader(b, 1, 10)
	if _, err := f.Update(sm.Entry{Cmd: b}); err != nil {
		t.Fatal(err)
	}

	busiest, own := f.takeLoad(1)
	if busiest != (placement.Load{Node: 3, Commands: 6}) || own != 2 {
		t.Fatalf("busiest %+v own %d, want node 3 with 6 and own 2", busiest, own)
	}
	if busiest, own = f.takeLoad(1); busiest != (placement.Load{}) || own != 0 {
		t.Fatalf("counts not reset: %+v %d", busiest, own)
	}
}

// Traffic that enters through one follower moves its group's leadership
// there, so its requests stop paying the forward and the commit notice.
// The nodes share a fake clock: each burst of traffic fills one placement
// window, and the hand-over is asked while no command is in flight (a
// node applying a commit refuses it, cluster/placement).
func TestLeaderFollowsLoad(t *testing.T) {
	clock := new(fakeClock)
	tc := newTestCluster(t, 3, func(c *Config) {
		c.Clock = clock.now
		c.ForgetAfter = time.Hour // the clock jumps between two messages
	})
	const key = "follow-me"
	leader := tc.leaderOf(key)
	via := 1 + leader%3
	n := tc.node(via)
	group := n.GroupOf("default", []byte(key))
	owner := uint64(0)
	burst := func() { // one window's commands, all through via
		for range placement.MinCommands {
			rec := newRecorder()
			owner++
			r := acquire(t, n, rec, owner, key, 30*time.Second, 0)
			if r.Outcome != engine.Granted {
				t.Fatalf("acquire: %+v", r)
			}
			owner++
			release(t, n, rec, owner, key, r.Token)
		}
	}
	windowClosed := func() bool { // the leader's pass took the window's counts
		f := tc.node(leader).groups[group].fsm.Load()
		f.mu.Lock()
		defer f.mu.Unlock()
		return len(f.load) == 0
	}
	// Each round is one window of traffic through via; two in a row ask
	// for the hand-over (the first may share its window with the pass
	// before it). A hand-over Raft gives up doubles the pause before the
	// next one, which the round after it waits out.
	for round := 0; ; round++ {
		if round == 8 {
			t.Fatalf("group %d still led by %d after %d windows of traffic through node %d (%d leader transfers)",
				group, n.Leader(group), round, via, tc.node(leader).ClusterStats().LeaderTransfers)
		}
		burst()
		tc.advance(clock, placement.Window)
		waitUntil(t, 10*time.Second, "the leader's placement window to close", windowClosed)
		asked := tc.node(leader).ClusterStats().LeaderTransfers
		tc.advance(clock, tc.node(leader).cfg.handOverHold()) // the hand-over is asked once the hold let the target catch up
		if poll.Until(2*time.Second, 5*time.Millisecond, func() bool { return n.Leader(group) == via }) {
			break
		}
		if tc.node(leader).ClusterStats().LeaderTransfers > asked {
			tc.advance(clock, placement.Cooldown<<placement.MaxBackoff)
		}
	}
	if got := tc.node(leader).ClusterStats().LeaderTransfers; got == 0 {
		t.Fatalf("node %d moved no leader, yet group %d is now led by %d", leader, group, via)
	}
}

// With no traffic, every group that holds no lock moves its leadership to
// group 0's leader (one heartbeat batch per peer and tick); a group that
// holds a lock stays where it is until the lock is released.
func TestIdleGroupsGatherOnGroupZerosLeader(t *testing.T) {
	tc := newTestCluster(t, 3, nil)
	n := tc.node(1)
	gatherOn := n.Leader(0)
	elsewhere := 1 + gatherOn%3
	moveAway := func(g int) {
		shard := n.groups[g].shardID
		waitUntil(t, 30*time.Second, fmt.Sprintf("group %d led by node %d", g, elsewhere), func() bool {
			l := n.Leader(g)
			if l != elsewhere && l != 0 {
				if err := tc.node(l).NodeHost().RequestLeaderTransfer(shard, elsewhere); err != nil {
					t.Logf("transfer of group %d: %v", g, err)
				}
			}
			return l == elsewhere
		})
	}
	held := ""
	for i := 0; held == ""; i++ {
		if k := fmt.Sprintf("gather-%d", i); n.GroupOf("default", []byte(k)) == 2 {
			held = k
		}
	}
	rec := newRecorder()
	r := acquire(t, n, rec, 1, held, time.Minute, 0)
	if r.Outcome != engine.Granted {
		t.Fatalf("acquire %q: %+v", held, r)
	}
	// Group 2 goes first, so without its lock it would gather first.
	moveAway(2)
	moveAway(1)
	waitUntil(t, 45*time.Second, fmt.Sprintf("idle groups 1 and 3 led by group 0's leader %d", gatherOn), func() bool {
		return n.Leader(1) == gatherOn && n.Leader(3) == gatherOn
	})
	if l := n.Leader(2); l != elsewhere {
		t.Fatalf("group 2 holds %q, yet its leadership moved from node %d to %d", held, elsewhere, l)
	}
	if got := release(t, n, rec, 2, held, r.Token); got.Outcome != engine.Released {
		t.Fatalf("release %q: %+v", held, got)
	}
	waitUntil(t, 45*time.Second, "group 2 gathers once its lock is released", func() bool {
		return n.Leader(2) == gatherOn
	})
	if l := n.Leader(0); l != gatherOn {
		t.Fatalf("group 0 moved from node %d to %d with no traffic", gatherOn, l)
	}
}
