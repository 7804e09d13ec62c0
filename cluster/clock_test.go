package cluster

import (
	"bytes"
	"reflect"
	"testing"
	"time"
)

// The group's clock, driven by stamps a fake monotonic clock per node
// gives (leadership.stamp), with nodes whose wall clocks step by ±1 h:
// no lease ends before its holder's own bound, on any node's step.

// raisedReplica is a replica of a group at log format 5 whose time is at
// 1000 s (the wall-clock form's last batch, before the raise).
func raisedReplica(t *testing.T) *replica {
	r := newReplica(t, 1)
	r.apply(1000, func(b []byte) []byte { return appendFormat(b, logFormat5) })
	return r
}

// applyStamped applies one batch of version 3 stamped st.
func (r *replica) applyStamped(st stamp, cmds ...func([]byte) []byte) {
	b := make([]byte, datedHeaderLen)
	for _, c := range cmds {
		b = c(b)
	}
	putDatedHeader(b, st, uint32(len(cmds)))
	r.applyEntry(b)
}

// clockNode is one member's proposer side: its monotonic clock and its wall
// clock, which a test steps.
type clockNode struct {
	id   uint64
	mono time.Duration
	wall time.Duration // Unix ns
	lead leadership
	// dated is the last dated batch it applied; none unless a test says
	// so.
	dated appliedBatch
}

// stamp is what node proposes in term, whose leader is leader, having
// applied applied.
func (n *clockNode) stamp(term, leader, applied uint64) stamp {
	return n.lead.stamp(term, leader, n.id, n.mono, applied, n.dated)
}

func (r *replica) now() time.Duration { return r.f.state.now }

// A grant ends exactly when the leader's monotonic clock has run its
// lease since the grant: not when a follower's or the leader's wall
// clock steps ahead an hour, nor when a follower or a deposed leader
// proposes, whatever their stamps say.
func TestClockStepsEndNoLeaseEarly(t *testing.T) {
	for _, step := range []time.Duration{time.Hour, -time.Hour} {
		for _, stepped := range []string{"leader", "follower"} {
			r := raisedReplica(t)
			leader := &clockNode{id: 1, mono: 5 * time.Second, wall: 1000 * time.Second}
			follower := &clockNode{id: 2, mono: 77 * time.Second, wall: 1000 * time.Second}
			r.applyStamped(leader.stamp(4, 1, r.index), acquireBy(1, 1, "k", 0))
			if r.now() != 1000*time.Second {
				t.Fatalf("adopting a leadership moved the group's time to %v, want it where it stood (1000s)", r.now())
			}
			_, token := r.holder("k")
			map[string]*clockNode{"leader": leader, "follower": follower}[stepped].wall += step

			leader.mono += 29 * time.Second
			follower.mono += 29 * time.Second
			// What every node can propose 29 s into the lease: the leader's
			// dated batch, the follower's undated one, both wall-clock forms
			// (written by no build at this format, but applied all the same),
			// a deposed leader of the term before with an hour on its clock.
			r.applyStamped(leader.stamp(4, 1, r.index), acquireBy(2, 2, "k", 0))
			r.applyStamped(follower.stamp(4, 1, r.index), acquireBy(2, 3, "k", 0))
			r.apply(int64(leader.wall/time.Second), acquireBy(2, 4, "k", 0))
			r.apply(int64(follower.wall/time.Second), acquireBy(2, 5, "k", 0))
			r.applyStamped(stamp{term: 3, leader: 3, elapsed: time.Hour, applied: r.index}, acquireBy(3, 6, "k", 0))
			if node, got := r.holder("k"); node != 1 || got != token {
				t.Fatalf("%v on the %s: 29 s into a 30 s lease key is held by node %d token %d, want node 1 token %d",
					step, stepped, node, got, token)
			}
			if r.now() != 1029*time.Second {
				t.Fatalf("%v on the %s: group time %v, want 1029s (the leader's 29 s)", step, stepped, r.now())
			}
			leader.mono += time.Second
			r.applyStamped(leader.stamp(4, 1, r.index), acquireBy(2, 7, "k", 0))
			if node, got := r.holder("k"); node != 2 || got <= token {
				t.Fatalf("%v on the %s: 30 s into a 30 s lease key is held by node %d token %d, want node 2's grant", step, stepped, node, got)
			}
		}
	}
}

