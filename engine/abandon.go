package engine

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"iter"
	"maps"
	"slices"
	"time"
)

// The §6a rule core (SPEC §6a, ABANDON): who asked for a grant or a
// waiter, what an ABANDON of that request does, and the tombstones that
// refuse the request should it arrive or apply later. Like rules.go it is
// pure: no lock, no clock of its own, no randomness, so that the Engine and
// the cluster's replicated state machine decide alike and every replica
// holds the same tombstones.

// Requester is the compact tag of one ACQUIRE of a session: a 64-bit
// function of the session's client_id and the request's owner (SPEC §6a's
// (client_id, owner)), recorded with every grant and waiter so that the
// client can abandon that request later. 0 is no session: such a request
// cannot be abandoned, and no ABANDON names it.
//
// Eight bytes instead of the 24 of the pair keep a held lock in its size
// class. What a tag gives up is room for collisions, and the argument is:
// client_id is a 128-bit bearer secret from a CSPRNG, and the session key
// (SessionKey) is 64 bits of SHA-256 of it, so another client, who can make
// any tag of its own sessions, must still guess the victim's 64-bit tag:
// one guess per X frame, naming one key, against the requesters of that
// key (its holder and its waiters), a chance of about 2^-64 per requester
// per frame. Honest sessions collide on one key only by the birthday bound
// over the tags live on that key at once (n²/2^65); the tags of one
// session never collide, the mix being a bijection of the owner for a
// fixed session key, apart from the one owner whose mix is 0 and becomes 1
// (a 2^-64 chance per session). The derivation has no per-process seed:
// the cluster replicates tags, not client_ids, so every process must
// derive the same one.
type Requester uint64

// SessionKey is what a connection keeps of its client_id after SESSION:
// 64 bits of SHA-256 of it, computed once per session, from which each
// ACQUIRE's Requester is a cheap mix. The client_id itself need not be
// kept anywhere. The zero SessionKey is no session.
type SessionKey uint64

// sessionDomain separates the session key's hash from any other use of
// SHA-256 over a client_id.
const sessionDomain = "lockd-v1-session"

// NewSessionKey derives the session key of client_id; never 0.
func NewSessionKey(clientID [16]byte) SessionKey {
	var buf [len(sessionDomain) + 16]byte
	copy(buf[:], sessionDomain)
	copy(buf[len(sessionDomain):], clientID[:])
	sum := sha256.Sum256(buf[:])
	return SessionKey(max(binary.BigEndian.Uint64(sum[:8]), 1))
}

// Requester is the tag of the session's ACQUIRE with owner; 0 for the
// zero SessionKey. The owner is spread by MurmurHash3's finalizer before
// the key is mixed in, so that two sessions' tags collide only by chance
// over the whole 64 bits, not whenever the keys differ by what the owners
// differ by.
func (k SessionKey) Requester(owner uint64) Requester {
	if k == 0 {
		return 0
	}
	return Requester(max(fmix64(fmix64(owner)^uint64(k)), 1))
}

// AbandonGrant is SPEC §6a ABANDON of target on a key whose lapsed lease
// has been settled and whose current grant was made for holder: Released
// when that grant is target's and still holds at now (the wrapper then
// releases it as RELEASE with its token does, the head waiter granted),
// NotHeld otherwise (the wrapper then drops target's queued waiter on the
// key, if it has one, and answers NotHeld all the same). In both cases the
// wrapper lays a tombstone (Tombstones.Lay).
func AbandonGrant(l Lease, holder, target Requester, now time.Duration) Outcome {
	if target != 0 && holder == target && l.HeldAt(now) {
		return Released
	}
	return NotHeld
}

// TombstoneLife is how long a tombstone refuses its ACQUIRE, from when it
// was laid. It must outlast every moment at which that ACQUIRE can still
// arrive or apply after its client closed the session and abandoned it. In
// single mode the ACQUIRE came on the closed connection itself, so it can
// only be among bytes the server read before the close, processed
// milliseconds after the ABANDON at worst. In cluster mode the node that
// took the ACQUIRE may keep proposing it until the request's own deadline:
// its wait (at most 255 s) plus the 5 s I/O deadline, 260 s after it was
// received, which is before the ABANDON was sent. Five minutes covers both
// with 40 s to spare, and is one constant for both modes, so that one
// script holds them to the same answers.
const TombstoneLife = 5 * time.Minute

// DefaultTombstonesPerTenant bounds the tombstones one tenant keeps. An
// ABANDON is sent only for an ACQUIRE that ended Indeterminate, so the
// bound is a burst of node losses' worth of in-flight acquires within a
// TombstoneLife. Past it the oldest tombstone goes first, which can cost
// only a lease (its ACQUIRE, were it to apply after all, would hold the key
// until the lease ends), never exclusion. A tombstone costs about 70 B
// plus its key (BenchmarkTombstoneMemory: 84 B with a 16-byte key, 196 B
// with a 128-byte one), so a tenant's full set is at most about 3.2 MB,
// and typically a fraction of that.
const DefaultTombstonesPerTenant = 1 << 14

// Tombstone is one abandoned request of a tenant: Requester's ACQUIRE of
// Key, refused until Laid + TombstoneLife.
type Tombstone struct {
	Requester Requester
	Key       string
	Laid      time.Duration
}

// Expires is the first instant at which t no longer refuses.
func (t Tombstone) Expires() time.Duration { return t.Laid + TombstoneLife }

