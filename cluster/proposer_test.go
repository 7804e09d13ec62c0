package cluster

import (
	"bytes"
	"testing"
	"time"

	sm "github.com/lni/dragonboat/v4/statemachine"
	"github.com/lockd/lockd/engine"
	"github.com/valyala/bytebufferpool"
)

// newIdleGroup is a group with no node behind it, for the proposer's
// buffer handling alone.
func newIdleGroup() *group {
	return &group{n: &Node{}, proposer: proposer{slots: make(chan struct{}, proposalsInFlight), freed: make(chan struct{}, 1), buf: make([]byte, datedHeaderLen, 4096)}}
}

// gather queues n acquires of key as the event loops do and takes them as
// a proposal, holding a slot for it.
func (g *group) gather(n int, key string) *bytebufferpool.ByteBuffer {
	g.mu.Lock()
	for i := range n {
		g.buf = appendAcquire(g.buf, 1, uint64(i+1), 30, 0, 1000, 0, "default", []byte(key))
		g.count++
	}
	g.mu.Unlock()
	g.slots <- struct{}{}
	return g.take()
}

// A proposal's bytes stay as taken while its slot is held — watch and
// send propose them again after a drop or a leader change — however many
// proposals are taken and ended meanwhile; only done gives them back.
func TestProposalBufferLivesUntilItsSlotIsFreed(t *testing.T) {
	g := newIdleGroup()
	first := g.gather(8, "first")
	want := bytes.Clone(first.B)
	if got := binaryCount(first.B); got != 8 {
		t.Fatalf("the proposal counts %d commands, want 8", got)
	}
	for range 100 {
		next := g.gather(8, "other")
		if bytes.Contains(next.B, []byte("first")) || binaryCount(next.B) != 8 {
			t.Fatal("a later batch carries commands of the first")
		}
		g.done(next)
		if !bytes.Equal(first.B, want) {
			t.Fatal("the first proposal's bytes changed while its slot was held")
		}
	}
	g.done(first)
	if len(g.slots) != 0 {
		t.Fatalf("%d slots still held", len(g.slots))
	}
}

// BenchmarkProposalBatches measures the node's side of one proposal
// without Raft: 32 acquires gathered, taken as a stamped batch, and the
// batch's end (done), whose buffer the next batch gathers in.
func BenchmarkProposalBatches(b *testing.B) {
	g := newIdleGroup()
	b.ReportAllocs()
	for b.Loop() {
		g.done(g.gather(32, "bench/key"))
	}
}

// slotProbe is a waiter that records how many proposal slots its group
// held when its answer came.
type slotProbe struct {
	g    *group
	held chan int
}

func (s slotProbe) Resolve(uint64, engine.Result) { s.held <- len(s.g.slots) }

// The apply of a node's own proposal frees its slot before the answers it
// carries go out: a client that gets its grant and sends its release at
// once finds the slot free, and its event loop proposes the release
// itself. The watcher that ends the proposal later frees nothing twice.
func TestAppliedProposalFreesItsSlotBeforeAnswering(t *testing.T) {
	n, g, f := localNode()
	g.slots, g.freed, g.buf = make(chan struct{}, proposalsInFlight), make(chan struct{}, 1), make([]byte, datedHeaderLen, 4096)
	probe := slotProbe{g: g, held: make(chan int, 1)}
	p := &pending{id: n.nextID(), w: probe, owner: 1, start: n.clock(), deadline: n.clock() + time.Minute}
	n.register(p)
	g.mu.Lock()
	g.buf = appendAcquire(g.buf, n.cfg.NodeID, p.id, 10, 0, 1<<20, 0, "t", []byte("k"))
	g.count++
	g.mu.Unlock()
	g.slots <- struct{}{}
	b := g.take()

	if _, err := f.Update(sm.Entry{Index: 1, Cmd: bytes.Clone(b.B)}); err != nil {
		t.Fatal(err)
	}
	select {
	case held := <-probe.held:
		if held != 0 {
			t.Fatalf("the answer went out with %d slots held; want the applied proposal's slot freed first", held)
		}
	default:
		t.Fatal("the acquire was not answered by its apply")
	}
	g.slots <- struct{}{} // the next proposal's
	g.done(b)             // the first proposal's watcher hears of it
	if len(g.slots) != 1 {
		t.Fatalf("%d slots held after the watcher ended the applied proposal, want the next proposal's 1", len(g.slots))
	}
}

// An event loop's flush proposes its commands itself when no proposal of
// the group is out, rather than waking the group's proposer goroutine (a
// context switch on every commit's path): the proposal has gone to Raft
// by the time Flush returns.
func TestFlushProposesFromTheLoopWhenNoProposalIsOut(t *testing.T) {
	tc := newTestCluster(t, 1, nil)
	n := tc.node(1)
	rec := newRecorder()
	if r := acquire(t, n, rec, 1, "warm", 30*time.Second, 0); r.Outcome != engine.Granted {
		t.Fatalf("first acquire: %+v", r)
	}
	g := n.groups[n.GroupOf("default", []byte("k"))]
	waitUntil(t, 10*time.Second, "no proposal of the group out", func() bool { return len(g.slots) == 0 })
	before := n.stats.proposals.Load()
	if r, _ := n.Acquire(n.Namespace("default"), []byte("k"), 2, 0, 30*time.Second, 0, rec); r.Outcome != engine.Queued {
		t.Fatalf("acquire: %+v", r)
	}
	n.Flush()
	if got := n.stats.proposals.Load(); got != before+1 {
		t.Fatalf("%d proposals made by the time Flush returned, want 1", got-before)
	}
	if r := rec.wait(t, 2, 10*time.Second); r.Outcome != engine.Granted {
		t.Fatalf("acquire: %+v", r)
	}
}

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

// A follower told that its leader gave a hand-over up (the leader's
// housekeeping reports it given up, testdata/housekeeping.txt) ends the
// hand-over's hold and sends its proposals in flight again at once, as
// after a leader change.
func TestSendAgainMessageResendsTheFollowersProposals(t *testing.T) {
	follower := newReplica(t, 2)
	fg := follower.f.g
	fg.shardID = 7
	follower.n().groups = []*group{fg}
	follower.n().onPeerFrame(appendHold(nil, 1, 7), nobodySink{})
	if by := fg.holdBy.Load(); by != 1 {
		t.Fatalf("a follower asked by leader 1 to hold group 7 holds for %d", by)
	}
	inFlight := *fg.newLeader.Load()
	follower.n().onPeerFrame(appendSendAgain(nil, 7), nobodySink{})
	select {
	case <-inFlight:
	default:
		t.Fatal("a follower told the hand-over was given up kept its proposals waiting")
	}
	if fg.held() != 0 {
		t.Fatal("a follower told the hand-over was given up still holds its proposals")
	}
}

// nobodySink is a reply sink that drops what it is given.
type nobodySink struct{}

func (nobodySink) reply([]byte) {}
