package engine

import "time"

// Deadline is an item due at an instant of a Clock.
type Deadline[T any] struct {
	At   time.Duration
	Item T
}

// DeadlineHeap is a binary min-heap of items by their instant, typed so
// that pushing allocates nothing beyond the slice (container/heap boxes
// every item). The engine's timers and cluster mode's lease and request
// deadlines share it; entries are validated when they come due, so a
// stale one is simply dropped, never searched for.
type DeadlineHeap[T any] []Deadline[T]

// Push adds item due at at.
func (h *DeadlineHeap[T]) Push(at time.Duration, item T) {
	*h = append(*h, Deadline[T]{At: at, Item: item})
	h.up(len(*h) - 1)
}

// Pop removes and returns the earliest deadline; the heap must not be
// empty.
func (h *DeadlineHeap[T]) Pop() Deadline[T] {
	old := *h
	d := old[0]
	n := len(old) - 1
	old[0] = old[n]
	old[n] = Deadline[T]{} // drop references for the GC
	*h = old[:n]
	h.down(0)
	return d
}

// Next returns the earliest instant, false when the heap is empty.
func (h DeadlineHeap[T]) Next() (time.Duration, bool) {
	if len(h) == 0 {
		return 0, false
	}
	return h[0].At, true
}

// Retain keeps only the deadlines keep approves, in one pass.
func (h *DeadlineHeap[T]) Retain(keep func(Deadline[T]) bool) {
	kept := (*h)[:0]
	for _, d := range *h {
		if keep(d) {
			kept = append(kept, d)
		}
	}
	clear((*h)[len(kept):])
	*h = kept
	h.Init()
}

// Shrink gives back the room a burst left: a heap holding under a quarter
// of its capacity (and more than minShrink of room) moves to a slice twice
// its length.
func (h *DeadlineHeap[T]) Shrink() {
	const minShrink = 64
	if c := cap(*h); c > minShrink && len(*h) < c/4 {
		*h = append(make(DeadlineHeap[T], 0, 2*len(*h)), *h...)
	}
}

// Init restores the heap order after the slice was built or edited
// directly.
func (h DeadlineHeap[T]) Init() {
	for i := len(h)/2 - 1; i >= 0; i-- {
		h.down(i)
	}
}

func (h DeadlineHeap[T]) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if h[p].At <= h[i].At {
			return
		}
		h[p], h[i] = h[i], h[p]
		i = p
	}
}

func (h DeadlineHeap[T]) down(i int) {
	for {
		c := 2*i + 1
		if c >= len(h) {
			return
		}
		if c+1 < len(h) && h[c+1].At < h[c].At {
			c++
		}
		if h[i].At <= h[c].At {
			return
		}
		h[i], h[c] = h[c], h[i]
		i = c
	}
}
