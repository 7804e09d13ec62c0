package placement

import (
	"testing"
	"time"
)

// The leader hands a group over only to a node that proposed clearly more
// than itself for strikesNeeded windows in a row, and at most once per
// Cooldown.
func TestLeaderPlacementDecision(t *testing.T) {
	heavy := Load{Node: 2, Commands: 300}
	type step struct {
		at      time.Duration
		leader  bool
		busiest Load
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
			{2 * time.Second, true, Load{2, 5}, 10, 0, 0},
			{3 * time.Second, true, heavy, 10, 0, 0},
		}},
		{"the same node must qualify twice", []step{
			{1 * time.Second, true, heavy, 10, 0, 0},
			{2 * time.Second, true, Load{3, 300}, 10, 0, 0},
			{3 * time.Second, true, heavy, 10, 0, 0},
			{4 * time.Second, true, heavy, 10, 0, 2},
		}},
		{"a follower never decides", []step{
			{1 * time.Second, false, heavy, 0, 0, 0},
			{2 * time.Second, false, heavy, 0, 0, 0},
		}},
		{"balanced load stays", []step{
			{1 * time.Second, true, Load{2, 300}, 150, 0, 0},
			{2 * time.Second, true, Load{2, 300}, 150, 0, 0},
			{3 * time.Second, true, Load{2, 300}, 150, 0, 0},
		}},
		{"too little load stays", []step{
			{1 * time.Second, true, Load{2, MinCommands - 1}, 0, 0, 0},
			{2 * time.Second, true, Load{2, MinCommands - 1}, 0, 0, 0},
		}},
		{"no other node", []step{
			{1 * time.Second, true, Load{}, 500, 0, 0},
			{2 * time.Second, true, Load{}, 500, 0, 0},
		}},
		{"unmet transfers back off", []step{
			{1 * time.Second, true, heavy, 0, 0, 0},
			{2 * time.Second, true, heavy, 0, 0, 2}, // Raft gave it up: still leader
			{3 * time.Second, true, heavy, 0, 0, 0},
			{4 * time.Second, true, heavy, 0, 0, 0},
			{2*time.Second + Cooldown, true, heavy, 0, 0, 2},
			{3*time.Second + Cooldown, true, heavy, 0, 0, 0},
			{2*time.Second + 3*Cooldown - time.Second, true, heavy, 0, 0, 0},
			{2*time.Second + 3*Cooldown, true, heavy, 0, 0, 2}, // after twice the pause
		}},
		{"an idle group gathers after five empty windows", []step{
			{1 * time.Second, true, Load{}, 0, 3, 0},
			{2 * time.Second, true, Load{}, 0, 3, 0},
			{3 * time.Second, true, Load{}, 0, 3, 0},
			{4 * time.Second, true, Load{}, 0, 3, 0},
			{5 * time.Second, true, Load{}, 0, 3, 3},
		}},
		{"one command restarts the idle count", []step{
			{1 * time.Second, true, Load{}, 0, 3, 0},
			{2 * time.Second, true, Load{}, 0, 3, 0},
			{3 * time.Second, true, Load{}, 0, 3, 0},
			{4 * time.Second, true, Load{}, 0, 3, 0},
			{5 * time.Second, true, Load{}, 1, 3, 0},
			{6 * time.Second, true, Load{}, 0, 3, 0},
			{7 * time.Second, true, Load{}, 0, 3, 0},
			{8 * time.Second, true, Load{}, 0, 3, 0},
			{9 * time.Second, true, Load{}, 0, 3, 0},
			{10 * time.Second, true, Load{}, 0, 3, 3},
		}},
		{"a group that must stay never gathers", []step{ // it holds a lock, or this node leads group 0
			{1 * time.Second, true, Load{}, 0, 0, 0},
			{2 * time.Second, true, Load{}, 0, 0, 0},
			{3 * time.Second, true, Load{}, 0, 0, 0},
			{4 * time.Second, true, Load{}, 0, 0, 0},
			{5 * time.Second, true, Load{}, 0, 0, 0},
			{6 * time.Second, true, Load{}, 0, 0, 0},
		}},
		{"an unmet gathering backs off like a move", []step{
			{1 * time.Second, true, Load{}, 0, 3, 0},
			{2 * time.Second, true, Load{}, 0, 3, 0},
			{3 * time.Second, true, Load{}, 0, 3, 0},
			{4 * time.Second, true, Load{}, 0, 3, 0},
			{5 * time.Second, true, Load{}, 0, 3, 3}, // Raft gave it up: still leader
			{6 * time.Second, true, Load{}, 0, 3, 0},
			{7 * time.Second, true, Load{}, 0, 3, 0},
			{8 * time.Second, true, Load{}, 0, 3, 0},
			{9 * time.Second, true, Load{}, 0, 3, 0},
			{5*time.Second + Cooldown, true, Load{}, 0, 3, 3}, // still leader
			{11 * time.Second, true, Load{}, 0, 3, 0},
			{12 * time.Second, true, Load{}, 0, 3, 0},
			{13 * time.Second, true, Load{}, 0, 3, 0},
			{14 * time.Second, true, Load{}, 0, 3, 0},
			{15 * time.Second, true, Load{}, 0, 3, 0}, // five empty windows, but the pause doubled
			{5*time.Second + 3*Cooldown, true, Load{}, 0, 3, 3},
		}},
		{"load wins over gathering", []step{
			{1 * time.Second, true, Load{}, 0, 3, 0},
			{2 * time.Second, true, Load{}, 0, 3, 0},
			{3 * time.Second, true, Load{}, 0, 3, 0},
			{4 * time.Second, true, Load{}, 0, 3, 0},
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
			{31*time.Second + Cooldown, true, heavy, 0, 0, 2}, // the base pause again
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var p Policy
			for i, s := range tc.steps {
				if got := p.Observe(s.at, s.leader, s.busiest, s.own, s.gather); got != s.want {
					t.Fatalf("step %d at %v: moved to %d, want %d", i, s.at, got, s.want)
				}
			}
		})
	}
}

