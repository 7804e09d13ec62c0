package client

import "math/bits"

// pendingTable maps owners to the requests of one session, queued or in
// flight. Its size is fixed when the session starts so the hot path never
// allocates; open addressing with linear probing keeps at least half of
// the slots empty, and deletion shifts entries back instead of leaving
// tombstones, so probes stay short however long the session lives.
type pendingTable struct {
	slots []pendingSlot
	mask  uint64
	shift uint
	count int
}

type pendingSlot struct {
	owner uint64
	req   *request
}

func newPendingTable(capacity int) pendingTable {
	size := 2
	for size < 2*capacity {
		size <<= 1
	}
	return pendingTable{
		slots: make([]pendingSlot, size),
		mask:  uint64(size - 1),
		shift: uint(64 - bits.TrailingZeros(uint(size))),
	}
}

// home spreads consecutive owners, which is what the client-wide counter
// hands out, over the table (Fibonacci hashing).
func (t *pendingTable) home(owner uint64) uint64 {
	return (owner * 0x9E3779B97F4A7C15) >> t.shift
}

func (t *pendingTable) find(owner uint64) (uint64, bool) {
	if owner == 0 {
		return 0, false
	}
	for i := t.home(owner); ; i = (i + 1) & t.mask {
		switch t.slots[i].owner {
		case owner:
			return i, true
		case 0:
			return 0, false
		}
	}
}

// insert adds an owner that is absent; the caller keeps count below half
// the table.
func (t *pendingTable) insert(owner uint64, req *request) {
	i := t.home(owner)
	for t.slots[i].owner != 0 {
		i = (i + 1) & t.mask
	}
	t.slots[i] = pendingSlot{owner: owner, req: req}
	t.count++
}

func (t *pendingTable) get(owner uint64) *request {
	if i, ok := t.find(owner); ok {
		return t.slots[i].req
	}
	return nil
}

func (t *pendingTable) remove(owner uint64) *request {
	i, ok := t.find(owner)
	if !ok {
		return nil
	}
	req := t.slots[i].req
	for j := (i + 1) & t.mask; t.slots[j].owner != 0; j = (j + 1) & t.mask {
		// Move the entry at j back into the hole unless the hole lies
		// before its home slot on its probe path.
		if (j-t.home(t.slots[j].owner))&t.mask >= (j-i)&t.mask {
			t.slots[i] = t.slots[j]
			i = j
		}
	}
	t.slots[i] = pendingSlot{}
	t.count--
	return req
}

// reset empties the table.
func (t *pendingTable) reset() {
	clear(t.slots)
	t.count = 0
}
