package engine

import "unsafe"

// An entry, one per live key, stores its key as a pointer to the key's
// buffer and a 16-bit length rather than as a slice: memory per held lock
// is mostly the entry, and the slice's 24 bytes (pointer, length,
// capacity) would put it in the 80-byte size class, where the pointer and
// the length keep it in the 64-byte one (MEMORY.md). The length sits among
// the entry's small fields, not in a struct with the pointer, which would
// pad the pair back to 16 bytes.
//
// No capacity is stored: it follows from the length. A buffer is
// allocated with keyCap(len) bytes, and a retired entry's buffer serves a
// new key only when that key fits in keyCap of the current length, so
// every buffer holds at least keyCap(len) bytes whatever keys it served
// before.

// MaxKeyLen is the longest key the engine takes, its length being stored
// in 16 bits: Acquire answers a longer key Busy, and Release, Keep and
// Abandon find no lock for it. The protocol's keys are far shorter.
const MaxKeyLen = 1<<16 - 1

// keyCap is the size of the buffer allocated for a key of n bytes: n
// rounded up to 16, the allocator's step for small sizes, so the rounding
// costs no memory and lets keys of nearby lengths reuse the buffer.
func keyCap(n int) int { return (n + 15) &^ 15 }

// key returns ent's key. It aliases the entry's buffer: it is valid until
// the entry serves another key.
func (ent *entry) key() []byte { return unsafe.Slice(ent.keyData, ent.keyLen) }

// setKey copies key, at most MaxKeyLen bytes, into ent, reusing ent's
// buffer when the key fits in it.
func (ent *entry) setKey(key []byte) {
	if len(key) > keyCap(int(ent.keyLen)) {
		ent.keyData = unsafe.SliceData(make([]byte, keyCap(len(key))))
	}
	copy(unsafe.Slice(ent.keyData, len(key)), key)
	ent.keyLen = uint16(len(key))
}
