package engine

import "sync/atomic"

// AdmissionGate counts admitted units against a hard limit with hysteresis
// (SPEC §8): it closes when the count reaches 90 % of the limit and reopens
// only when the count drops below 75 %, so a refused caller is not let in
// again by the very next departure. It is safe for concurrent use; under
// concurrency the thresholds are approximate, but the limit itself is never
// exceeded.
type AdmissionGate struct {
	limit int64
	rule  GateRule

	count   atomic.Int64
	closed  atomic.Bool
	refused atomic.Uint64
}

// GateStats is a snapshot of an AdmissionGate. Refused counts the Busy answers
// this gate caused.
type GateStats struct {
	Open    bool
	Limit   int
	Count   int
	Refused uint64
}

// NewAdmissionGate returns an open gate for limit units; limit must be >= 1.
func NewAdmissionGate(limit int) *AdmissionGate {
	if limit < 1 {
		panic("engine: AdmissionGate limit must be >= 1")
	}
	l := int64(limit)
	return &AdmissionGate{limit: l, rule: NewGateRule(l)}
}

// Admit takes one unit and reports whether it was admitted; a refusal is
// counted. Every admitted unit must be given back with Leave.
func (g *AdmissionGate) Admit() bool {
	for {
		n := g.count.Load()
		if !g.AdmitCounted(n) {
			return false
		}
		if g.count.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// AdmitCounted decides one more unit for a gate whose units are counted
// elsewhere (count): the same hysteresis and refusal count, no unit held.
// Admit is it on the gate's own count.
func (g *AdmissionGate) AdmitCounted(count int64) bool {
	closed := g.closed.Load()
	admitted, closedAfter := g.rule.Admit(closed, count)
	if closedAfter != closed {
		g.closed.Store(closedAfter)
	}
	if !admitted {
		g.refused.Add(1)
	}
	return admitted
}

// Leave gives back one admitted unit.
func (g *AdmissionGate) Leave() {
	// Reopening here, not only in Admit, keeps Stats truthful while nobody
	// knocks.
	if n := g.count.Add(-1); g.rule.Reopens(n) && g.closed.Load() {
		g.closed.Store(false)
	}
}

// Stats returns a snapshot of the gate.
func (g *AdmissionGate) Stats() GateStats {
	return GateStats{
		Open:    !g.closed.Load(),
		Limit:   int(g.limit),
		Count:   int(g.count.Load()),
		Refused: g.refused.Load(),
	}
}
