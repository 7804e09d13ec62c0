package defaults

import (
	"testing"
	"time"
)

func TestOrTakesTheDefaultOnlyForUnsetValues(t *testing.T) {
	if got := Or(0, 7); got != 7 {
		t.Fatalf("Or(0, 7) = %d", got)
	}
	if got := Or(-1, 7); got != 7 {
		t.Fatalf("Or(-1, 7) = %d", got)
	}
	if got := Or(3, 7); got != 3 {
		t.Fatalf("Or(3, 7) = %d", got)
	}
	if got := Or(time.Duration(0), time.Second); got != time.Second {
		t.Fatalf("Or(0s, 1s) = %v", got)
	}
	if got := Or(uint64(5), 9); got != 5 {
		t.Fatalf("Or(5, 9) = %d", got)
	}
}
