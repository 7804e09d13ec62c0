package cluster

import (
	"fmt"
	"testing"
	"time"

	sm "github.com/lni/dragonboat/v4/statemachine"
	"github.com/lockd/lockd/engine"
)

// The leader hands a group over only to a node that proposed clearly more
// than itself for placementStrikes windows in a row, and at most once per
// cooldown.
func TestLeaderPlacementDecision(t *testing.T) {
	heavy := loadShare{node: 2, commands: 300}
	type step struct {
		at      time.Duration
		leader  bool
		busiest loadShare
		own     uint64
		gather  uint64
		want    uint64
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"two heavy windows move it", []step{
			{1 * time.Second, true, heavy, 10, 0, 0},
			{2 * time.Second, true, heavy, 10, 0, 2},
		}},
		{"one window is not enough", []step{
			{1 * time.Second, true, heavy, 10, 0, 0},
			{2 * time.Second, true, loadShare{2, 5}, 10, 0, 0},
			{3 * time.Second, true, heavy, 10, 0, 0},
		}},
		{"the same node must qualify twice", []step{
			{1 * time.Second, true, heavy, 10, 0, 0},
			{2 * time.Second, true, loadShare{3, 300}, 10, 0, 0},
			{3 * time.Second, true, heavy, 10, 0, 0},
			{4 * time.Second, true, heavy, 10, 0, 2},
		}},
		{"a follower never decides", []step{
			{1 * time.Second, false, heavy, 0, 0, 0},
			{2 * time.Second, false, heavy, 0, 0, 0},
		}},
		{"balanced load stays", []step{
			{1 * time.Second, true, loadShare{2, 300}, 150, 0, 0},
			{2 * time.Second, true, loadShare{2, 300}, 150, 0, 0},
			{3 * time.Second, true, loadShare{2, 300}, 150, 0, 0},
		}},
		{"too little load stays", []step{
			{1 * time.Second, true, loadShare{2, placementMin - 1}, 0, 0, 0},
			{2 * time.Second, true, loadShare{2, placementMin - 1}, 0, 0, 0},
		}},
		{"no other node", []step{
			{1 * time.Second, true, loadShare{}, 500, 0, 0},
			{2 * time.Second, true, loadShare{}, 500, 0, 0},
		}},
		{"unmet transfers back off", []step{
			{1 * time.Second, true, heavy, 0, 0, 0},
			{2 * time.Second, true, heavy, 0, 0, 2}, // Raft gave it up: still leader
			{3 * time.Second, true, heavy, 0, 0, 0},
			{4 * time.Second, true, heavy, 0, 0, 0},
			{2*time.Second + placementCooldown, true, heavy, 0, 0, 2},
			{3*time.Second + placementCooldown, true, heavy, 0, 0, 0},
			{2*time.Second + 3*placementCooldown - time.Second, true, heavy, 0, 0, 0},
			{2*time.Second + 3*placementCooldown, true, heavy, 0, 0, 2}, // after twice the pause
		}},
		{"an idle group gathers after five empty windows", []step{
			{1 * time.Second, true, loadShare{}, 0, 3, 0},
			{2 * time.Second, true, loadShare{}, 0, 3, 0},
			{3 * time.Second, true, loadShare{}, 0, 3, 0},
			{4 * time.Second, true, loadShare{}, 0, 3, 0},
			{5 * time.Second, true, loadShare{}, 0, 3, 3},
		}},
		{"one command restarts the idle count", []step{
			{1 * time.Second, true, loadShare{}, 0, 3, 0},
			{2 * time.Second, true, loadShare{}, 0, 3, 0},
			{3 * time.Second, true, loadShare{}, 0, 3, 0},
			{4 * time.Second, true, loadShare{}, 0, 3, 0},
			{5 * time.Second, true, loadShare{}, 1, 3, 0},
			{6 * time.Second, true, loadShare{}, 0, 3, 0},
			{7 * time.Second, true, loadShare{}, 0, 3, 0},
			{8 * time.Second, true, loadShare{}, 0, 3, 0},
			{9 * time.Second, true, loadShare{}, 0, 3, 0},
			{10 * time.Second, true, loadShare{}, 0, 3, 3},
		}},
		{"a group that must stay never gathers", []step{ // it holds a lock, or this node leads group 0
			{1 * time.Second, true, loadShare{}, 0, 0, 0},
			{2 * time.Second, true, loadShare{}, 0, 0, 0},
			{3 * time.Second, true, loadShare{}, 0, 0, 0},
			{4 * time.Second, true, loadShare{}, 0, 0, 0},
			{5 * time.Second, true, loadShare{}, 0, 0, 0},
			{6 * time.Second, true, loadShare{}, 0, 0, 0},
		}},
		{"an unmet gathering backs off like a move", []step{
			{1 * time.Second, true, loadShare{}, 0, 3, 0},
			{2 * time.Second, true, loadShare{}, 0, 3, 0},
			{3 * time.Second, true, loadShare{}, 0, 3, 0},
			{4 * time.Second, true, loadShare{}, 0, 3, 0},
			{5 * time.Second, true, loadShare{}, 0, 3, 3}, // Raft gave it up: still leader
			{6 * time.Second, true, loadShare{}, 0, 3, 0},
			{7 * time.Second, true, loadShare{}, 0, 3, 0},
			{8 * time.Second, true, loadShare{}, 0, 3, 0},
			{9 * time.Second, true, loadShare{}, 0, 3, 0},
			{5*time.Second + placementCooldown, true, loadShare{}, 0, 3, 3}, // still leader
			{11 * time.Second, true, loadShare{}, 0, 3, 0},
			{12 * time.Second, true, loadShare{}, 0, 3, 0},
			{13 * time.Second, true, loadShare{}, 0, 3, 0},
			{14 * time.Second, true, loadShare{}, 0, 3, 0},
			{15 * time.Second, true, loadShare{}, 0, 3, 0}, // five empty windows, but the pause doubled
			{5*time.Second + 3*placementCooldown, true, loadShare{}, 0, 3, 3},
		}},
		{"load wins over gathering", []step{
			{1 * time.Second, true, loadShare{}, 0, 3, 0},
			{2 * time.Second, true, loadShare{}, 0, 3, 0},
			{3 * time.Second, true, loadShare{}, 0, 3, 0},
			{4 * time.Second, true, loadShare{}, 0, 3, 0},
			{5 * time.Second, true, heavy, 0, 3, 0},
			{6 * time.Second, true, heavy, 0, 3, 2},
		}},
		{"losing leadership resets the back-off", []step{
			{1 * time.Second, true, heavy, 0, 0, 0},
			{2 * time.Second, true, heavy, 0, 0, 2},
			{3 * time.Second, false, heavy, 0, 0, 0}, // handed over
			{30 * time.Second, true, heavy, 0, 0, 0}, // leader again, later
			{31 * time.Second, true, heavy, 0, 0, 2},
			{32 * time.Second, true, heavy, 0, 0, 0},
			{31*time.Second + placementCooldown, true, heavy, 0, 0, 2}, // the base pause again
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var p leaderPlacement
			for i, s := range tc.steps {
				if got := p.observe(s.at, s.leader, s.busiest, s.own, s.gather); got != s.want {
					t.Fatalf("step %d at %v: moved to %d, want %d", i, s.at, got, s.want)
				}
			}
		})
	}
}

