package engine

import (
	"sync"
	"sync/atomic"
)

// TenantLimits is one tenant's share of the hard limits: its own keys,
// queued waiters and in-flight acquires, each admitted through a gate of
// its own with the SPEC §8 hysteresis (closes at 90 %, reopens below
// 75 %), on top of the global gates. A zero field leaves that resource to
// the global gate alone.
type TenantLimits struct {
	Keys, Waiters, Inflight int
}

// TenantGates are one tenant's gates; a nil gate is no cap.
type TenantGates struct {
	Keys, Waiters, Inflight *AdmissionGate
}

// TenantQuotas holds the gates of every tenant that has limits, indexed by
// Namespace so that the hot path finds them with one load. A nil
// *TenantQuotas has none. It is safe for concurrent use.
type TenantQuotas struct {
	limits func(tenant string) TenantLimits

	mu    sync.Mutex
	names []string                       // of the tenants with gates, for Stats
	gates atomic.Pointer[[]*TenantGates] // gates[ns], copied on write
}

// NewTenantQuotas returns the quotas that limits gives each tenant; nil
// limits means none.
func NewTenantQuotas(limits func(tenant string) TenantLimits) *TenantQuotas {
	if limits == nil {
		return nil
	}
	return &TenantQuotas{limits: limits}
}

// Add gives ns, the Namespace of tenant, its gates if it has limits and
// none yet.
func (q *TenantQuotas) Add(ns Namespace, tenant string) {
	if q == nil || q.Of(ns) != nil {
		return
	}
	l := q.limits(tenant)
	if l == (TenantLimits{}) {
		return
	}
	gate := func(limit int) *AdmissionGate {
		if limit <= 0 {
			return nil
		}
		return NewAdmissionGate(limit)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	var gates []*TenantGates
	if p := q.gates.Load(); p != nil {
		gates = *p
	}
	if int(ns) < len(gates) && gates[ns] != nil {
		return
	}
	next := make([]*TenantGates, max(len(gates), int(ns)+1))
	copy(next, gates)
	next[ns] = &TenantGates{Keys: gate(l.Keys), Waiters: gate(l.Waiters), Inflight: gate(l.Inflight)}
	q.gates.Store(&next)
	q.names = append(q.names, tenant)
}

// Of returns the gates of ns, nil when it has no limits.
func (q *TenantQuotas) Of(ns Namespace) *TenantGates {
	if q == nil {
		return nil
	}
	p := q.gates.Load()
	if p == nil || int(ns) >= len(*p) {
		return nil
	}
	return (*p)[ns]
}

// The methods below take and give back one unit of a tenant's gate. They
// are safe on a nil *TenantGates (a tenant without limits), and a nil gate
// always admits.

func (g *TenantGates) AdmitKey() bool      { return g == nil || admit(g.Keys) }
func (g *TenantGates) AdmitWaiter() bool   { return g == nil || admit(g.Waiters) }
func (g *TenantGates) AdmitInflight() bool { return g == nil || admit(g.Inflight) }

func (g *TenantGates) LeaveKey() {
	if g != nil {
		leave(g.Keys)
	}
}

func (g *TenantGates) LeaveWaiter() {
	if g != nil {
		leave(g.Waiters)
	}
}

func (g *TenantGates) LeaveInflight() {
	if g != nil {
		leave(g.Inflight)
	}
}

// AdmitKeyCounted is AdmitKey for a tenant whose keys are counted
// elsewhere (count, a replicated table's): the gate's hysteresis decides,
// and no unit is held.
func (g *TenantGates) AdmitKeyCounted(count int) bool {
	return g == nil || g.Keys == nil || g.Keys.AdmitCounted(int64(count))
}

func admit(g *AdmissionGate) bool { return g == nil || g.Admit() }

func leave(g *AdmissionGate) {
	if g != nil {
		g.Leave()
	}
}

// TenantStats are one tenant's gates, for /metrics.
type TenantStats struct {
	Tenant                              string
	KeysGate, WaitersGate, InflightGate GateStats
}

// Stats returns the gates of every tenant with limits, ns being how a
// tenant's Namespace is found.
func (q *TenantQuotas) Stats(ns func(tenant string) Namespace) []TenantStats {
	if q == nil {
		return nil
	}
	q.mu.Lock()
	names := append([]string(nil), q.names...)
	q.mu.Unlock()
	out := make([]TenantStats, 0, len(names))
	for _, name := range names {
		g := q.Of(ns(name))
		st := TenantStats{Tenant: name}
		for _, x := range []struct {
			gate *AdmissionGate
			into *GateStats
		}{{g.Keys, &st.KeysGate}, {g.Waiters, &st.WaitersGate}, {g.Inflight, &st.InflightGate}} {
			if x.gate != nil {
				*x.into = x.gate.Stats()
			} else {
				*x.into = GateStats{Open: true}
			}
		}
		out = append(out, st)
	}
	return out
}
