package cluster

import (
	"testing"
	"time"
)

// queued decodes the commands a group's next batch holds, by kind.
func queued(t *testing.T, g *group) map[byte]int {
	t.Helper()
	g.mu.Lock()
	defer g.mu.Unlock()
	kinds := map[byte]int{}
	b := g.buf[datedHeaderLen:]
	for range g.count {
		var c command
		var err error
		if b, err = readCommand(b, &c); err != nil {
			t.Fatalf("the batch holds a malformed command: %v", err)
		}
		if c.kind == cmdLeaseEnd && len(c.key) == 0 {
			t.Fatalf("a lease end naming no lock: %+v", c)
		}
		kinds[c.kind]++
	}
	return kinds
}

// The driver proposes a lease end only in a group this node leads, and
// only for a lease that fell due on its heap; a group it does not lead
// gets nothing, whatever another group's pass found due (the old loop
// shared one slice across groups and proposed its zeroed entries in
// every group after one it led: lease ends naming no lock, on every pass).
func TestExpiryStepProposesLeaseEndsOnlyWhereItLeads(t *testing.T) {
	led, notLed := newReplica(t, 1), newReplica(t, 1)
	for _, r := range []*replica{led, notLed} {
		r.apply(1, acquireBy(1, 100, "k", 0)) // a 30 s lease on each heap
	}
	after := 31 * time.Second
	steps := []struct {
		r    *replica
		view leaderView
		want map[byte]int
	}{
		{led, leaderView{leader: 1, term: 5}, map[byte]int{cmdLeaseEnd: 1}},
		{notLed, leaderView{leader: 2, term: 5}, map[byte]int{}},
		{led, leaderView{leader: 1, term: 5}, map[byte]int{cmdLeaseEnd: 1}}, // nothing new: the one from before
		{notLed, leaderView{leader: 2, term: 5}, map[byte]int{}},
	}
	for i, s := range steps {
		step := s.r.f.g.expiryStep(after+time.Duration(i)*time.Millisecond, s.view, 1)
		got := queued(t, s.r.f.g)
		if len(got) != len(s.want) || got[cmdLeaseEnd] != s.want[cmdLeaseEnd] {
			t.Fatalf("pass %d: queued %v, want %v", i, got, s.want)
		}
		if step.propose != (i == 0) {
			t.Fatalf("pass %d: propose %v", i, step.propose)
		}
	}
}

// A peer silent for ForgetAfter loses its queued waiters (one forget per
// silent peer, once while it stays silent), and nothing else: its grants,
// and a grant to it that applies later, stay its own until released,
// abandoned by their requester, or their lease ends.
func TestExpiryStepForgetsASilentPeersWaitersOnly(t *testing.T) {
	r := newReplica(t, 1)
	r.apply(1, acquireBy(2, 100, "a", 0))
	g := r.f.g
	g.leaderSince, g.wasLeader, g.leaderSeen = 0, true, 1
	view := leaderView{leader: 1, term: 5}
	g.expiryStep(time.Second, view, 1) // node 2 and 3 last heard at 0: silent since
	if got := queued(t, g); len(got) != 1 || got[cmdForget] != 2 {
		t.Fatalf("first pass queued %v, want a forget for each silent peer and nothing else", got)
	}
	g.take()
	r.apply(2, acquireBy(2, 101, "b", 0)) // its proposal was still in flight
	g.expiryStep(1250*time.Millisecond, view, 1)
	if got := queued(t, g); len(got) != 0 {
		t.Fatalf("second pass queued %v, want nothing", got)
	}
}

// A leader that did not run for a while (SIGSTOP, a paused VM) heard
// nothing meanwhile, and still takes itself for leader at its first pass
// after: it must not take its peers for silent, or its forget, proposed
// again to the leader elected without it, would drop the waiters of the
// nodes that went on serving. Their silence counts from its waking.
func TestExpiryStepJudgesNoSilenceAcrossItsOwnPause(t *testing.T) {
	r := newReplica(t, 1)
	g := r.f.g
	n := r.n()
	g.leaderSince, g.wasLeader, g.leaderSeen = 0, true, 1
	view := leaderView{leader: 1, term: 5}
	at := time.Duration(0)
	for ; at <= 2*expiryHousekeeping; at += expiryHousekeeping {
		n.liveness.heard(2, at)
		n.liveness.heard(3, at)
		g.expiryStep(at, view, 1)
	}
	heardLast := at - expiryHousekeeping
	at = 8 * time.Second // stopped from heardLast to here
	woke := at
	for ; at <= woke+n.cfg.ForgetAfter; at += expiryHousekeeping {
		g.expiryStep(at, view, 1)
		if got := queued(t, g); len(got) != 0 {
			t.Fatalf("pass at %v, %v after waking from a pause (peers last heard at %v): queued %v, want nothing",
				at, at-woke, heardLast, got)
		}
	}
	// Still leader, its peers silent for more than ForgetAfter since it
	// woke: now it judges them as any leader does.
	g.expiryStep(at, view, 1)
	if got := queued(t, g); len(got) != 1 || got[cmdForget] != 2 {
		t.Fatalf("peers silent past ForgetAfter since it woke: queued %v, want a forget for each", got)
	}
}

// The expiry pass that finds a leader still leading after a hand-over it
// asked for had its longest pending reports the hand-over given up, so
// that the followers send again what the leader dropped meanwhile; a
// follower that receives that message sends its proposals in flight again
// at once, as after a leader change.
func TestGivenUpHandOverSendsTheFollowersProposalsAgain(t *testing.T) {
	r := newReplica(t, 1)
	g := r.f.g
	view := leaderView{leader: 1, term: 5}
	g.expiryStep(time.Second, view, 1)
	g.placement.asked(time.Second)
	pending := r.n().handOverPending()
	if step := g.expiryStep(time.Second+pending/2, view, 1); step.handOverGivenUp || step.wake > pending/2 {
		t.Fatalf("mid-hand-over: given up %v, next pass in %v (want within %v)", step.handOverGivenUp, step.wake, pending/2)
	}
	if step := g.expiryStep(time.Second+pending, view, 1); !step.handOverGivenUp {
		t.Fatal("still leader after the hand-over's longest pending: not reported given up")
	}

	follower := newReplica(t, 2)
	fg := follower.f.g
	fg.shardID = 7
	follower.n().groups = []*group{fg}
	inFlight := *fg.newLeader.Load()
	follower.n().onPeerFrame(appendSendAgain(nil, 7), nobodySink{})
	select {
	case <-inFlight:
	default:
		t.Fatal("a follower told the hand-over was given up kept its proposals waiting")
	}
}

// nobodySink is a reply sink that drops what it is given.
type nobodySink struct{}

func (nobodySink) reply([]byte) {}
