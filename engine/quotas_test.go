package engine

import (
	"fmt"
	"testing"
	"time"
)

// One tenant filling its share of keys, waiters or in-flight acquires
// gets B from its own gates, with the 90 %/75 % hysteresis, while the
// other tenant is admitted as before; the gates give their units back as
// keys leave and waiters resolve.
func TestTenantQuotas(t *testing.T) {
	clock := NewFakeClock()
	e := New(Config{Clock: clock, Shards: 4, TenantLimits: func(tenant string) TenantLimits {
		if tenant == "noisy" {
			return TenantLimits{Keys: 10, Waiters: 20, Inflight: 10}
		}
		return TenantLimits{}
	}})
	noisy, quiet := e.Namespace("noisy"), e.Namespace("quiet")
	var rec recorder
	acquire := func(ns Namespace, key string, owner uint64, wait time.Duration) Outcome {
		r, _ := e.Acquire(ns, []byte(key), owner, 0, 30*time.Second, wait, &rec)
		return r.Outcome
	}
	tokens := map[string]uint64{}
	for i := range 10 {
		key := fmt.Sprint("k", i)
		r, _ := e.Acquire(noisy, []byte(key), uint64(i), 0, 30*time.Second, 0, &rec)
		want := Granted
		if i >= 9 {
			want = Busy // 9 keys is 90 % of 10
		}
		if r.Outcome != want {
			t.Fatalf("noisy key %d: %v, want %v", i, r.Outcome, want)
		}
		tokens[key] = r.Token
	}
	for i := range 20 {
		if got := acquire(quiet, fmt.Sprint("k", i), uint64(100+i), 0); got != Granted {
			t.Fatalf("quiet key %d: %v, want Granted (another tenant's quota must not bind it)", i, got)
		}
	}
	st := tenantStats(t, e, "noisy")
	if st.KeysGate.Open || st.KeysGate.Count != 9 || st.KeysGate.Refused != 1 {
		t.Fatalf("noisy keys gate %+v", st.KeysGate)
	}
	// Down to 8 keys: still closed (reopens below 75 %, i.e. under 8).
	e.Release(noisy, []byte("k0"), tokens["k0"])
	if got := acquire(noisy, "new1", 50, 0); got != Busy {
		t.Fatalf("at 8 of 10 keys: %v, want Busy (hysteresis)", got)
	}
	e.Release(noisy, []byte("k1"), tokens["k1"])
	if got := acquire(noisy, "new2", 51, 0); got != Granted {
		t.Fatalf("at 7 of 10 keys: %v, want Granted", got)
	}

	// In-flight: queued waiters hold in-flight units; 9 of 10 close it.
	for i := range 9 {
		if got := acquire(noisy, "k2", uint64(200+i), time.Minute); got != Queued {
			t.Fatalf("noisy waiter %d: %v, want Queued", i, got)
		}
	}
	if got := acquire(noisy, "k2", 300, time.Minute); got != Busy {
		t.Fatalf("10th noisy in-flight acquire: %v, want Busy", got)
	}
	if got := acquire(quiet, "k0", 301, time.Minute); got != Queued {
		t.Fatalf("quiet waiter: %v, want Queued", got)
	}
	st = tenantStats(t, e, "noisy")
	if st.InflightGate.Count != 9 || st.WaitersGate.Count != 9 || st.InflightGate.Open {
		t.Fatalf("noisy gates with 9 waiters: %+v", st)
	}
	// The waiters time out: every unit comes back.
	clock.Advance(time.Minute)
	e.Tick()
	st = tenantStats(t, e, "noisy")
	if st.InflightGate.Count != 0 || st.WaitersGate.Count != 0 || !st.InflightGate.Open {
		t.Fatalf("noisy gates after the waits ended: %+v", st)
	}
	// The leases end and the sweep reclaims the keys.
	clock.Advance(time.Minute)
	e.Sweep()
	if st = tenantStats(t, e, "noisy"); st.KeysGate.Count != 0 || !st.KeysGate.Open {
		t.Fatalf("noisy keys gate after the sweep: %+v", st.KeysGate)
	}
	if got := e.quotas.Stats(e.Namespace); len(got) != 1 {
		t.Fatalf("tenants with gates: %+v, want noisy only", got)
	}
}

func tenantStats(t *testing.T, e *Engine, tenant string) TenantStats {
	t.Helper()
	for _, st := range e.quotas.Stats(e.Namespace) {
		if st.Tenant == tenant {
			return st
		}
	}
	t.Fatalf("no gates for %q", tenant)
	return TenantStats{}
}
