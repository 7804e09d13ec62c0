// Package histogram counts durations for /metrics on request paths: fixed
// exponential buckets of atomic counters, so that an observation is two
// atomic adds, takes no lock and allocates nothing. It knows nothing of
// Prometheus; a collector turns a Snapshot into a histogram sample at
// scrape time.
package histogram

import (
	"sync/atomic"
	"time"
)

// Buckets is the number of finite buckets: bucket i counts durations up
// to 8 µs·2^i, from 8 µs to about 268 s (above the longest wait of 255 s);
// one more counts the rest (+Inf).
const Buckets = 26

const firstBoundMicros = 8

// UpperBound is the inclusive upper bound of finite bucket i.
func UpperBound(i int) time.Duration {
	return time.Duration(firstBoundMicros<<i) * time.Microsecond
}

// Histogram is safe for concurrent use; its zero value is empty.
type Histogram struct {
	counts [Buckets + 1]atomic.Uint64
	sum    atomic.Int64 // nanoseconds
}

// bucketOf is the index of the smallest bound at or above d.
func bucketOf(d time.Duration) int {
	micros := (uint64(d) + 999) / 1000 // rounded up: d never lands below its bound
	if micros <= firstBoundMicros {
		return 0
	}
	i := 0
	for v := (micros - 1) / firstBoundMicros; v != 0; v >>= 1 {
		i++
	}
	return min(i, Buckets)
}

// Observe counts one duration; a negative one counts as 0.
func (h *Histogram) Observe(d time.Duration) { h.ObserveN(d, 1) }

// ObserveN counts n durations of d at once.
func (h *Histogram) ObserveN(d time.Duration, n uint64) {
	if n == 0 {
		return
	}
	d = max(d, 0)
	h.counts[bucketOf(d)].Add(n)
	h.sum.Add(int64(d) * int64(n))
}

// Snapshot is a histogram's counts at one instant, or the sum of several.
type Snapshot struct {
	Counts [Buckets + 1]uint64 // per bucket, not cumulative
	Sum    time.Duration
}

// AddTo adds h's counts to s.
func (h *Histogram) AddTo(s *Snapshot) {
	for i := range h.counts {
		s.Counts[i] += h.counts[i].Load()
	}
	s.Sum += time.Duration(h.sum.Load())
}

// Count is the number of durations observed.
func (s *Snapshot) Count() uint64 {
	var n uint64
	for _, c := range s.Counts {
		n += c
	}
	return n
}

// Cumulative maps each finite bucket's upper bound in seconds to the
// number of durations at or below it, as a Prometheus histogram has them.
func (s *Snapshot) Cumulative() map[float64]uint64 {
	out := make(map[float64]uint64, Buckets)
	var n uint64
	for i := range Buckets {
		n += s.Counts[i]
		out[UpperBound(i).Seconds()] = n
	}
	return out
}
