package engine

import (
	"testing"
	"unsafe"
)

// TestPerRequestItemsStayInTheirSizeClasses: a held key's entry and a
// queued waiter's Wait are the engine's items per request. The entry is
// most of a held lock's memory and fits the 64-byte size class (its key
// stored as in entrykey.go); the Wait fits the 80-byte one, §6a
// requester included (BenchmarkMemory measures the whole cost).
func TestPerRequestItemsStayInTheirSizeClasses(t *testing.T) {
	if n := unsafe.Sizeof(entry{}); n > 64 {
		t.Errorf("entry is %d bytes, past the 64-byte size class", n)
	}
	if n := unsafe.Sizeof(Wait{}); n > 80 {
		t.Errorf("Wait is %d bytes, past the 80-byte size class", n)
	}
}

// The wait and the lease packed in a Wait's span come back exactly at
// their limits (wait 255 s to the nanosecond, lease 3600 s).
func TestWaitSpanHoldsTheLongestWaitAndLease(t *testing.T) {
	const wait, lease = 255_000_000_999, 3_600_000_000_000
	w := Wait{arrived: 7, span: spanOf(lease, wait)}
	if got := w.waiting(); got.Deadline != 7+wait || got.Lease != lease || got.Arrived != 7 {
		t.Fatalf("waiting() = %+v", got)
	}
}
