package cluster

import (
	"fmt"
	"testing"
	"time"

	"github.com/lockd/lockd/engine"
)

// A tenant's own quotas bind in cluster mode as in single mode: its keys
// (as the node's replicas count them) stop at 90 % of its share with B,
// reopen below 75 %, and another tenant is admitted meanwhile.
func TestTenantQuotaInCluster(t *testing.T) {
	tc := newTestCluster(t, 1, func(c *Config) {
		c.TenantLimits = func(tenant string) engine.TenantLimits {
			if tenant == "default" {
				return engine.TenantLimits{Keys: 10, Inflight: 100}
			}
			return engine.TenantLimits{}
		}
	})
	n := tc.node(1)
	rec := newRecorder()
	var tokens []uint64
	for i := range 10 {
		r := acquire(t, n, rec, uint64(i+1), fmt.Sprint("k", i), 30*time.Second, 0)
		want := engine.Granted
		if i == 9 {
			want = engine.Busy
		}
		if r.Outcome != want {
			t.Fatalf("key %d: %+v, want %v", i, r, want)
		}
		tokens = append(tokens, r.Token)
	}
	other := n.Namespace("other")
	for i := range 20 {
		owner := uint64(100 + i)
		if r, _ := n.Acquire(other, []byte(fmt.Sprint("k", i)), owner, 0, 30*time.Second, 0, rec); r.Outcome != engine.Queued {
			t.Fatalf("other tenant's acquire %d answered at once: %+v", i, r)
		}
		n.Flush()
		if r := rec.wait(t, owner, 10*time.Second); r.Outcome != engine.Granted {
			t.Fatalf("other tenant's key %d: %+v", i, r)
		}
	}
	// An acquire of a key the tenant holds is no new key: it is proposed.
	if r := acquire(t, n, rec, 50, "k0", 30*time.Second, 0); r.Outcome != engine.TimedOut {
		t.Fatalf("wait-0 acquire of a held key: %+v, want TimedOut", r)
	}
	var st engine.TenantStats
	for _, ts := range n.Stats().Tenants {
		if ts.Tenant == "default" {
			st = ts
		}
	}
	if st.KeysGate.Open || st.KeysGate.Count != 9 || st.KeysGate.Refused != 1 || st.InflightGate.Count != 0 {
		t.Fatalf("tenant gates %+v", st)
	}
	for i, token := range tokens[:2] {
		if r := release(t, n, rec, uint64(60+i), fmt.Sprint("k", i), token); r.Outcome != engine.Released {
			t.Fatalf("release: %+v", r)
		}
	}
	if r := acquire(t, n, rec, 70, "new", 30*time.Second, 0); r.Outcome != engine.Granted {
		t.Fatalf("at 7 of 10 keys: %+v, want Granted", r)
	}
}
