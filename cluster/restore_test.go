package cluster

import (
	"bytes"
	"reflect"
	"testing"
	"time"

	sm "github.com/lni/dragonboat/v4/statemachine"
	"github.com/lockd/lockd/engine"
)

// localNode is node 1's request side without a NodeHost: enough to
// register requests and receive its state machine's hand-offs.
func localNode() (*Node, *group, *fsm) {
	start := time.Now()
	n := &Node{
		cfg:      Config{NodeID: 1, ProposeTimeout: time.Minute, Clock: func() time.Duration { return time.Since(start) }},
		reg:      make(map[uint64]*pending),
		wakeReg:  make(chan struct{}, 1),
		inflight: engine.NewAdmissionGate(100),
		waiters:  engine.NewAdmissionGate(100),
	}
	n.idBase.Store(1000)
	n.idFirst = 1001
	g := &group{n: n, maxKeys: 1 << 20, proposer: proposer{kick: make(chan struct{}, 1)}}
	f := newFSM(g, 1)
	g.fsm.Store(f)
	return n, g, f
}

// A node that catches up from a snapshot (it fell behind its group)
// delivers the grants and queue entries of its own waiting requests that
// the snapshot holds, and releases nothing it may have delivered before
// it fell behind.
func TestSnapshotDeliversGrantsOfWaitingRequests(t *testing.T) {
	n, g, local := localNode()
	rec := newRecorder()
	request := func(owner uint64, wait time.Duration) *pending {
		n.inflight.Admit()
		p := &pending{id: n.nextID(), w: rec, owner: owner, start: n.clock(), wait: wait, deadline: n.clock() + time.Minute}
		n.register(p)
		return p
	}
	waiting := request(1, 0)
	queued := request(2, 30*time.Second)
	answered := n.nextID() // answered before the node fell behind: no longer registered

	// The group's history, applied by an up-to-date replica.
	upToDate := detachedFSM()
	b := make([]byte, headerLen)
	b = appendAcquire(b, 1, answered, 30, 0, 1<<20, 0, "t", []byte("a"))
	b = appendAcquire(b, 1, waiting.id, 30, 0, 1<<20, 0, "t", []byte("b"))
	b = appendAcquire(b, 2, 77, 30, 0, 1<<20, 0, "t", []byte("c"))
	b = appendAcquire(b, 1, queued.id, 30, int64(30*time.Second), 1<<20, 0, "t", []byte("c"))
	putHeader(b, 1, 4)
	if _, err := upToDate.Update(sm.Entry{Cmd: b}); err != nil {
		t.Fatal(err)
	}
	var snap bytes.Buffer
	if err := upToDate.SaveSnapshot(&snap, nil, nil); err != nil {
		t.Fatal(err)
	}
	if err := local.RecoverFromSnapshot(&snap, nil, nil); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(stateOf(local), stateOf(upToDate)) {
		t.Fatalf("restored state differs:\n%+v\n%+v", stateOf(local), stateOf(upToDate))
	}

	got := rec.wait(t, 1, time.Second)
	want := engine.Result{Outcome: engine.Granted, Token: upToDate.state.locks[lockKey([]byte("t"), []byte("b"))].Token}
	if got != want {
		t.Fatalf("waiting request got %+v, want %+v", got, want)
	}
	if _, done := rec.peek(2); done {
		t.Fatal("the queued request was answered")
	}
	n.regMu.Lock()
	isQueued, stillWaits := queued.queued, n.reg[queued.id] != nil
	n.regMu.Unlock()
	if !isQueued || !stillWaits || queued.deadline != queued.start+30*time.Second {
		t.Fatalf("queued request: queued %v registered %v deadline %v", isQueued, stillWaits, queued.deadline-queued.start)
	}
	if orphans := len(g.orphans.take()); orphans != 0 {
		t.Fatalf("%d grants queued for release; a grant to an answered request may be held by its client", orphans)
	}
}
