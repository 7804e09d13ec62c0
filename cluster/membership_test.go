package cluster

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/lockd/lockd/engine"
	"github.com/lockd/lockd/internal/loopback"
)

// join starts a new node id on a fresh data dir, waiting to be added.
func (tc *testCluster) join(id uint64) *Node {
	tc.t.Helper()
	ln := loopback.Listeners(tc.t, 1)[0]
	cfg := tc.cfgs[0]
	cfg.NodeID, cfg.Join, cfg.RaftListener = id, true, ln
	cfg.Peers = map[uint64]string{id: ln.Addr().String()}
	cfg.RaftAddr, cfg.DataDir = "", tc.t.TempDir()
	n, err := Start(cfg)
	if err != nil {
		tc.t.Fatal(err)
	}
	for uint64(len(tc.nodes)) < id {
		tc.nodes = append(tc.nodes, nil)
		tc.cfgs = append(tc.cfgs, Config{})
	}
	tc.nodes[id-1], tc.cfgs[id-1] = n, cfg
	return n
}

func members(t *testing.T, n *Node) Membership {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	m, err := n.Members(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// memberIDs are the nodes that are members of every group.
func memberIDs(m Membership) []uint64 {
	var ids []uint64
	for _, mb := range m.Members {
		if mb.Groups == m.Groups {
			ids = append(ids, mb.ID)
		}
	}
	return ids
}

func mustChange(t *testing.T, what string, change func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := change(ctx); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// A cluster grows, shrinks and replaces a dead node while a lock is held
// and waited for: every group follows each change, the new nodes catch up
// with the replicated locks, a removed node's waiter leaves the queue, and
// in the end the two nodes added later form a quorum of every group by
// themselves.
func TestMembershipAddRemoveReplace(t *testing.T) {
	tc := newTestCluster(t, 3, func(c *Config) { c.FixedLeaders = true; c.ForgetAfter = time.Hour })
	rec := newRecorder()
	const key = "members/held"
	held := acquire(t, tc.node(1), rec, 1, key, time.Minute, 0)
	if held.Outcome != engine.Granted {
		t.Fatal(held)
	}

	// Add node 4: it catches up with the lock table and serves.
	n4 := tc.join(4)
	mustChange(t, "add node 4", func(ctx context.Context) error { return tc.node(1).AddMember(ctx, 4, n4.cfg.RaftAddr) })
	if got := memberIDs(members(t, n4)); !slices.Equal(got, []uint64{1, 2, 3, 4}) {
		t.Fatalf("members after the add, in every group: %v", got)
	}
	waitUntil(t, 20*time.Second, "node 4 caught up with the held lock", func() bool { return n4.Token("default", []byte(key)) == held.Token })
	if r := acquire(t, n4, rec, 2, "members/on-4", time.Minute, 0); r.Outcome != engine.Granted {
		t.Fatalf("acquire through the new node: %+v", r)
	}
	// Adding it again changes nothing; at another address it is refused.
	mustChange(t, "add node 4 again", func(ctx context.Context) error { return tc.node(2).AddMember(ctx, 4, n4.cfg.RaftAddr) })
	if err := tc.node(2).AddMember(context.Background(), 4, "127.0.0.1:1"); !errors.Is(err, ErrMemberExists) {
		t.Fatalf("add node 4 at another address: %v, want ErrMemberExists", err)
	}

	// Remove node 1, which has a waiter queued: the waiter leaves the queue.
	startAcquire(t, tc.node(1), rec, 3, key, time.Minute, 30*time.Second)
	waitUntil(t, 10*time.Second, "node 1's waiter queued", func() bool { return queueLen(tc.node(2), key) == 1 })
	mustChange(t, "remove node 1", func(ctx context.Context) error { return tc.node(2).RemoveMember(ctx, 1) })
	waitUntil(t, 10*time.Second, "the removed node's waiter dropped", func() bool { return queueLen(tc.node(2), key) == 0 })
	tc.stop(1)
	if got := members(t, tc.node(3)); !slices.Equal(memberIDs(got), []uint64{2, 3, 4}) || !slices.Contains(got.Removed, 1) {
		t.Fatalf("members after removing node 1: %+v", got)
	}
	if err := tc.node(3).AddMember(context.Background(), 1, tc.cfgs[0].Peers[1]); !errors.Is(err, ErrMemberRemoved) {
		t.Fatalf("add the removed node 1 back: %v, want ErrMemberRemoved", err)
	}
	if r := release(t, tc.node(3), rec, 4, key, held.Token); r.Outcome != engine.Released {
		t.Fatalf("release of the lock node 1 granted, after its removal: %+v", r)
	}

	// Replace node 2, dead, by node 5 on a fresh data dir.
	tc.stop(2)
	mustChange(t, "remove the dead node 2", func(ctx context.Context) error { return tc.node(3).RemoveMember(ctx, 2) })
	n5 := tc.join(5)
	mustChange(t, "add node 5", func(ctx context.Context) error { return tc.node(4).AddMember(ctx, 5, n5.cfg.RaftAddr) })
	if got := memberIDs(members(t, n5)); !slices.Equal(got, []uint64{3, 4, 5}) {
		t.Fatalf("members after the replacement: %v", got)
	}

	// Nodes 4 and 5 alone are a majority of every group: they elect, and
	// grant above every token of the first members.
	tc.stop(3)
	tc.waitReady()
	r := acquire(t, n5, rec, 5, key, time.Minute, 0)
	if r.Outcome != engine.Granted || r.Token <= held.Token {
		t.Fatalf("acquire on the two later nodes alone: %+v, want a grant above token %d", r, held.Token)
	}

	// A joined node restarts on its data dir as a member.
	tc.stop(4)
	tc.restart(4)
	tc.waitReady()
	if r := release(t, tc.node(4), rec, 6, key, r.Token); r.Outcome != engine.Released {
		t.Fatalf("release through the restarted node 4: %+v", r)
	}
}

// A node does not carry out its own removal (it would leave each group
// half-way through), down to the last member.
func TestMembershipRefusals(t *testing.T) {
	tc := newTestCluster(t, 2, nil)
	if err := tc.node(1).RemoveMember(context.Background(), 1); !errors.Is(err, ErrRemoveSelf) {
		t.Fatalf("node 1 removes itself: %v, want ErrRemoveSelf", err)
	}
	mustChange(t, "remove node 2", func(ctx context.Context) error { return tc.node(1).RemoveMember(ctx, 2) })
	tc.stop(2)
	if err := tc.node(1).RemoveMember(context.Background(), 1); !errors.Is(err, ErrRemoveSelf) {
		t.Fatalf("node 1 removes itself: %v, want ErrRemoveSelf", err)
	}
	if got := memberIDs(members(t, tc.node(1))); !slices.Equal(got, []uint64{1}) {
		t.Fatalf("members: %v", got)
	}
}

// A node added after bootstrap is watched like the first members: when it
// dies, the group leader drops its queued waiters, and the lock goes to a
// live waiter at its release.
func TestAddedNodesWaitersAreDroppedWhenItDies(t *testing.T) {
	tc := newTestCluster(t, 3, func(c *Config) { c.FixedLeaders = true })
	n4 := tc.join(4)
	mustChange(t, "add node 4", func(ctx context.Context) error { return tc.node(1).AddMember(ctx, 4, n4.cfg.RaftAddr) })
	tc.waitReady()
	rec := newRecorder()
	const key = "members/dies"
	leader := tc.leaderOf(key)
	holder := acquire(t, tc.node(leader), rec, 1, key, time.Minute, 0)
	if holder.Outcome != engine.Granted {
		t.Fatal(holder)
	}
	startAcquire(t, n4, rec, 2, key, time.Minute, 30*time.Second)
	waitUntil(t, 10*time.Second, "node 4's waiter queued", func() bool { return queueLen(tc.node(leader), key) == 1 })
	live := 1 + leader%3
	startAcquire(t, tc.node(live), rec, 3, key, time.Minute, 30*time.Second)
	waitUntil(t, 10*time.Second, "the live waiter queued", func() bool { return queueLen(tc.node(leader), key) == 2 })

	tc.stop(4)
	waitUntil(t, 10*time.Second, "the dead node 4's waiter dropped", func() bool { return queueLen(tc.node(leader), key) == 1 })
	if r := release(t, tc.node(leader), rec, 4, key, holder.Token); r.Outcome != engine.Released {
		t.Fatalf("release: %+v", r)
	}
	if r := rec.wait(t, 3, 10*time.Second); r.Outcome != engine.Granted || r.Token <= holder.Token {
		t.Fatalf("the live waiter after the release: %+v", r)
	}
}

// The liveness record takes a peer at its first message and keeps a
// bounded number of them.
func TestPeerLivenessTakesNewPeers(t *testing.T) {
	var l peerLiveness
	l.init(1, map[uint64]string{1: "a", 2: "b"})
	if h := l.heardAt(); len(h) != 1 || h[2] != 0 {
		t.Fatalf("initial peers: %v, want node 2 heard of at 0 and not this node", h)
	}
	l.heard(9, 5*time.Second)
	if at, ok := l.heardAt()[9]; !ok || at != 5*time.Second {
		t.Fatal("a new peer's first message was not recorded")
	}
	for id := uint64(100); id < 200; id++ {
		l.heard(id, time.Second)
	}
	if len(l.heardAt()) != maxHeardPeers {
		t.Fatalf("%d peers recorded, want at most %d", len(l.heardAt()), maxHeardPeers)
	}
	l.heard(2, 7*time.Second)
	if l.heardAt()[2] != 7*time.Second {
		t.Fatal("a known peer's message was not recorded once the record was full")
	}
}
