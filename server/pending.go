package server

import "hash/maphash"

// pendingTable maps the owners of a connection's requests in flight to
// what the connection keeps of them. It is an open-addressed table with
// linear probing and backward-shift deletion, like the engine's key
// table, rather than a Go map: a map costs a queued waiter a multiple of
// its 32-byte slot, and it never shrinks after a burst. This one
// grows at 3/4 full and shrinks below 1/8, and is seeded per connection,
// so owners a client picks to collide crowd only that client's table.
type pendingTable struct {
	seed  maphash.Seed
	slots []pendingSlot // a power of two long, or empty
	count int
}

// pendingSlot is free while p.h is nil: a stored inFlight never
// has a nil handle (reservedAcquire stands for "not answered yet").
type pendingSlot struct {
	owner uint64
	p     inFlight
}

const minPendingSlots = 8

func newPendingTable() pendingTable { return pendingTable{seed: maphash.MakeSeed()} }

func (t *pendingTable) len() int { return t.count }

func (t *pendingTable) home(owner uint64) int {
	return int(maphash.Comparable(t.seed, owner) & uint64(len(t.slots)-1))
}

// find returns owner's slot index, or -1.
func (t *pendingTable) find(owner uint64) int {
	if t.count == 0 {
		return -1
	}
	mask := len(t.slots) - 1
	for i := t.home(owner); ; i = (i + 1) & mask {
		switch s := &t.slots[i]; {
		case s.p.h == nil:
			return -1
		case s.owner == owner:
			return i
		}
	}
}

func (t *pendingTable) get(owner uint64) (inFlight, bool) {
	if i := t.find(owner); i >= 0 {
		return t.slots[i].p, true
	}
	return inFlight{}, false
}

// put stores p (whose handle is not nil) for owner, replacing what was.
func (t *pendingTable) put(owner uint64, p inFlight) {
	if i := t.find(owner); i >= 0 {
		t.slots[i].p = p
		return
	}
	if (t.count+1)*4 > len(t.slots)*3 {
		t.resize(max(minPendingSlots, 2*len(t.slots)))
	}
	t.place(owner, p)
	t.count++
}

func (t *pendingTable) place(owner uint64, p inFlight) {
	mask := len(t.slots) - 1
	i := t.home(owner)
	for t.slots[i].p.h != nil {
		i = (i + 1) & mask
	}
	t.slots[i] = pendingSlot{owner: owner, p: p}
}

// remove takes owner's entry out and returns it.
func (t *pendingTable) remove(owner uint64) (inFlight, bool) {
	i := t.find(owner)
	if i < 0 {
		return inFlight{}, false
	}
	p := t.slots[i].p
	mask := len(t.slots) - 1
	// Shift back the entries after i whose probe passed through it.
	for j := (i + 1) & mask; t.slots[j].p.h != nil; j = (j + 1) & mask {
		if k := t.home(t.slots[j].owner); (j-k)&mask >= (j-i)&mask {
			t.slots[i] = t.slots[j]
			i = j
		}
	}
	t.slots[i] = pendingSlot{}
	t.count--
	if len(t.slots) > minPendingSlots && t.count*8 < len(t.slots) {
		t.resize(len(t.slots) / 2)
	}
	return p, true
}

func (t *pendingTable) resize(size int) {
	old := t.slots
	t.slots = make([]pendingSlot, size)
	for _, s := range old {
		if s.p.h != nil {
			t.place(s.owner, s.p)
		}
	}
}

// each calls f with every entry.
func (t *pendingTable) each(f func(owner uint64, p inFlight)) {
	for _, s := range t.slots {
		if s.p.h != nil {
			f(s.owner, s.p)
		}
	}
}
