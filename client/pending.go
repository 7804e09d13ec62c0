package client

// pendingTable maps owners to the requests of one session, queued or in
// flight. Its size is fixed when the session starts so the hot path never
// allocates; open addressing with linear probing keeps at least half of
// the slots empty, and deletion shifts entries back instead of leaving
// tombstones, so probes stay short however long the session lives.
type pendingTable struct {
	slots []pendingSlot
	mask  uint64
	count int
	// displaced counts the entries not in their home slot; while there are
	// none, a removal has nothing to move back.
	displaced int
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
	}
}

// home is the owner's slot before probing. Owners come from the
// client-wide counter, so the requests in flight at once hold nearly
// consecutive owners: kept in consecutive slots, they share a few cache
// lines instead of missing the cache on nearly every access, and a slot is
// wanted again only a table's length of owners later.
func (t *pendingTable) home(owner uint64) uint64 {
	return owner & t.mask
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
	home := i
	for t.slots[i].owner != 0 {
		i = (i + 1) & t.mask
	}
	if i != home {
		t.displaced++
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
	if i != t.home(owner) {
		t.displaced--
	}
	for j := (i + 1) & t.mask; t.displaced > 0 && t.slots[j].owner != 0; j = (j + 1) & t.mask {
		// Move the entry at j back into the hole unless the hole lies
		// before its home slot on its probe path.
		home := t.home(t.slots[j].owner)
		if (j-home)&t.mask >= (j-i)&t.mask {
			if i == home {
				t.displaced--
			}
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
	t.count, t.displaced = 0, 0
}
