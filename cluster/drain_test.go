package cluster

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockd/lockd/engine"
	"github.com/lockd/lockd/internal/poll"
)

// applyGate holds back, once armed, the batches a node's replicas apply
// (Config.beforeUpdate) until it opens.
type applyGate struct {
	armed   atomic.Bool
	waiting chan struct{} // closed when a batch waits at the gate
	waited  sync.Once
	open    chan struct{}
	opened  sync.Once
}

func newApplyGate() *applyGate {
	return &applyGate{waiting: make(chan struct{}), open: make(chan struct{})}
}

func (g *applyGate) hold() {
	if !g.armed.Load() {
		return
	}
	g.waited.Do(func() { close(g.waiting) })
	<-g.open
}

func (g *applyGate) release() { g.opened.Do(func() { close(g.open) }) }

// A draining leader holds its group's proposals before it hands the group
// over, long enough for a follower whose apply lags behind the commit
// index to catch up: dragonboat's target ignores the TimeoutNow of a
// hand-over while it has committed entries it has not applied, which
// under load it often has. Here both followers' applies wait at a
// gate after the last commit, and the gate opens once the leader holds;
// when Shutdown returns, a follower leads the group. A leader that asked
// at once would be ignored by both, every time, until it gave up and
// still led the group.
func TestDrainWaitsForTheFollowersToApplyBeforeHandingOver(t *testing.T) {
	gates := map[uint64]*applyGate{}
	tc := newTestCluster(t, 3, func(c *Config) {
		c.Groups = 1
		c.FixedLeaders = true
		gate := newApplyGate()
		gates[c.NodeID] = gate
		c.beforeUpdate = gate.hold
	})
	tc.waitReady()
	leader := tc.leaderOf("drain")
	var followers []*applyGate
	for id, gate := range gates {
		if id != leader {
			gate.armed.Store(true)
			followers = append(followers, gate)
			t.Cleanup(gate.release) // before the nodes close
		}
	}

	rec := newRecorder()
	if r := acquire(t, tc.node(leader), rec, 1, "drain", 30*time.Second, 0); r.Outcome != engine.Granted {
		t.Fatalf("acquire: %+v", r)
	}
	for _, gate := range followers {
		select {
		case <-gate.waiting: // it knows of the commit and has not applied it
		case <-time.After(10 * time.Second):
			t.Fatal("a follower's apply of the grant never reached the gate")
		}
	}

	drained := make(chan struct{})
	go func() { defer close(drained); tc.node(leader).Shutdown() }()
	g := tc.node(leader).groups[0]
	held := poll.Until(10*time.Second, time.Millisecond, func() bool {
		select {
		case <-drained:
			return true
		default:
			return g.held() > 0
		}
	})
	for _, gate := range followers {
		gate.release()
	}
	<-drained
	if !held {
		t.Fatal("the drained leader neither held its proposals nor returned")
	}
	if tc.node(leader).Leader(0) == leader {
		t.Fatalf("node %d still leads its group after its drain: the hand-over failed", leader)
	}
	var next uint64
	agreed := poll.Until(10*time.Second, time.Millisecond, func() bool {
		next = tc.node(1).Leader(0)
		for id := uint64(2); id <= 3; id++ {
			if tc.node(id).Leader(0) != next {
				return false
			}
		}
		return next != 0
	})
	if !agreed || next == leader {
		t.Fatalf("after node %d's drain its group's leader is %d (the nodes agree: %v)", leader, next, agreed)
	}
}