// A hand-over decided is asked for at its scheduled instant, once, and
// not at all by a node that stopped leading meanwhile.
func TestHandOverWaitsItsSettle(t *testing.T) {
	var p leaderPlacement
	if to, wait := p.handOver(0, true); to != 0 || wait != 0 {
		t.Fatalf("nothing scheduled: got %d, wait %v", to, wait)
	}
	p.schedule(2, 100*time.Millisecond)
	if to, wait := p.handOver(80*time.Millisecond, true); to != 0 || wait != 20*time.Millisecond {
		t.Fatalf("before its instant: got %d, wait %v; want 0, 20ms", to, wait)
	}
	if to, _ := p.handOver(100*time.Millisecond, true); to != 2 {
		t.Fatalf("at its instant: got %d, want 2", to)
	}
	if to, wait := p.handOver(200*time.Millisecond, true); to != 0 || wait != 0 {
		t.Fatalf("asked twice: got %d, wait %v", to, wait)
	}
	p.schedule(3, 300*time.Millisecond)
	if to, _ := p.handOver(250*time.Millisecond, false); to != 0 {
		t.Fatalf("a follower asked for a hand-over to %d", to)
	}
	if to, wait := p.handOver(400*time.Millisecond, true); to != 0 || wait != 0 {
		t.Fatalf("leadership lost, then back: the stale hand-over to %d came back (wait %v)", to, wait)
	}
}

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
	if busiest != (loadShare{node: 3, commands: 6}) || own != 2 {
		t.Fatalf("busiest %+v own %d, want node 3 with 6 and own 2", busiest, own)
	}
	if busiest, own = f.takeLoad(1); busiest != (loadShare{}) || own != 0 {
		t.Fatalf("counts not reset: %+v %d", busiest, own)
	}
}