// A leader change in the middle of a lease: the new leader continues the
// group's time from the last batch applied, whatever its own elapsed
// time, so the time of the election counts for nothing and the lease
// ends late, never early; the old leader's batches that commit late
// move no time.
func TestLeaderChangeMidLeaseContinuesTheGroupsTime(t *testing.T) {
	r := raisedReplica(t)
	old := &clockNode{id: 1, mono: time.Minute}
	next := &clockNode{id: 2, mono: 3 * time.Hour}
	r.applyStamped(old.stamp(4, 1, r.index), acquireBy(1, 1, "k", 0))
	_, token := r.holder("k")
	old.mono += 10 * time.Second
	r.applyStamped(old.stamp(4, 1, r.index))
	lateOld := old.stamp(4, 1, r.index) // proposed now, committed after the election
	lateOld.elapsed += time.Hour        // its wall clock stepped: no matter, and not even this

	// Node 2 wins term 5; the first batch it stamps is lost, and the
	// first to apply is stamped 20 s into its leadership.
	next.stamp(5, 2, r.index)
	next.mono += 20 * time.Second
	r.applyStamped(next.stamp(5, 2, r.index), acquireBy(2, 2, "k", 0))
	if r.now() != 1010*time.Second {
		t.Fatalf("the new leadership moved the group's time to %v, want it continued at 1010s", r.now())
	}
	r.applyStamped(lateOld, acquireBy(2, 3, "k", 0))
	next.mono += 19 * time.Second
	r.applyStamped(next.stamp(5, 2, r.index), acquireBy(2, 4, "k", 0))
	if node, got := r.holder("k"); node != 1 || got != token || r.now() != 1029*time.Second {
		t.Fatalf("at group time %v (29 s of the lease on the leaders' clocks, 49 s of real time): holder node %d token %d, want node 1 token %d",
			r.now(), node, got, token)
	}
	next.mono += time.Second
	r.applyStamped(next.stamp(5, 2, r.index), acquireBy(2, 5, "k", 0))
	if node, _ := r.holder("k"); node != 2 {
		t.Fatalf("the lease did not end at 30 s of the leaders' clocks: held by node %d", node)
	}
}

// A new leader carries over the time it counted since it applied the
// last dated batch: on a group idle before the election, time stands
// still only from that batch's stamp to its apply on the new leader. It
// carries nothing when a batch of the term before applied after it
// stamped (it would count from the wrong batch).
func TestNewLeaderCarriesItsTimeSinceTheLastDatedBatch(t *testing.T) {
	for _, late := range []bool{false, true} {
		r := raisedReplica(t)
		old := &clockNode{id: 1}
		next := &clockNode{id: 2, mono: time.Hour}
		r.applyStamped(old.stamp(4, 1, r.index), acquireBy(1, 1, "k", 0))
		next.dated = appliedBatch{index: r.index, at: next.mono + time.Second, term: 4, now: r.now()} // it applied the grant 1 s after the stamp
		old.mono += 25 * time.Second
		lateBatch := old.stamp(4, 1, r.index)
		next.mono += 26 * time.Second // idle, then an election: 25 s since it applied the grant
		first := next.stamp(5, 2, r.index)
		if late {
			r.applyStamped(lateBatch)
		}
		r.applyStamped(first)
		// Either the 25 s carried, or the old leader's own 25 s and
		// nothing carried (25 more would end the lease 25 s early).
		if want := 1025 * time.Second; r.now() != want {
			t.Fatalf("late batch %v: group time %v after the new leader's first batch, want %v", late, r.now(), want)
		}
		next.mono += 4 * time.Second
		r.applyStamped(next.stamp(5, 2, r.index), acquireBy(2, 2, "k", 0))
		if node, _ := r.holder("k"); node != 1 {
			t.Fatalf("late batch %v: the lease ended at group time %v", late, r.now())
		}
		next.mono += time.Second
		r.applyStamped(next.stamp(5, 2, r.index), acquireBy(2, 3, "k", 0))
		if node, _ := r.holder("k"); node != 2 {
			t.Fatalf("late batch %v: the lease did not end at group time %v", late, r.now())
		}
	}
}

