package cluster

import (
	"testing"
	"time"

	"github.com/lockd/lockd/engine"
)

// abandon sends SPEC §6a ABANDON of the request tagged r through n and
// waits for its answer.
func abandon(t testing.TB, n *Node, rec *recorder, owner uint64, key string, r engine.Requester) engine.Result {
	t.Helper()
	res := n.Abandon(n.Namespace("default"), []byte(key), owner, r, rec)
	if res.Outcome != engine.Queued {
		return res
	}
	n.Flush()
	return rec.wait(t, owner, 10*time.Second)
}

// The §6a ABANDON in a 3-node cluster: a grant made through one node, for
// a request whose connection died with it, is given back through
// another node by its requester: the next waiter (on a third node) gets
// the lock at once, not a lease later, and the abandoned request, were a
// retried proposal of it to apply now, is refused (T), never granted.
// An ABANDON of a queued waiter drops it; one of nothing answers N.
func TestAbandonThroughAnotherNode(t *testing.T) {
	tc := newTestCluster(t, 3, nil)
	for id := uint64(1); id <= 3; id++ {
		n := tc.node(id)
		waitUntil(t, 20*time.Second, "every group at log format 4", n.ServesAbandon)
	}
	rec := newRecorder()
	session := engine.NewSessionKey([16]byte{1, 2, 3})
	ns := tc.node(1).Namespace("default")
	r, _ := tc.node(1).Acquire(ns, []byte("k"), 1, session.Requester(1), time.Hour, 0, rec)
	if r.Outcome != engine.Queued {
		t.Fatalf("acquire: %+v", r)
	}
	tc.node(1).Flush()
	held := rec.wait(t, 1, 10*time.Second)
	if held.Outcome != engine.Granted {
		t.Fatalf("acquire: %+v", held)
	}
	startAcquire(t, tc.node(3), rec, 2, "k", time.Hour, time.Minute)
	waitUntil(t, 10*time.Second, "the waiter queued", func() bool { return queueLen(tc.node(3), "k") == 1 })

	if got := abandon(t, tc.node(2), rec, 3, "k", session.Requester(1)); got.Outcome != engine.Released {
		t.Fatalf("abandon of the grant: %+v, want Released", got)
	}
	next := rec.wait(t, 2, 10*time.Second)
	if next.Outcome != engine.Granted || next.Token <= held.Token {
		t.Fatalf("the waiter after the abandon: %+v", next)
	}
	// The abandoned request applying again (a retried proposal): refused.
	r, _ = tc.node(1).Acquire(ns, []byte("k"), 4, session.Requester(1), time.Hour, time.Minute, rec)
	if r.Outcome == engine.Queued {
		tc.node(1).Flush()
		r = rec.wait(t, 4, 10*time.Second)
	}
	if r.Outcome != engine.TimedOut {
		t.Fatalf("the abandoned request again: %+v, want TimedOut", r)
	}

	// A queued waiter of the session is dropped (answered TimedOut), and
	// the abandon answers NotHeld; so does an abandon of nothing.
	r, _ = tc.node(1).Acquire(ns, []byte("k"), 5, session.Requester(5), time.Hour, time.Minute, rec)
	if r.Outcome != engine.Queued {
		t.Fatalf("acquire: %+v", r)
	}
	tc.node(1).Flush()
	waitUntil(t, 10*time.Second, "the session's waiter queued", func() bool { return queueLen(tc.node(2), "k") == 1 })
	if got := abandon(t, tc.node(2), rec, 6, "k", session.Requester(5)); got.Outcome != engine.NotHeld {
		t.Fatalf("abandon of a waiter: %+v, want NotHeld", got)
	}
	if got := rec.wait(t, 5, 10*time.Second); got.Outcome != engine.TimedOut {
		t.Fatalf("the abandoned waiter: %+v, want TimedOut", got)
	}
	if got := abandon(t, tc.node(3), rec, 7, "other", session.Requester(9)); got.Outcome != engine.NotHeld {
		t.Fatalf("abandon of nothing: %+v, want NotHeld", got)
	}
	if tc.node(1).Token("default", []byte("k")) != next.Token {
		t.Fatal("the waiter's grant was touched by the abandons")
	}
}
