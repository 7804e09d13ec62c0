package engine

import (
	"bytes"
	"container/heap"
	"slices"
	"strings"
	"time"
)

// This file owns read-only inspection of the lock table, for operators:
// what one key's lock looks like now, and the locks of a tenant in key
// order. It changes nothing, interns no tenant, and holds one shard's lock
// at a time, never the whole table's.

// LockInfo is one key as inspection shows it, at one instant: whether a
// lease holds it (a lapsed lease is free, SPEC §5, so it shows as not
// held), the token and the time left if so, and how many acquires queue
// for it.
type LockInfo struct {
	Key            string
	Held           bool
	Token          uint64        // 0 unless Held
	LeaseRemaining time.Duration // 0 unless Held
	// HeldFor is how long ago the current token was granted; 0 unless
	// Held.
	HeldFor time.Duration
	Waiters int
	// GrantNode is, in cluster mode, the id of the node whose client's
	// request got the token (the node that delivered the grant); 0 unless
	// Held, and 0 from a backend without nodes.
	GrantNode uint64
}

// Inspector is a backend that can show its locks. It is not part of
// Backend: a server offers inspection only over a backend that has it.
// An unknown tenant has no locks; the answers never create one.
type Inspector interface {
	// InspectLock shows key of tenant; an absent key is not held and has
	// no waiters.
	InspectLock(tenant string, key []byte) LockInfo
	// ListLocks shows, sorted by key, at most limit keys of tenant that
	// start with prefix and are held or waited for.
	ListLocks(tenant string, prefix []byte, limit int) []LockInfo
}

// Lookup returns tenant's Namespace if it has been interned, without
// interning it.
func (t *Tenants) Lookup(tenant string) (Namespace, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	ns, ok := t.byName[tenant]
	return ns, ok
}

// LookupNamespace is Tenants.Lookup on the engine's tenants.
func (e *Engine) LookupNamespace(tenant string) (Namespace, bool) { return e.tenants.Lookup(tenant) }

// Inspect shows key in ns now.
func (e *Engine) Inspect(ns Namespace, key []byte) LockInfo {
	s, h := e.locate(ns, key)
	now := e.clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if ent := s.table.get(h, ns, key); ent != nil {
		return ent.info(now)
	}
	return LockInfo{Key: string(key)}
}

// List shows, sorted by key, at most limit keys of ns that start with
// prefix and are held or have waiters. It scans one shard at a time under
// that shard's lock and copies a key only while it is among the limit
// smallest seen so far.
func (e *Engine) List(ns Namespace, prefix []byte, limit int) []LockInfo {
	smallest := NewSmallestLocks(limit)
	for i := range e.shards {
		s := &e.shards[i]
		now := e.clock.Now()
		s.mu.Lock()
		for _, slot := range s.table.slots {
			ent := slot.ent
			if slot.hash == 0 || ent.ns != ns || !bytes.HasPrefix(ent.key(), prefix) || !smallest.Wants(string(ent.key())) {
				continue
			}
			if info := ent.info(now); info.Held || info.Waiters > 0 {
				smallest.Add(info) // a lapsed, unclaimed key is free, as if absent
			}
		}
		s.mu.Unlock()
	}
	return smallest.Sorted()
}

// info is ent at now; the caller holds its shard's lock. Counting the
// waiters walks the key's queue, which the waiters gate bounds.
func (ent *entry) info(now time.Duration) LockInfo {
	info := LockInfo{Key: string(ent.key())}
	if ent.lease.HeldAt(now) {
		info.Held, info.Token, info.LeaseRemaining = true, ent.lease.Token, ent.lease.End-now
		info.HeldFor = now - ent.granted
	}
	for w := ent.head; w != nil; w = w.next {
		info.Waiters++
	}
	return info
}

// SmallestLocks keeps the limit smallest keys offered to it, for a list
// gathered shard by shard: a caller asks Wants before copying a key out.
type SmallestLocks struct {
	limit int
	kept  lockInfoHeap
}

// NewSmallestLocks keeps at most limit keys (none when limit <= 0).
func NewSmallestLocks(limit int) *SmallestLocks { return &SmallestLocks{limit: max(limit, 0)} }

// Wants reports whether key would be kept.
func (s *SmallestLocks) Wants(key string) bool {
	return len(s.kept) < s.limit || (s.limit > 0 && key < s.kept[0].Key)
}

// Add keeps info if its key is among the limit smallest.
func (s *SmallestLocks) Add(info LockInfo) {
	if !s.Wants(info.Key) {
		return
	}
	heap.Push(&s.kept, info)
	if len(s.kept) > s.limit {
		heap.Pop(&s.kept)
	}
}

// Sorted returns the keys kept in key order.
func (s *SmallestLocks) Sorted() []LockInfo {
	out := slices.Clone(s.kept)
	slices.SortFunc(out, func(a, b LockInfo) int { return strings.Compare(a.Key, b.Key) })
	return out
}

// lockInfoHeap is a max-heap by key: its root is the largest key kept,
// the first to go when a smaller one comes.
type lockInfoHeap []LockInfo

func (h lockInfoHeap) Len() int           { return len(h) }
func (h lockInfoHeap) Less(i, j int) bool { return h[i].Key > h[j].Key }
func (h lockInfoHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *lockInfoHeap) Push(x any)        { *h = append(*h, x.(LockInfo)) }
func (h *lockInfoHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

var _ Inspector = (*Local)(nil)

// InspectLock is Engine.Inspect by tenant name.
func (b *Local) InspectLock(tenant string, key []byte) LockInfo {
	ns, ok := b.e.LookupNamespace(tenant)
	if !ok {
		return LockInfo{Key: string(key)}
	}
	return b.e.Inspect(ns, key)
}

// ListLocks is Engine.List by tenant name.
func (b *Local) ListLocks(tenant string, prefix []byte, limit int) []LockInfo {
	ns, ok := b.e.LookupNamespace(tenant)
	if !ok {
		return nil
	}
	return b.e.List(ns, prefix, limit)
}