// A lease granted or renewed by a batch the leader did not date (a
// follower built it), or handed later to a waiter such a batch queued,
// starts when the leader dates a batch after applying it: not at the
// group's time when it applied, which may stand before the request was
// sent. The wait itself runs from the follower's estimate of the
// leader's time, which is never ahead of it.
func TestUndatedStartsWaitForTheLeadersDate(t *testing.T) {
	r := raisedReplica(t)
	leader := &clockNode{id: 1}
	follower := &clockNode{id: 2}
	r.applyStamped(leader.stamp(4, 1, r.index))
	start := r.now()
	// The follower applied that batch, and builds its own 2 s later: its
	// batch is index i; the leader stamps its next batch before applying
	// it (applied < i), 40 s on.
	follower.dated = appliedBatch{index: r.index, at: follower.mono, term: 4, now: r.now()}
	follower.mono += 2 * time.Second
	r.applyStamped(follower.stamp(4, 1, r.index), acquireBy(2, 1, "k", 0), acquireBy(2, 2, "k", 10*time.Second))
	forwarded := r.index
	if l := r.lock("k"); l.End != pendingEnd || l.origin != forwarded || l.queue[0].origin != forwarded {
		t.Fatalf("the forwarded grant: end %v origin %d, waiter origin %d; want it pending on entry %d", l.End, l.origin, l.queue[0].origin, forwarded)
	}
	if w := r.lock("k").queue[0]; w.Arrived != start || w.Deadline != start+12*time.Second {
		t.Fatalf("the forwarded wait: arrived %v, deadline %v; want %v and the follower's 2 s + 10 s after", w.Arrived, w.Deadline, start)
	}
	leader.mono += 40 * time.Second
	r.applyStamped(leader.stamp(4, 1, forwarded-1), acquireBy(3, 3, "k", 0))
	if node, _ := r.holder("k"); node != 2 || r.lock("k").End != pendingEnd {
		t.Fatalf("a batch stamped before the leader applied the grant dated it or ended it: holder %d", node)
	}
	// The leader's next batch, stamped after it applied the grant, dates
	// the lease and the wait from its own time.
	leader.mono += time.Second
	r.applyStamped(leader.stamp(4, 1, r.index))
	l := r.lock("k")
	if at := r.now(); l.End != at+30*time.Second || l.queue[0].origin != 0 {
		t.Fatalf("dated at %v: end %v, waiter origin %d; want end %v, the waiter's handoff dated", at, l.End, l.queue[0].origin, at+30*time.Second)
	}
	if len(r.f.out.leases) != 0 || len(r.f.heap) == 0 {
		t.Fatal("the dated lease was not handed to the lease heap")
	}
	// A renewal in an undated batch is pending the same way.
	r.applyStamped(follower.stamp(4, 1, r.index), func(b []byte) []byte { return appendKeep(b, 2, 0, l.Token, 0, 30, "t", []byte("k")) })
	if l.End != pendingEnd || l.renewals != 1 {
		t.Fatalf("an undated renewal: end %v renewals %d, want pending, 1", l.End, l.renewals)
	}
	snap := r.snapshot()
	if snap[0] != snapshotVersion {
		t.Fatalf("a group at format 5 wrote snapshot version %d, want %d", snap[0], snapshotVersion)
	}
	restored := r.restarted(snap)
	restored.index = r.index
	if !reflect.DeepEqual(stateOf(restored.f), stateOf(r.f)) || restored.f.state.clock.term != 4 || len(restored.f.state.clock.pending) != 1 {
		t.Fatalf("restored from version 9: %+v clock %+v, want %+v clock %+v", stateOf(restored.f), restored.f.state.clock, stateOf(r.f), r.f.state.clock)
	}
	for _, rr := range []*replica{r, restored} {
		leader.mono += time.Second
		rr.applyStamped(leader.stamp(4, 1, rr.index))
		if l := rr.lock("k"); l.End != rr.now()+30*time.Second || len(rr.f.state.clock.pending) != 0 {
			t.Fatalf("the renewal dated: end %v at %v, %d still pending", l.End, rr.now(), len(rr.f.state.clock.pending))
		}
		leader.mono -= time.Second
	}
}

