//go:build !race

package server

import (
	"testing"
	"time"
)

// The race detector allocates on its own, so this check runs without it.
// A loop's observation of its acquire answers is on every request's path.
func TestAcquireLatencyObservationDoesNotAllocate(t *testing.T) {
	var m metrics
	b := &batch{latency: m.nextLatencyStripe(), answers: make([]acquireAnswer, 0, ResponseBatch)}
	if n := testing.AllocsPerRun(1000, func() {
		for i := range ResponseBatch {
			b.answeredAcquire(acquireOutcome(i%int(acquireOutcomes)), int64(i))
		}
		b.observeAnswers(time.Millisecond)
		b.answers = b.answers[:0]
	}); n != 0 {
		t.Fatalf("observing a batch's acquire answers: %v allocs, want 0", n)
	}
}