// Traffic that enters through one follower moves its group's leadership
// there, so its requests stop paying the forward and the commit notice.
// The nodes share a fake clock: each burst of traffic fills one placement
// window, and the hand-over is asked while no command is in flight (a
// node applying a commit refuses it, placement.go).
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
		for range placementMin {
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
		tc.advance(clock, placementWindow)
		waitUntil(t, 10*time.Second, "the leader's placement window to close", windowClosed)
		asked := tc.node(leader).ClusterStats().LeaderTransfers
		tc.advance(clock, time.Duration(tc.cfgs[0].HeartbeatRTT)*tc.cfgs[0].RTT) // the hand-over is asked a heartbeat later
		if eventually(2*time.Second, 5*time.Millisecond, func() bool { return n.Leader(group) == via }) {
			break
		}
		if tc.node(leader).ClusterStats().LeaderTransfers > asked {
			tc.advance(clock, placementCooldown<<placementMaxBackoff)
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

// A hand-over asked for is reported given up once, when its asker still
// leads after the longest Raft keeps one pending; a hand-over that
// happened (the asker no longer leads) is not.
func TestHandOverGivenUpIsReportedOnce(t *testing.T) {
	const pending = 500 * time.Millisecond
	var p leaderPlacement
	if up, wait := p.givenUp(time.Second, true, pending); up || wait != 0 {
		t.Fatalf("nothing asked: given up %v, wait %v", up, wait)
	}
	p.asked(time.Second)
	if up, wait := p.givenUp(time.Second+300*time.Millisecond, true, pending); up || wait != 200*time.Millisecond {
		t.Fatalf("still pending: given up %v, wait %v; want false, 200ms", up, wait)
	}
	if up, _ := p.givenUp(time.Second+pending, true, pending); !up {
		t.Fatal("still leader after the hand-over's longest pending: not reported given up")
	}
	if up, wait := p.givenUp(2*time.Second, true, pending); up || wait != 0 {
		t.Fatalf("reported twice: given up %v, wait %v", up, wait)
	}
	p.asked(3 * time.Second)
	if up, _ := p.givenUp(3*time.Second+100*time.Millisecond, false, pending); up {
		t.Fatal("a hand-over that happened reported given up")
	}
	if up, wait := p.givenUp(4*time.Second, true, pending); up || wait != 0 {
		t.Fatalf("leadership lost, then back: the old hand-over reported (given up %v, wait %v)", up, wait)
	}
}
