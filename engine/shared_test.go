package engine

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

func TestDeadlineHeapOrdersAndRetains(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var h DeadlineHeap[int]
	var want []time.Duration
	for i := range 500 {
		at := time.Duration(rng.IntN(100))
		h.Push(at, i)
		want = append(want, at)
	}
	h.Retain(func(d Deadline[int]) bool { return d.Item%3 != 0 })
	kept := want[:0]
	for i, at := range want {
		if i%3 != 0 {
			kept = append(kept, at)
		}
	}
	slices.Sort(kept)
	for _, at := range kept {
		next, ok := h.Next()
		if d := h.Pop(); !ok || d.At != at || next != at || d.Item%3 == 0 {
			t.Fatalf("popped %+v (next %v), want instant %v", d, next, at)
		}
	}
	if _, ok := h.Next(); ok || len(h) != 0 {
		t.Fatalf("%d items left", len(h))
	}
}

func TestTenantsInternBothWays(t *testing.T) {
	var ts Tenants
	a, b := ts.Intern("alpha"), ts.Intern("beta")
	if a == 0 || b == 0 || a == b || ts.Intern("alpha") != a {
		t.Fatalf("alpha %d, beta %d", a, b)
	}
	if ts.Name(a) != "alpha" || ts.Name(b) != "beta" || ts.Name(0) != "" || ts.Name(b+1) != "" {
		t.Fatalf("names: %q %q %q %q", ts.Name(a), ts.Name(b), ts.Name(0), ts.Name(b+1))
	}
}

// A heap a burst left mostly empty gives its room back; one in use keeps
// it.
func TestDeadlineHeapShrinks(t *testing.T) {
	var h DeadlineHeap[int]
	for i := range 10_000 {
		h.Push(time.Duration(i), i)
	}
	h.Shrink()
	if cap(h) < 10_000 {
		t.Fatalf("a full heap shrank to capacity %d", cap(h))
	}
	for range 9_900 {
		h.Pop()
	}
	h.Shrink()
	if len(h) != 100 || cap(h) > 200 {
		t.Fatalf("after the burst: length %d, capacity %d; want 100 and at most 200", len(h), cap(h))
	}
	for i := 9_900; i < 10_000; i++ {
		if d := h.Pop(); d.Item != i {
			t.Fatalf("popped %d, want %d: the order was lost", d.Item, i)
		}
	}
}
