package bench

import (
	"math"
	"math/bits"
	"time"
)

// The histogram is log-linear, in the manner of HdrHistogram: values below
// 2^linearBits nanoseconds get one bucket each, and every power of two
// above is cut into subBuckets equal buckets. A bucket is then never wider
// than 1/subBuckets of its lower bound, so any quantile it reports is
// within 0.8 % of the exact sample, while the whole range from 1 ns to
// 2^maxBits ns (about 18 minutes, beyond any wait the protocol allows)
// fits in a fixed array: recording is an index computation and an
// increment, with nothing allocated.
const (
	subBits    = 7
	subBuckets = 1 << subBits
	linearBits = subBits + 1
	maxBits    = 40
	numBuckets = (maxBits - linearBits + 2) * subBuckets
)

// Histogram counts latencies. The zero value is empty and ready. It is not
// safe for concurrent use: give each goroutine (or shard) its own and Merge
// them.
type Histogram struct {
	counts   [numBuckets]uint64
	total    uint64
	sum      float64
	min, max time.Duration
}

// bucketOf returns the bucket of a non-negative value.
func bucketOf(v uint64) int {
	n := bits.Len64(v)
	if n <= linearBits {
		return int(v)
	}
	if n > maxBits {
		return numBuckets - 1
	}
	shift := n - linearBits
	return shift*subBuckets + int(v>>shift)
}

// bucketRange returns the lowest value of bucket i and its width.
func bucketRange(i int) (low, width uint64) {
	if i < 2*subBuckets {
		return uint64(i), 1
	}
	shift := i/subBuckets - 1
	mantissa := uint64(i - shift*subBuckets)
	return mantissa << shift, 1 << shift
}

// Record counts one latency; a negative one counts as zero.
func (h *Histogram) Record(d time.Duration) {
	d = max(d, 0)
	h.counts[bucketOf(uint64(d))]++
	if h.total == 0 || d < h.min {
		h.min = d
	}
	h.max = max(h.max, d)
	h.total++
	h.sum += float64(d)
}

// Merge adds the counts of o to h.
func (h *Histogram) Merge(o *Histogram) {
	if o.total == 0 {
		return
	}
	for i, c := range o.counts {
		h.counts[i] += c
	}
	if h.total == 0 || o.min < h.min {
		h.min = o.min
	}
	h.max = max(h.max, o.max)
	h.total += o.total
	h.sum += o.sum
}

// Count is the number of recorded values.
func (h *Histogram) Count() uint64 { return h.total }

// Max is the largest recorded value, exactly.
func (h *Histogram) Max() time.Duration { return h.max }

// Min is the smallest recorded value, exactly.
func (h *Histogram) Min() time.Duration { return h.min }

// Mean is the exact mean of the recorded values.
func (h *Histogram) Mean() time.Duration {
	if h.total == 0 {
		return 0
	}
	return time.Duration(h.sum / float64(h.total))
}

// Quantile returns the nearest-rank q-quantile (0 < q <= 1): the highest
// value of the bucket that holds the ceil(q*n)-th smallest sample, clamped
// to the exact min and max. It is never below that sample and at most
// 1/128 of it above, so a reported p99.9 is never optimistic.
func (h *Histogram) Quantile(q float64) time.Duration {
	if h.total == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(h.total)))
	rank = min(max(rank, 1), h.total)
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			low, width := bucketRange(i)
			v := time.Duration(low + width - 1)
			return min(max(v, h.min), h.max)
		}
	}
	return h.max
}
