package bench

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// Every value falls inside the bucket bucketOf gives it, and the buckets
// tile the range without gaps or overlaps.
func TestBucketsTileTheRange(t *testing.T) {
	next := uint64(0)
	for i := range numBuckets - 1 {
		low, width := bucketRange(i)
		if low != next {
			t.Fatalf("bucket %d starts at %d, want %d", i, low, next)
		}
		if i >= 2*subBuckets && float64(width)/float64(low) > 1.0/subBuckets {
			t.Fatalf("bucket %d: width %d over %d is wider than 1/%d", i, width, low, subBuckets)
		}
		for _, v := range []uint64{low, low + width/2, low + width - 1} {
			if got := bucketOf(v); got != i {
				t.Fatalf("bucketOf(%d) = %d, want %d", v, got, i)
			}
		}
		next = low + width
	}
	if got := bucketOf(math.MaxUint64); got != numBuckets-1 {
		t.Fatalf("the largest value lands in bucket %d, want the last, %d", got, numBuckets-1)
	}
}

// exactQuantile is the nearest-rank quantile of sorted samples.
func exactQuantile(sorted []time.Duration, q float64) time.Duration {
	rank := int(math.Ceil(q * float64(len(sorted))))
	return sorted[min(max(rank, 1), len(sorted))-1]
}

func TestQuantilesMatchSortedSamples(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	distributions := map[string]func() time.Duration{
		"constant":  func() time.Duration { return 42 * time.Microsecond },
		"tiny":      func() time.Duration { return time.Duration(rng.IntN(300)) },
		"uniform":   func() time.Duration { return time.Duration(rng.Int64N(int64(10 * time.Millisecond))) },
		"lognormal": func() time.Duration { return time.Duration(math.Exp(rng.NormFloat64()*1.5 + 11)) },
		// Mostly fast, a 0.2 % tail of slow answers: p99.9 sits in the tail.
		"bimodal": func() time.Duration {
			if rng.IntN(1000) < 2 {
				return 200*time.Millisecond + time.Duration(rng.Int64N(int64(time.Second)))
			}
			return 50*time.Microsecond + time.Duration(rng.Int64N(int64(20*time.Microsecond)))
		},
	}
	for name, draw := range distributions {
		t.Run(name, func(t *testing.T) {
			for _, n := range []int{1, 7, 1000, 200_000} {
				var h Histogram
				samples := make([]time.Duration, n)
				for i := range samples {
					samples[i] = draw()
					h.Record(samples[i])
				}
				slices.Sort(samples)
				for _, q := range []float64{0.001, 0.5, 0.9, 0.99, 0.999, 0.9999, 1} {
					exact, got := exactQuantile(samples, q), h.Quantile(q)
					// Never optimistic, at most one bucket width above.
					if got < exact || float64(got-exact) > float64(exact)/subBuckets+1 {
						t.Errorf("n=%d q=%v: histogram %v, exact %v", n, q, got, exact)
					}
				}
				if h.Count() != uint64(n) || h.Min() != samples[0] || h.Max() != samples[n-1] {
					t.Errorf("n=%d: count %d min %v max %v, want %d %v %v", n, h.Count(), h.Min(), h.Max(), n, samples[0], samples[n-1])
				}
			}
		})
	}
}

func TestMergeEqualsRecordingEverything(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	var all, a, b Histogram
	for i := range 50_000 {
		v := time.Duration(rng.ExpFloat64() * float64(time.Millisecond))
		all.Record(v)
		if i%3 == 0 {
			a.Record(v)
		} else {
			b.Record(v)
		}
	}
	var merged, empty Histogram
	merged.Merge(&empty)
	merged.Merge(&a)
	merged.Merge(&b)
	if merged.counts != all.counts || merged.Count() != all.Count() || merged.Min() != all.Min() || merged.Max() != all.Max() {
		t.Fatal("merging two halves differs from recording everything in one histogram")
	}
	if d := merged.Mean() - all.Mean(); d < -time.Nanosecond || d > time.Nanosecond {
		t.Fatalf("mean %v, want %v", merged.Mean(), all.Mean())
	}
}

func TestEmptyAndNegative(t *testing.T) {
	var h Histogram
	if h.Quantile(0.99) != 0 || h.Max() != 0 || h.Mean() != 0 {
		t.Fatal("an empty histogram reports non-zero values")
	}
	h.Record(-time.Second)
	if h.Quantile(0.5) != 0 || h.Min() != 0 {
		t.Fatalf("a negative value should count as 0, got p50 %v min %v", h.Quantile(0.5), h.Min())
	}
}

func TestRecordAllocatesNothing(t *testing.T) {
	h := new(Histogram)
	if n := testing.AllocsPerRun(1000, func() { h.Record(123 * time.Microsecond) }); n != 0 {
		t.Fatalf("Record allocates %v times", n)
	}
}

func BenchmarkHistogramRecord(b *testing.B) {
	h := new(Histogram)
	d := time.Duration(0)
	for b.Loop() {
		d += 7919
		h.Record(d % (10 * time.Millisecond))
	}
}
