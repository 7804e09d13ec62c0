package client

import (
	"fmt"
	"time"

	"github.com/lockd/lockd/codec"
)

const (
	// DefaultLease is the lease of an Acquire whose Lease is zero.
	DefaultLease = 30 * time.Second
	// MaxWorkBudget is the largest MinWorkBudget an Acquire accepts.
	MaxWorkBudget = 250 * time.Second
	// IODeadline bounds an acquire with wait 0 and every release, retries
	// and reconnects included (SPEC §6), so a stuck transport never blocks
	// a caller for longer.
	IODeadline = 5 * time.Second
)

// AcquireOptions are the durations of one Acquire. Each is rounded up to
// whole seconds and then range-checked; a value out of range is an error
// before anything is sent, never clamped.
type AcquireOptions struct {
	// Lease is how long the server keeps the lock without a release:
	// 1..3600 s; zero means DefaultLease.
	Lease time.Duration
	// Wait bounds the whole call, from entry to result: 0..255 s. Zero is
	// one immediate attempt that never queues on the server, bounded by
	// IODeadline.
	Wait time.Duration
	// MinWorkBudget is required: the time the caller needs after the
	// Ticket is delivered (critical work, expected pauses, commit or
	// rollback). A grant whose remaining validity is shorter is released
	// again and reported ErrIndeterminate; since validity loses a drift
	// margin, a budget equal to the lease is never met. Build it with
	// Budget.
	MinWorkBudget WorkBudget
}

// WorkBudget is a required duration: its zero value is "not given", which
// Acquire refuses, so that forgetting the budget cannot silently mean zero.
type WorkBudget struct {
	d   time.Duration
	set bool
}

// Budget returns the work budget d, 0..250 s after rounding up.
func Budget(d time.Duration) WorkBudget { return WorkBudget{d: d, set: true} }

// acquireParams are AcquireOptions after rounding and range checks.
type acquireParams struct {
	leaseSeconds uint16
	waitSeconds  uint8
	budget       time.Duration
}

func (p acquireParams) lease() time.Duration {
	return time.Duration(p.leaseSeconds) * time.Second
}

func (o AcquireOptions) normalize() (acquireParams, error) {
	var p acquireParams
	lease := o.Lease
	if lease == 0 {
		lease = DefaultLease
	}
	leaseSeconds, err := wholeSeconds("Lease", lease, 1, codec.MaxLeaseSeconds)
	if err != nil {
		return p, err
	}
	waitSeconds, err := wholeSeconds("Wait", o.Wait, 0, codec.MaxWaitSeconds)
	if err != nil {
		return p, err
	}
	if !o.MinWorkBudget.set {
		return p, fmt.Errorf("%w: MinWorkBudget is required: pass client.Budget(d) with the time you need once the lock is held, 0..%v, or client.Budget(0) for no work after the grant", ErrUnsupportedDuration, MaxWorkBudget)
	}
	budgetSeconds, err := wholeSeconds("MinWorkBudget", o.MinWorkBudget.d, 0, int64(MaxWorkBudget/time.Second))
	if err != nil {
		return p, err
	}
	if budgetSeconds > leaseSeconds {
		return p, fmt.Errorf("%w: MinWorkBudget %d s > lease %d s", ErrInsufficientLease, budgetSeconds, leaseSeconds)
	}
	p.leaseSeconds = uint16(leaseSeconds)
	p.waitSeconds = uint8(waitSeconds)
	p.budget = time.Duration(budgetSeconds) * time.Second
	return p, nil
}

// wholeSeconds rounds d up to whole seconds and checks lo..hi.
func wholeSeconds(name string, d time.Duration, lo, hi int64) (int64, error) {
	if d < 0 {
		return 0, fmt.Errorf("%w: %s %v is negative", ErrUnsupportedDuration, name, d)
	}
	s := ceilSeconds(d)
	if s < lo || s > hi {
		return 0, fmt.Errorf("%w: %s %v is %d s after rounding up, outside %d..%d s", ErrUnsupportedDuration, name, d, s, lo, hi)
	}
	return s, nil
}

// ceilSeconds rounds a non-negative duration up to whole seconds without
// overflowing near the largest durations.
func ceilSeconds(d time.Duration) int64 {
	s := int64(d / time.Second)
	if d%time.Second != 0 {
		s++
	}
	return s
}
