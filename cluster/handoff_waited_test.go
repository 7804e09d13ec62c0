package cluster

import (
	"testing"
	"time"
)

// The waited_ms of a handoff (SPEC §6): the client's validity bound, its
// send instant + waited + lease, must end no later than the lease does on
// the group's clock, where the next holder may be granted. Here the
// client's request reaches a follower whose link to the leader is slow
// (300 ms each way). The follower's batch that queues it is undated, so
// the group's time there stands where the leader last dated it, 10 s
// before the request; and the follower applies the leader's batches
// 300 ms after the leader stamped them, so its own elapsed time since the
// receipt, when it delivers the grant, runs 300 ms past the lease's start.
// Neither may reach the client's bound. Node 1 is the follower the client
// is connected to, node 2 the leader; group time is 1000 s + the
// leader's clock.
func TestHandOffWaitedEndsWithinTheLease(t *testing.T) {
	const lag = 300 * time.Millisecond // from a stamp on the leader to its apply on the follower
	for _, tc := range []struct {
		name string
		// handOff frees the lock for the waiter, the leader having dated
		// the queue entry before or not, and sets the follower's clock
		// (nodeClock) to when it applies the batch that does, and so
		// delivers the grant.
		handOff func(r *replica, leader, follower *clockNode, token uint64, nodeClock func(time.Duration))
	}{
		{"the leader dated the queue entry before the lease ended", func(r *replica, leader, _ *clockNode, _ uint64, nodeClock func(time.Duration)) {
			leader.mono = 10*time.Second + lag // it applied the follower's batch
			r.applyStamped(leader.stamp(4, 2, r.index))
			leader.mono = 30 * time.Second // the holder's lease ends
			nodeClock(leader.mono + lag)
			r.applyStamped(leader.stamp(4, 2, r.index), func(b []byte) []byte { return appendLeaseEnd(b, "t", []byte("k")) })
		}},
		{"released through the follower before the leader dated the queue entry", func(r *replica, leader, follower *clockNode, token uint64, nodeClock func(time.Duration)) {
			follower.mono = 10*time.Second + 100*time.Millisecond
			nodeClock(follower.mono + 2*lag) // its batch committed: a round trip
			r.applyStamped(follower.stamp(4, 2, r.index), releaseOf(token, "k"))
			leader.mono = follower.mono + lag // it applied the release, and dates the handoff's lease
			r.applyStamped(leader.stamp(4, 2, r.index))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, _, f := localNode()
			r := &replica{t: t, f: f}
			r.apply(1000, func(b []byte) []byte { return appendFormat(b, logFormat5) })
			var now time.Duration
			n.cfg.Clock = func() time.Duration { return now }
			nodeClock := func(d time.Duration) { now = d }
			leader, follower := &clockNode{id: 2}, &clockNode{id: 1}

			r.applyStamped(leader.stamp(4, 2, r.index), acquireBy(2, 1, "k", 0))
			held, token := r.holder("k")
			if held != 2 || r.lock("k").End != 1030*time.Second {
				t.Fatalf("the first grant: node %d, end %v; want node 2's, 30 s from 1000 s", held, r.lock("k").End)
			}
			follower.dated = appliedBatch{index: r.index, at: lag, term: 4, now: r.now()}

			// The client sends its acquire 10 s on; it reaches the follower at once.
			sent := 10 * time.Second
			follower.mono = sent
			nodeClock(follower.mono)
			rec := newRecorder()
			n.inflight.Admit()
			p := &pending{id: n.nextID(), w: rec, owner: 7, start: n.clock(), wait: time.Minute, deadline: n.clock() + time.Minute}
			n.register(p)
			r.applyStamped(follower.stamp(4, 2, r.index), acquireBy(1, p.id, "k", time.Minute))
			if l := r.lock("k"); len(l.queue) != 1 || !p.queued {
				t.Fatalf("the acquire is not queued behind the holder: queue %d, registry queued %v", len(l.queue), p.queued)
			}

			tc.handOff(r, leader, follower, token, nodeClock)
			got, ok := rec.peek(7)
			if !ok || got.Token <= token {
				t.Fatalf("the waiter was not handed the lock: %+v (answered %v)", got, ok)
			}
			end := r.lock("k").End - 1000*time.Second // on the real clock
			if bound := sent + got.Waited + 30*time.Second; bound > end {
				t.Errorf("waited %v: the client holds the lock until %v, %v past the lease's end at %v",
					got.Waited, bound, bound-end, end)
			}
			// At the lease's end another client is granted the key.
			leader.mono = end
			r.applyStamped(leader.stamp(4, 2, r.index), acquireBy(2, 9, "k", 0))
			if node, next := r.holder("k"); node != 2 || next <= got.Token {
				t.Fatalf("at the lease's end the key is held by node %d token %d, want node 2's next grant", node, next)
			}
		})
	}
}
