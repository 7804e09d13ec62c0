package engine

// keyTable indexes a shard's live keys by the 64-bit hash the engine
// computes once per request (it also picks the shard), so a lookup hashes
// nothing again: it probes a flat array comparing hashes and compares key
// bytes only on a match. Open addressing with linear probing; deletion
// shifts entries back instead of leaving tombstones, so probes stay short
// however long the table lives. The hash is seeded per engine, so crafted
// keys cannot pile onto one probe sequence.
type keyTable struct {
	slots []keySlot
	count int
}

type keySlot struct {
	hash uint64 // never 0 in a used slot: see slotHash
	ent  *entry
}

const minTableSize = 8

// slotHash maps a hash to the non-zero value stored in a slot, which marks
// it used.
func slotHash(h uint64) uint64 { return h | 1 }

func (t *keyTable) mask() uint64 { return uint64(len(t.slots) - 1) }

// get returns the live entry of (ns, key), or nil.
func (t *keyTable) get(h uint64, ns Namespace, key []byte) *entry {
	if len(t.slots) == 0 {
		return nil
	}
	sh := slotHash(h)
	for i := sh & t.mask(); ; i = (i + 1) & t.mask() {
		s := &t.slots[i]
		switch {
		case s.hash == 0:
			return nil
		case s.hash == sh && s.ent.ns == ns && string(s.ent.key()) == string(key):
			return s.ent
		}
	}
}

// insert adds ent, whose key is absent, under hash h.
func (t *keyTable) insert(h uint64, ent *entry) {
	// Grow at 70 % so that a miss, the common case for a new key, probes
	// a few slots only.
	if (t.count+1)*10 > len(t.slots)*7 {
		t.resize(max(minTableSize, 2*len(t.slots)))
	}
	t.place(slotHash(h), ent)
	t.count++
}

func (t *keyTable) place(sh uint64, ent *entry) {
	i := sh & t.mask()
	for t.slots[i].hash != 0 {
		i = (i + 1) & t.mask()
	}
	t.slots[i] = keySlot{hash: sh, ent: ent}
}

// remove deletes ent, which is in the table under hash h.
func (t *keyTable) remove(h uint64, ent *entry) {
	sh := slotHash(h)
	i := sh & t.mask()
	for t.slots[i].ent != ent {
		i = (i + 1) & t.mask()
	}
	for j := (i + 1) & t.mask(); t.slots[j].hash != 0; j = (j + 1) & t.mask() {
		// Move the entry at j back into the hole unless the hole lies
		// before its home slot on its probe path.
		if (j-t.slots[j].hash)&t.mask() >= (j-i)&t.mask() {
			t.slots[i] = t.slots[j]
			i = j
		}
	}
	t.slots[i] = keySlot{}
	t.count--
}

// shrink gives memory back after a flood: a table at under an eighth of
// its size is rebuilt at about a third full.
func (t *keyTable) shrink() {
	if len(t.slots) > minTableSize && t.count*8 < len(t.slots) {
		size := minTableSize
		for size*3 < t.count*10 {
			size *= 2
		}
		t.resize(size)
	}
}

func (t *keyTable) resize(size int) {
	old := t.slots
	t.slots = make([]keySlot, size)
	for _, s := range old {
		if s.hash != 0 {
			t.place(s.hash, s.ent)
		}
	}
}

// sweep removes every entry for which drop reports true. An entry may be
// offered twice, when a removal shifts it back past the scan, so drop must
// say false, with no effect, to an entry it keeps.
func (t *keyTable) sweep(drop func(*entry) bool) {
	for i := 0; i < len(t.slots); {
		s := t.slots[i]
		if s.hash != 0 && drop(s.ent) {
			// The slot may now hold an entry shifted back: look again.
			t.remove(s.hash, s.ent)
			continue
		}
		i++
	}
}
