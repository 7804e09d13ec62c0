package cluster

import (
	"slices"
	"testing"
	"time"
)

// The membership says, in the answering node's view, whether each member
// is reachable and how long since it was last heard: a killed node turns
// "no" for a node that leads a group, with its silence growing, while
// the live ones stay "yes".
func TestMembersSayWhetherEachNodeIsReachable(t *testing.T) {
	tc := newTestCluster(t, 3, nil)
	for id := uint64(1); id <= 3; id++ {
		for _, mb := range members(t, tc.node(id)).Members {
			if (mb.ID == id) != (mb.Reachable == ReachableSelf) {
				t.Fatalf("node %d's view of node %d: reachable %q", id, mb.ID, mb.Reachable)
			}
		}
	}
	tc.stop(3)
	var view Membership
	waitUntil(t, 20*time.Second, "a leading node sees node 3 unreachable", func() bool {
		for _, id := range []uint64{1, 2} {
			view = members(t, tc.node(id))
			leads := slices.ContainsFunc(view.Members, func(mb Member) bool { return mb.ID == id && len(mb.LeaderOf) > 0 })
			if leads && view.Members[2].Reachable == ReachableNo {
				return true
			}
		}
		return false
	})
	dead, live := view.Members[2], view.Members[2-int(view.Node)]
	if dead.LastHeardMs == nil || time.Duration(*dead.LastHeardMs)*time.Millisecond < tc.node(view.Node).reachableWithin() {
		t.Fatalf("node 3 unreachable but last heard %v ms ago", dead.LastHeardMs)
	}
	if live.Reachable != ReachableYes || live.LastHeardMs == nil || *live.LastHeardMs > 1000 {
		t.Fatalf("node %d's view of live node %d: %q, last heard %v ms ago", view.Node, live.ID, live.Reachable, live.LastHeardMs)
	}
}

// Without a group either of them leads, two followers do not talk: their
// silence says nothing, and the view says so.
func TestMemberContactOfFollowersIsUnknown(t *testing.T) {
	const within = time.Second
	for _, tc := range []struct {
		self, inTouch bool
		heardAt, now  time.Duration
		want          string
		heardMs       int64 // -1: null
	}{
		{self: true, now: time.Minute, want: ReachableSelf, heardMs: -1},
		{inTouch: true, heardAt: 10 * time.Second, now: 10*time.Second + 200*time.Millisecond, want: ReachableYes, heardMs: 200},
		{inTouch: true, heardAt: 10 * time.Second, now: 15 * time.Second, want: ReachableNo, heardMs: 5000},
		{inTouch: true, now: 15 * time.Second, want: ReachableNo, heardMs: -1},
		{heardAt: 10 * time.Second, now: 15 * time.Second, want: ReachableUnknown, heardMs: 5000},
		{heardAt: 10 * time.Second, now: 10*time.Second + 200*time.Millisecond, want: ReachableYes, heardMs: 200},
		{inTouch: true, now: 500 * time.Millisecond, want: ReachableUnknown, heardMs: -1},
	} {
		var m Member
		m.contact(tc.self, tc.inTouch, tc.heardAt, tc.now, within)
		heard := int64(-1)
		if m.LastHeardMs != nil {
			heard = *m.LastHeardMs
		}
		if m.Reachable != tc.want || heard != tc.heardMs {
			t.Errorf("%+v: reachable %q, last heard %d ms; want %q, %d", tc, m.Reachable, heard, tc.want, tc.heardMs)
		}
	}
}
