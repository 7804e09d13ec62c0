package engine

import (
	"sync/atomic"
	"time"
)

// Clock is a monotonic clock; Now returns time since an arbitrary fixed origin.
type Clock interface{ Now() time.Duration }

// RealClock returns a Clock backed by the runtime's monotonic clock, with its
// origin at the call.
func RealClock() Clock { return realClock{start: time.Now()} }

type realClock struct{ start time.Time }

func (c realClock) Now() time.Duration { return time.Since(c.start) }

// FakeClock is a Clock that moves only when told to. It is safe for
// concurrent use; its zero value reads 0.
type FakeClock struct{ now atomic.Int64 }

// NewFakeClock returns a FakeClock reading 0.
func NewFakeClock() *FakeClock { return &FakeClock{} }

// Now returns the current fake instant.
func (c *FakeClock) Now() time.Duration { return time.Duration(c.now.Load()) }

// Advance moves the clock forward by d. A negative d panics: the engine
// relies on time never going backwards.
func (c *FakeClock) Advance(d time.Duration) {
	if d < 0 {
		panic("engine: FakeClock.Advance with a negative duration")
	}
	c.now.Add(int64(d))
}
