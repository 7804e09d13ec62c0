package histogram

import (
	"sync"
	"testing"
	"time"
)

func TestBucketsHoldTheirBounds(t *testing.T) {
	for i := range Buckets {
		bound := UpperBound(i)
		if got := bucketOf(bound); got != i {
			t.Errorf("%v (bound of bucket %d) lands in bucket %d", bound, i, got)
		}
		if got := bucketOf(bound + time.Nanosecond); got != i+1 {
			t.Errorf("%v lands in bucket %d, want %d", bound+time.Nanosecond, got, i+1)
		}
	}
	if got := bucketOf(0); got != 0 {
		t.Errorf("0 lands in bucket %d", got)
	}
	if got := bucketOf(time.Hour); got != Buckets {
		t.Errorf("an hour lands in bucket %d, want +Inf (%d)", got, Buckets)
	}
	if UpperBound(Buckets-1) < 255*time.Second {
		t.Errorf("the last finite bound %v is below the longest wait", UpperBound(Buckets-1))
	}
}

func TestSnapshotIsCumulativeAndSums(t *testing.T) {
	var h Histogram
	h.Observe(5 * time.Microsecond)
	h.ObserveN(100*time.Microsecond, 3)
	h.Observe(time.Hour)
	h.Observe(-time.Second)
	var s Snapshot
	h.AddTo(&s)
	if s.Count() != 6 {
		t.Fatalf("count %d, want 6", s.Count())
	}
	if want := 5*time.Microsecond + 300*time.Microsecond + time.Hour; s.Sum != want {
		t.Errorf("sum %v, want %v", s.Sum, want)
	}
	c := s.Cumulative()
	for le, want := range map[float64]uint64{8e-6: 2, 64e-6: 2, 128e-6: 5, UpperBound(Buckets - 1).Seconds(): 5} {
		if c[le] != want {
			t.Errorf("le %g: %d, want %d", le, c[le], want)
		}
	}
}

func TestConcurrentObservationsAllCount(t *testing.T) {
	var h Histogram
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 1000 {
				h.Observe(time.Millisecond)
			}
		}()
	}
	wg.Wait()
	var s Snapshot
	h.AddTo(&s)
	if s.Count() != 4000 || s.Sum != 4*time.Second {
		t.Errorf("count %d sum %v, want 4000 and 4s", s.Count(), s.Sum)
	}
}

func BenchmarkObserve(b *testing.B) {
	var h Histogram
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		h.Observe(time.Duration(i) * time.Microsecond)
	}
}
