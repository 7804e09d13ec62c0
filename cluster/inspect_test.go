package cluster

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/lockd/lockd/codec"
	"github.com/lockd/lockd/server"
)

func getLocks(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d", url, resp.StatusCode)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
}

// TestInspectionInClusterMode: every node answers the admin inspection
// from its replica of the group's state, naming itself: a lock taken
// through node 1 with a waiter queued through node 2 shows the same token,
// queue, hold time and grant node (1) on all three, and the address the
// grant went to on node 1 alone, which delivered it; the list is sorted
// across groups, and a lease that lapsed shows as not held.
func TestInspectionInClusterMode(t *testing.T) {
	tc := newTestCluster(t, 3, nil)
	srvs := clusterServers(t, tc)
	c1, c2 := mustWire(t, srvs[0].Addr()), mustWire(t, srvs[1].Addr())
	var tokens []uint64
	keys := []string{"batch/3", "batch/1", "batch/2", "other/1"}
	for i, key := range keys {
		if err := c1.send(codec.AppendAcquire(nil, uint64(i+1), 60, 0, key)); err != nil {
			t.Fatal(err)
		}
		tokens = append(tokens, expectResp(t, c1, codec.OpAcquired, uint64(i+1)).Token)
	}
	if err := c2.send(codec.AppendAcquire(nil, 10, 60, 60, "batch/1")); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 10*time.Second, "queued", func() bool { return queueLen(tc.node(1), "batch/1") == 1 })

	for i, s := range srvs {
		node := fmt.Sprintf("node-%d", i+1)
		base := "http://" + s.AdminAddr() + "/v1/locks/default"
		var one server.LockStatus
		waitUntil(t, 10*time.Second, node+" applies the waiter", func() bool {
			getLocks(t, base+"/batch/1", &one)
			return one.Waiters == 1
		})
		if !one.Held || one.Token != tokens[1] || one.Node != node || one.NodeID != uint64(i+1) || one.LeaseRemainingMs <= 0 || one.LeaseRemainingMs > 60_000 {
			t.Errorf("%s: %+v, want token %d held with its lease, answered by %s", node, one, tokens[1], node)
		}
		// Held since its grant, on the group's clock, the clock its
		// lease ends on: with the lease left, the minute's lease, and a
		// little more when the grant came in a follower's undated batch
		// (its lease starts at the leader's next stamp: never early).
		if total := one.HeldForMs + one.LeaseRemainingMs; one.HeldForMs <= 0 || total < 60_000 || total > 61_000 {
			t.Errorf("%s: held for %d ms with %d ms left of a 60 s lease", node, one.HeldForMs, one.LeaseRemainingMs)
		}
		remote := ""
		if i == 0 {
			remote = c1.nc.LocalAddr().String()
		}
		if one.GrantNode != 1 || one.RemoteAddr != remote {
			t.Errorf("%s: granted through node %d to %q, want node 1 and %q", node, one.GrantNode, one.RemoteAddr, remote)
		}
		var list []server.LockStatus
		getLocks(t, base+"?prefix=batch/&limit=2", &list)
		var got []string
		for _, l := range list {
			got = append(got, l.Key)
			if !l.Held || l.Node != node {
				t.Errorf("%s listed %+v", node, l)
			}
		}
		if want := []string{"batch/1", "batch/2"}; !slices.Equal(got, want) {
			t.Errorf("%s: list %v, want %v", node, got, want)
		}
	}

	// A one-second lease, left to lapse.
	if err := c1.send(codec.AppendAcquire(nil, 20, 1, 0, "short")); err != nil {
		t.Fatal(err)
	}
	expectResp(t, c1, codec.OpAcquired, 20)
	var short server.LockStatus
	shortURL := "http://" + srvs[2].AdminAddr() + "/v1/locks/default/short"
	waitUntil(t, 10*time.Second, "node 3 applies the grant", func() bool {
		getLocks(t, shortURL, &short)
		return short.Held
	})
	waitUntil(t, 10*time.Second, "the lease lapses", func() bool {
		getLocks(t, shortURL, &short)
		return !short.Held
	})
	if short.Token != 0 || short.LeaseRemainingMs != 0 || short.Waiters != 0 {
		t.Errorf("lapsed: %+v", short)
	}
}
