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
	// closeAt and reopenBelow are count*10 >= limit*9 and count*4 < limit*3
	// solved for count (ceil(0.9*limit) = limit - limit/10, ceil(0.75*limit)
	// = limit - limit/4), which cannot overflow for any limit.
	closeAt     int64
	reopenBelow int64

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
	return &AdmissionGate{limit: l, closeAt: l - l/10, reopenBelow: l - l/4}
}

// Admit takes one unit and reports whether it was admitted; a refusal is
// counted. Every admitted unit must be given back with Leave.
func (g *AdmissionGate) Admit() bool {
	for {
		n := g.count.Load()
		if g.closed.Load() {
			if n >= g.reopenBelow {
				g.refused.Add(1)
				return false
			}
			g.closed.Store(false)
		}
		// closeAt <= limit, and the increment below only happens from a
		// count under closeAt, so this is also the hard limit.
		if n >= g.closeAt {
			g.closed.Store(true)
			g.refused.Add(1)
			return false
		}
		if g.count.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// Leave gives back one admitted unit.
func (g *AdmissionGate) Leave() {
	// Reopening here, not only in Admit, keeps Stats truthful while nobody
	// knocks.
	if n := g.count.Add(-1); n < g.reopenBelow && g.closed.Load() {
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