// A hand-over decided is asked for at its scheduled instant, once, and
// not at all by a node that stopped leading meanwhile.
func TestHandOverWaitsItsSettle(t *testing.T) {
	var p Policy
	if to, wait := p.HandOver(0, true); to != 0 || wait != 0 {
		t.Fatalf("nothing scheduled: got %d, wait %v", to, wait)
	}
	p.Schedule(2, 100*time.Millisecond)
	if to, wait := p.HandOver(80*time.Millisecond, true); to != 0 || wait != 20*time.Millisecond {
		t.Fatalf("before its instant: got %d, wait %v; want 0, 20ms", to, wait)
	}
	if to, _ := p.HandOver(100*time.Millisecond, true); to != 2 {
		t.Fatalf("at its instant: got %d, want 2", to)
	}
	if to, wait := p.HandOver(200*time.Millisecond, true); to != 0 || wait != 0 {
		t.Fatalf("asked twice: got %d, wait %v", to, wait)
	}
	p.Schedule(3, 300*time.Millisecond)
	if to, _ := p.HandOver(250*time.Millisecond, false); to != 0 {
		t.Fatalf("a follower asked for a hand-over to %d", to)
	}
	if to, wait := p.HandOver(400*time.Millisecond, true); to != 0 || wait != 0 {
		t.Fatalf("leadership lost, then back: the stale hand-over to %d came back (wait %v)", to, wait)
	}
}

// A hand-over asked for is reported given up once, when its asker still
// leads after the longest Raft keeps one pending; a hand-over that
// happened (the asker no longer leads) is not.
func TestHandOverGivenUpIsReportedOnce(t *testing.T) {
	const pending = 500 * time.Millisecond
	var p Policy
	if up, wait := p.GivenUp(time.Second, true, pending); up || wait != 0 {
		t.Fatalf("nothing asked: given up %v, wait %v", up, wait)
	}
	p.Asked(time.Second)
	if up, wait := p.GivenUp(time.Second+300*time.Millisecond, true, pending); up || wait != 200*time.Millisecond {
		t.Fatalf("still pending: given up %v, wait %v; want false, 200ms", up, wait)
	}
	if up, _ := p.GivenUp(time.Second+pending, true, pending); !up {
		t.Fatal("still leader after the hand-over's longest pending: not reported given up")
	}
	if up, wait := p.GivenUp(2*time.Second, true, pending); up || wait != 0 {
		t.Fatalf("reported twice: given up %v, wait %v", up, wait)
	}
	p.Asked(3 * time.Second)
	if up, _ := p.GivenUp(3*time.Second+100*time.Millisecond, false, pending); up {
		t.Fatal("a hand-over that happened reported given up")
	}
	if up, wait := p.GivenUp(4*time.Second, true, pending); up || wait != 0 {
		t.Fatalf("leadership lost, then back: the old hand-over reported (given up %v, wait %v)", up, wait)
	}
}