// Tombstones are the tombstones of every tenant, T being how the wrapper
// names a tenant (the Engine's Namespace, the cluster's tenant name). Each
// tenant keeps at most its bound, oldest first out; a tombstone expires
// lazily when laying another and at Expire. Iteration (All) is in tenant
// order, then in the order they were laid, so that a snapshot of it, laid
// again in that order, rebuilds the same refusals. The zero value is not
// ready: use NewTombstones. Not safe for concurrent use.
type Tombstones[T cmp.Ordered] struct {
	bound   int
	tenants map[T]*tenantTombstones
	live    int
}

// tenantTombstones is one tenant's tombstones in the order they were laid
// (a ring), with an index counting those of each requester, so that an
// ACQUIRE whose requester has none is answered by one map lookup.
type tenantTombstones struct {
	ring  []Tombstone
	head  int // index of the oldest in ring
	n     int
	count map[Requester]int
}

// NewTombstones returns an empty set keeping at most bound tombstones per
// tenant (DefaultTombstonesPerTenant when bound is 0 or less).
func NewTombstones[T cmp.Ordered](bound int) *Tombstones[T] {
	if bound <= 0 {
		bound = DefaultTombstonesPerTenant
	}
	return &Tombstones[T]{bound: bound, tenants: make(map[T]*tenantTombstones)}
}

// Len is the number of tombstones kept, expired ones not yet dropped
// included. A wrapper checks it (or its own copy of it) before Refuses, so
// that an ACQUIRE pays for tombstones only when there are some.
func (t *Tombstones[T]) Len() int { return t.live }

// Bound is the per-tenant bound.
func (t *Tombstones[T]) Bound() int { return t.bound }

// Lay records that tenant's requester r abandoned its ACQUIRE of key at
// now; the tombstone refuses that ACQUIRE until now + TombstoneLife. It
// drops the tenant's expired tombstones first; when one for (r, key) is
// still in force it changes nothing more (the ACQUIRE it refuses was sent
// before either ABANDON). It returns how many tombstones it evicted to
// stay within the bound (0 or 1). r 0 lays nothing.
func (t *Tombstones[T]) Lay(tenant T, r Requester, key []byte, now time.Duration) (evicted int) {
	if r == 0 {
		return 0
	}
	tt := t.tenants[tenant]
	if tt == nil {
		tt = &tenantTombstones{count: make(map[Requester]int)}
		t.tenants[tenant] = tt
	}
	t.live -= tt.expire(now)
	if tt.find(r, key, now) {
		return 0
	}
	if tt.n == t.bound {
		tt.pop()
		t.live--
		evicted = 1
	}
	tt.push(Tombstone{Requester: r, Key: string(key), Laid: now}, t.bound)
	t.live++
	return evicted
}

// Refuses reports whether an ACQUIRE of key by tenant's requester r at now
// is tombstoned: answered TimedOut, never granted or queued. It changes
// nothing and allocates nothing.
func (t *Tombstones[T]) Refuses(tenant T, r Requester, key []byte, now time.Duration) bool {
	if r == 0 || t.live == 0 {
		return false
	}
	tt := t.tenants[tenant]
	return tt != nil && tt.find(r, key, now)
}

// Expire drops every tombstone expired at now (the periodic sweep) and
// returns how many.
func (t *Tombstones[T]) Expire(now time.Duration) int {
	dropped := 0
	for tenant, tt := range t.tenants {
		dropped += tt.expire(now)
		if tt.n == 0 {
			delete(t.tenants, tenant)
		}
	}
	t.live -= dropped
	return dropped
}

// All yields every tombstone kept, expired ones not yet dropped included:
// tenants in order, each tenant's oldest first.
func (t *Tombstones[T]) All() iter.Seq2[T, Tombstone] {
	return func(yield func(T, Tombstone) bool) {
		for _, tenant := range slices.Sorted(maps.Keys(t.tenants)) {
			tt := t.tenants[tenant]
			for i := range tt.n {
				if !yield(tenant, tt.ring[(tt.head+i)%len(tt.ring)]) {
					return
				}
			}
		}
	}
}

// find reports whether a tombstone of (r, key) refuses at now.
func (tt *tenantTombstones) find(r Requester, key []byte, now time.Duration) bool {
	if tt.count[r] == 0 {
		return false
	}
	for i := range tt.n {
		ts := &tt.ring[(tt.head+i)%len(tt.ring)]
		if ts.Requester == r && ts.Key == string(key) && now < ts.Expires() {
			return true
		}
	}
	return false
}

// expire pops the tombstones expired at now from the front; laid in time
// order, they are the oldest.
func (tt *tenantTombstones) expire(now time.Duration) int {
	n := 0
	for tt.n > 0 && tt.ring[tt.head].Expires() <= now {
		tt.pop()
		n++
	}
	return n
}

func (tt *tenantTombstones) pop() {
	ts := &tt.ring[tt.head]
	if tt.count[ts.Requester]--; tt.count[ts.Requester] == 0 {
		delete(tt.count, ts.Requester)
	}
	*ts = Tombstone{}
	tt.head = (tt.head + 1) % len(tt.ring)
	tt.n--
}

// push appends ts, growing the ring by doubling up to bound.
func (tt *tenantTombstones) push(ts Tombstone, bound int) {
	if tt.n == len(tt.ring) {
		grown := make([]Tombstone, min(max(2*len(tt.ring), 8), bound))
		for i := range tt.n {
			grown[i] = tt.ring[(tt.head+i)%len(tt.ring)]
		}
		tt.ring, tt.head = grown, 0
	}
	tt.ring[(tt.head+tt.n)%len(tt.ring)] = ts
	tt.n++
	tt.count[ts.Requester]++
}
