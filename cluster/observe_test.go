package cluster

import (
	"fmt"
	"testing"
	"time"

	"github.com/lockd/lockd/engine"
)

// commitMarker is the event that shows what node from had queued for
// key's group has gone out: it acquires a fresh key of that group through
// from and waits until every running node has applied the grant. From's
// proposer turns the commands it has queued — orphan releases included,
// counted in ClusterStats when proposed — into proposals no later than
// the marker's, and a proposal the group took before the marker's is
// applied before it on every replica. A test that must show a command was
// never proposed checks the state after this instead of sleeping "long
// enough" for it to commit.
func commitMarker(t *testing.T, tc *testCluster, from uint64, key string, rec *recorder, owner uint64) {
	t.Helper()
	n := tc.node(from)
	marker := keyInGroup(fmt.Sprintf("marker/%d", owner), n.GroupOf("default", []byte(key)), tc.cfgs[from-1].Groups)
	r := acquire(t, n, rec, owner, marker, time.Minute, 0)
	if r.Outcome != engine.Granted {
		t.Fatalf("marker acquire of %q through node %d: %+v", marker, from, r)
	}
	for i, other := range tc.nodes {
		if other != nil {
			waitUntil(t, 10*time.Second, fmt.Sprintf("node %d applies the marker", i+1), func() bool {
				return other.Token("default", []byte(marker)) == r.Token
			})
		}
	}
}
