package cluster

import (
	"bytes"
	"testing"
	"time"

	sm "github.com/lni/dragonboat/v4/statemachine"
	"github.com/lockd/lockd/engine"
)

// logBatch is one proposal stamped at now.
func logBatch(now int64, cmds ...func([]byte) []byte) []byte {
	b := make([]byte, headerLen)
	for _, c := range cmds {
		b = c(b)
	}
	putHeader(b, now, uint32(len(cmds)))
	return b
}

func acquireCmd(node, id uint64, wait time.Duration, keyLimit uint32, key string) func([]byte) []byte {
	return func(b []byte) []byte {
		return appendAcquire(b, node, id, 30, int64(wait), keyLimit, 0, "t", []byte(key))
	}
}

func releaseCmd(token uint64, key string) func([]byte) []byte {
	return func(b []byte) []byte { return appendRelease(b, 1, 0, token, "t", []byte(key)) }
}

func applyAll(replicas []*fsm, log [][]byte) {
	for i, e := range log {
		for _, f := range replicas {
			f.Update(sm.Entry{Index: uint64(i + 1), Cmd: e})
		}
	}
}

// Update must not read node-local configuration: replicas whose nodes run
// with different --max-keys (a rolling restart that changes it) apply the
// same log to the same state, or a token would be issued twice.
func TestReplicasAgreeWhateverTheirMaxKeys(t *testing.T) {
	a, b := detachedFSMWithKeys(100), detachedFSMWithKeys(2)
	const t0 = int64(1e18)
	applyAll([]*fsm{a, b}, [][]byte{
		logBatch(t0, acquireCmd(1, 11, 0, 100, "k1")),
		logBatch(t0+1, acquireCmd(1, 12, 0, 100, "k2")),
		logBatch(t0+2, acquireCmd(1, 13, 0, 2, "k3")), // proposed by a node whose share is 2
		logBatch(t0+3, acquireCmd(2, 21, 0, 100, "k4")),
		logBatch(t0+4, releaseCmd(1, "k1")),
		logBatch(t0+5, acquireCmd(2, 22, 0, 2, "k3")),
	})
	if a.state.tokens.Last != b.state.tokens.Last || len(a.state.locks) != len(b.state.locks) {
		t.Fatalf("replicas diverged: lastToken %d vs %d, %d vs %d keys", a.state.tokens.Last, b.state.tokens.Last, len(a.state.locks), len(b.state.locks))
	}
	for k, l := range a.state.locks {
		if other := b.state.locks[k]; other == nil || other.Token != l.Token {
			t.Fatalf("key %q: token %d on one replica, %+v on the other", k, l.Token, other)
		}
	}
}

// One proposer with a clock an hour fast moves the group's time ahead for
// good; waits and leases are relative to that time, so a lock granted
// after it lasts its lease and a later waiter still queues.
func TestFastClockStampDoesNotEndLaterWaits(t *testing.T) {
	f := detachedFSM()
	t0 := time.Now().UnixNano()
	applyAll([]*fsm{f}, [][]byte{
		logBatch(t0+int64(time.Hour), releaseCmd(999, "other")), // a node whose clock is 1 h fast
		logBatch(t0, acquireCmd(1, 11, 0, 1<<20, "k")),
		logBatch(t0+int64(time.Millisecond), acquireCmd(1, 12, time.Minute, 1<<20, "k")),
	})
	if q := len(f.state.locks[lockKey([]byte("t"), []byte("k"))].queue); q != 1 {
		t.Fatalf("a 60 s waiter was not queued (queue %d)", q)
	}
}

// Pruning of waiters past their wait must not depend on a slice's
// capacity, which differs between a replica that applied the log and one
// restored from a snapshot.
func TestPruneAgreesAfterSnapshotRestore(t *testing.T) {
	for waiters := 64; waiters < 200; waiters++ {
		a := detachedFSM()
		const t0 = int64(1e18)
		var log [][]byte
		log = append(log, logBatch(t0, acquireCmd(1, 1, 0, 1<<20, "k")))
		for i := range waiters {
			wait := 100 * time.Second
			if i%2 == 1 {
				wait = 5 * time.Second
			}
			log = append(log, logBatch(t0, acquireCmd(2, uint64(100+i), wait, 1<<20, "k")))
		}
		log = append(log, logBatch(t0, releaseCmd(1, "k")))
		applyAll([]*fsm{a}, log)
		var snap bytes.Buffer
		if err := a.SaveSnapshot(&snap, nil, nil); err != nil {
			t.Fatal(err)
		}
		b := detachedFSM()
		if err := b.RecoverFromSnapshot(&snap, nil, nil); err != nil {
			t.Fatal(err)
		}
		later := t0 + int64(6*time.Second)
		for i := range 10 {
			e := logBatch(later, acquireCmd(3, uint64(2000+i), 200*time.Second, 1<<20, "k"))
			a.Update(sm.Entry{Cmd: e})
			b.Update(sm.Entry{Cmd: e})
		}
		k := lockKey([]byte("t"), []byte("k"))
		if len(a.state.locks[k].queue) != len(b.state.locks[k].queue) || a.state.queued != b.state.queued {
			t.Fatalf("%d waiters: queue %d vs %d, queued %d vs %d", waiters,
				len(a.state.locks[k].queue), len(b.state.locks[k].queue), a.state.queued, b.state.queued)
		}
	}
}

// A node that restarts replays grants it delivered in its previous run;
// their clients still hold them, so the node must not release them.
func TestRestartKeepsLocksGrantedBeforeIt(t *testing.T) {
	tc := newTestCluster(t, 3, nil)
	rec := newRecorder()
	r := acquire(t, tc.node(1), rec, 1, "held", time.Minute, 0)
	if r.Outcome != engine.Granted {
		t.Fatalf("acquire: %v", r)
	}
	tc.stop(1)
	tc.restart(1)
	tc.waitReady()
	waitUntil(t, 10*time.Second, "node 1 replays the grant", func() bool {
		return tc.node(1).Token("default", []byte("held")) == r.Token
	})
	// A wrong orphan release, queued by the replay, is proposed (and
	// counted) by node 1 no later than the marker; if its proposal was
	// taken, it is applied everywhere once the marker is.
	commitMarker(t, tc, 1, "held", rec, 2)
	for _, id := range []uint64{1, 2, 3} {
		if got := tc.node(id).Token("default", []byte("held")); got != r.Token {
			t.Fatalf("after node 1 restarted node %d has the lock's token %d (was %d), orphan releases %d",
				id, got, r.Token, tc.node(1).ClusterStats().OrphanReleases)
		}
	}
	if n := tc.node(1).ClusterStats().OrphanReleases; n != 0 {
		t.Fatalf("node 1 proposed %d orphan releases after its restart", n)
	}
}