// A proposer dates only what it proposes as the leader, on its monotonic
// clock from its first stamp in the term: a follower's batches are
// undated, and a new term begins a new count.
func TestLeadershipStamps(t *testing.T) {
	var l leadership
	if st := l.stamp(3, 2, 1, 10*time.Second, 7, appliedBatch{index: 7}); st.elapsed != undated || st.term != 3 || st.leader != 2 {
		t.Fatalf("a follower's stamp: %+v, want undated, term 3, leader 2", st)
	}
	if st := l.stamp(4, 1, 1, 20*time.Second, 8, appliedBatch{index: 6, at: 12 * time.Second}); st.elapsed != 0 || st.applied != 8 || st.dated != 6 || st.sinceDated != 8*time.Second {
		t.Fatalf("the first stamp of a leadership: %+v, want elapsed 0, applied 8, dated 6 8 s ago", st)
	}
	if st := l.stamp(4, 1, 1, 25*time.Second, 9, appliedBatch{index: 9, at: 25 * time.Second}); st.elapsed != 5*time.Second {
		t.Fatalf("5 s into the leadership: elapsed %v", st.elapsed)
	}
	if st := l.stamp(6, 1, 1, 26*time.Second, 9, appliedBatch{index: 9, at: 25 * time.Second}); st.elapsed != 0 {
		t.Fatalf("the first stamp of the next leadership: elapsed %v, want 0", st.elapsed)
	}
}

// Below format 5 (a cluster in the middle of an upgrade) the group's
// time is still the latest wall clock stamped, as the builds of those
// formats apply it; the raise itself moves no time.
func TestWallFormBeforeFormat5(t *testing.T) {
	r := newReplica(t, 1)
	r.apply(1000)
	r.apply(900)
	if r.now() != 1000*time.Second {
		t.Fatalf("group time %v, want the latest wall clock, 1000s", r.now())
	}
	raise := make([]byte, headerLen)
	raise = appendFormat(raise, logFormat5)
	putHeader(raise, 0, 1)
	r.applyEntry(raise)
	if r.now() != 1000*time.Second || r.f.format() != logFormat5 {
		t.Fatalf("after the raise: time %v format %d", r.now(), r.f.format())
	}
	r.apply(5000)
	if r.now() != 1000*time.Second {
		t.Fatalf("a wall-clock batch after the raise moved the time to %v", r.now())
	}
	if !bytes.Equal(r.snapshot()[:1], []byte{snapshotVersion}) {
		t.Fatal("no version 9 snapshot after the raise")
	}
}

// A leader that applies a start it has not dated asks its proposer for a
// dated batch at once, and its housekeeping asks again while one is left:
// so time advances, and the start is dated, on a group with nothing else
// to propose. A follower asks for nothing.
func TestLeaderAsksForADateWhileAStartIsUndated(t *testing.T) {
	for _, leading := range []bool{true, false} {
		r := raisedReplica(t)
		g := r.f.g
		g.leading.Store(leading)
		follower := &clockNode{id: 2}
		r.applyStamped(follower.stamp(4, 1, r.index), acquireBy(2, 1, "k", 0))
		if got := g.needStamp.Swap(false); got != leading {
			t.Fatalf("leading %v: a dated batch asked for: %v", leading, got)
		}
		obs := observed{leader: 2, gatherOn: 1, heard: r.n().liveness.heardAt()}
		if leading {
			obs.leader = 1
		}
		if out := g.step(time.Second, obs); out.stamp != leading {
			t.Fatalf("leading %v: the housekeeping pass asked for a dated batch: %v", leading, out.stamp)
		}
	}
}
