//go:build !race

package server

import (
	"net"
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

// Every ACQUIRE names its key in the origins table and every grant
// delivered is recorded there.
func TestOriginRecordDoesNotAllocate(t *testing.T) {
	o := newOrigins()
	key := []byte("jobs/nightly")
	remote := remoteAddrPort(&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40001})
	token := uint64(0)
	if n := testing.AllocsPerRun(1000, func() {
		token++
		o.record(o.originKey(o.tenantOrigin("acme"), key), token, remote)
	}); n != 0 {
		t.Fatalf("naming a key and recording its grant: %v allocs, want 0", n)
	}
}
