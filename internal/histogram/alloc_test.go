//go:build !race

package histogram

import (
	"testing"
	"time"
)

func TestObserveDoesNotAllocate(t *testing.T) {
	var h Histogram
	if n := testing.AllocsPerRun(1000, func() { h.Observe(time.Millisecond) }); n != 0 {
		t.Errorf("Observe allocates %v times", n)
	}
}
