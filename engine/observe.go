package engine

import (
	"time"

	"github.com/lockd/lockd/internal/histogram"
)

// shardObservations are what /metrics learns of a shard's leases: how
// long each was held and how many ended by expiry. They are written under
// the shard's lock, which Stats takes to read them, so an observation
// costs the request path no lock of its own and no shared cache line.
type shardObservations struct {
	holds    histogram.Histogram
	expiries uint64
}

// released records the end of ent's lease by a release at now.
func (s *shard) released(ent *entry, now time.Duration) {
	s.obs.holds.Observe(now - ent.granted)
}

// expired records the end of ent's lease by expiry, whoever noticed it:
// the holder was granted the whole lease.
func (s *shard) expired(ent *entry) {
	s.obs.holds.Observe(ent.lease.End - ent.granted)
	s.obs.expiries++
}

// AcquireAge is how long ago the queued acquire h arrived, for the
// server's acquire latency: the server keeps no instant per waiter.
func (b *Local) AcquireAge(h Handle) (time.Duration, bool) {
	w, ok := h.(*Wait)
	if !ok {
		return 0, false
	}
	return b.e.clock.Now() - w.arrived, true
}
