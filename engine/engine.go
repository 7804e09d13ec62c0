package engine

import (
	"encoding/binary"
	"hash/maphash"
	"math/bits"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockd/lockd/internal/defaults"
	"github.com/lockd/lockd/internal/histogram"
)

// Config sizes an Engine. Zero (or negative) fields take their defaults.
type Config struct {
	Shards      int   // rounded up to a power of two; default 256
	MaxKeys     int   // hard limit of live keys (held or with waiters); default DefaultMaxKeys
	MaxWaiters  int   // hard limit of queued waiters, global; default DefaultMaxWaiters
	MaxInflight int   // hard limit of in-flight acquires (being processed + queued), global; default DefaultMaxInflight
	Clock       Clock // default RealClock()
	// FirstToken is the first token of every shard's counter; default 1.
	// With HighWater, tokens start at its recorded mark if that is higher.
	FirstToken uint64
	// HighWater, when set, makes tokens grow across restarts (SPEC §4): no
	// token is issued at or above the mark it has recorded, ReserveTokens
	// and Run record the next mark a block ahead of the grants, and an
	// engine started on the same HighWater begins at its mark. Nil keeps
	// tokens increasing for the engine's lifetime only.
	HighWater HighWaterMark
	// TokenBlock is how many tokens one reservation adds; default
	// DefaultTokenBlock.
	TokenBlock uint64
	// TenantLimits, when set, gives each tenant its share of the limits
	// (asked once, when the tenant is first named); nil, or a zero
	// TenantLimits, leaves a tenant to the global gates alone.
	TenantLimits func(tenant string) TenantLimits
	// TombstonesPerTenant bounds each tenant's §6a tombstones; default
	// DefaultTombstonesPerTenant.
	TombstonesPerTenant int
}

// Defaults of the Config limits.
const (
	DefaultMaxKeys     = 1 << 20
	DefaultMaxWaiters  = 1 << 20
	DefaultMaxInflight = 1 << 20
)

const defaultShards = 256

// Namespace is an interned tenant: keys of different namespaces never meet.
type Namespace uint32

// Outcome is what an engine call did.
type Outcome uint8

const (
	Granted        Outcome = iota + 1 // lock acquired: Result.Token, Result.Waited set
	Queued                            // waiting; the Waiter will be resolved later exactly once
	TimedOut                          // wait elapsed (or wait 0 on a held key), not acquired
	Busy                              // refused by an admission gate, or a key past MaxKeyLen; not acquired
	Released                          // release accepted
	NotHeld                           // release or keep: key absent, token not current, or lease expired
	TokenExhausted                    // the token counter would overflow
	ShuttingDown                      // engine closed; queued waiters get this
	// Unavailable is cluster mode's answer when the key's Raft group had no
	// leader or quorum in time: a definitive non-acquisition (a grant that
	// still applies later is released by the server itself), or a release
	// whose outcome is unknown. The single-mode engine never returns it.
	Unavailable
	// Renewed answers Keep: the lease of the current token was extended
	// (or shortened) to now + lease; Result.Token is that same token.
	Renewed
)

var outcomeNames = [...]string{
	Granted:        "Granted",
	Queued:         "Queued",
	TimedOut:       "TimedOut",
	Busy:           "Busy",
	Released:       "Released",
	NotHeld:        "NotHeld",
	TokenExhausted: "TokenExhausted",
	ShuttingDown:   "ShuttingDown",
	Unavailable:    "Unavailable",
	Renewed:        "Renewed",
}

func (o Outcome) String() string {
	if int(o) < len(outcomeNames) && outcomeNames[o] != "" {
		return outcomeNames[o]
	}
	return "Outcome(" + strconv.Itoa(int(o)) + ")"
}

// Result is the answer to Acquire, Release or Keep, or the resolution of a
// queued acquire.
type Result struct {
	Outcome Outcome
	Token   uint64        // for Granted and Renewed
	Waited  time.Duration // for Granted: grant instant minus the Acquire call instant
}

// Waiter receives the outcome of a queued acquire. Resolve is called exactly
// once per Queued acquire that was not cancelled, with Granted, TimedOut,
// ShuttingDown, or, when the lock freed but no token could be given,
// TokenExhausted (the counter is at its end) or Busy (the tokens reserved
// so far had run out). It may be called from inside another engine call
// (Release, Tick, Acquire, Shutdown) while a shard lock is held, so it must
// not block and must not call back into the engine.
type Waiter interface{ Resolve(owner uint64, r Result) }

// Wait is the handle of a queued acquire, for Cancel.
type Wait struct {
	shard *shard
	// entry is the key w waits for while queued, and after a grant the
	// key it was granted, for ReleaseGranted: that entry may have left
	// the table and serve another key since, but its token then differs,
	// tokens being unique within a shard. Nil otherwise.
	entry *entry
	prev  *Wait
	next  *Wait

	// waiter is dropped once w has left its queue: a stale timer can keep w
	// alive for up to a full wait, and must not keep the connection behind
	// the Waiter alive with it.
	waiter    Waiter
	owner     uint64
	requester Requester
	// What the rule core knows of the queued acquire (Waiting), kept
	// compact, the Wait being the engine's largest item per request: the
	// arrival, and the lease and the wait packed in one word (spanOf).
	arrived time.Duration
	span    uint64
}

// A Wait's span holds its lease in milliseconds above its wait in
// nanoseconds: the wait (at most 255 s) fits in waitBits, the lease (at
// most 3600 s) in the 64 - waitBits = 25 bits of milliseconds above it.
// Packing them keeps a Wait, requester included, in the 80-byte size
// class.
const waitBits = 39

func spanOf(lease, wait time.Duration) uint64 {
	return uint64(lease/time.Millisecond)<<waitBits | uint64(wait)
}

// queued reports whether w is still in its key's queue.
func (w *Wait) queued() bool { return w.waiter != nil }

func (w *Wait) deadline() time.Duration {
	return w.arrived + time.Duration(w.span&(1<<waitBits-1))
}

func (w *Wait) waiting() Waiting {
	return Waiting{Arrived: w.arrived, Deadline: w.deadline(), Lease: time.Duration(w.span>>waitBits) * time.Millisecond}
}

// Engine is the lock table. All methods are safe for concurrent use.
type Engine struct {
	clock        Clock
	shards       []shard
	shardMask    uint64
	seed         maphash.Seed // of the shards' tables
	freePerShard int

	inflight *AdmissionGate
	keys     *AdmissionGate
	waiters  *AdmissionGate

	shuttingDown atomic.Bool

	// nextTick is the Clock instant Run will next Tick at (noDeadline while
	// it is ticking); a new earlier deadline wakes it through wake.
	nextTick atomic.Int64
	wake     chan struct{}

	tenants Tenants
	quotas  *TenantQuotas
	tokens  tokenReserve

	abandons abandonBook
}

// entry is one live key of the table: held, or with waiters. A retired
// entry leaves the table for its shard's free list, keeping its key buffer
// so that the next new key reuses both without allocating.
type entry struct {
	// keyData and keyLen are the key, a copy owned by the entry: see
	// key and setKey.
	keyData *byte
	lease   Lease
	head    *Wait
	tail    *Wait
	// granted is the instant the current token was granted, for the
	// hold time /metrics reports.
	granted time.Duration
	// holder is the requester the current token was granted for (SPEC
	// §6a), 0 when it had no session.
	holder Requester
	ns     Namespace
	keyLen uint16
	// leaseArmed: the lease end of the current token is in the timer
	// heap; only a held key with waiters needs one.
	leaseArmed bool
}

type shard struct {
	mu     sync.Mutex
	table  keyTable
	timers DeadlineHeap[timer]
	tokens TokenCounter // tokens start at the first token
	// free holds retired entries for reuse, at most freePerShard;
	// freeLow is its smallest length since the last Sweep, so that Sweep
	// drops only the entries nobody needed for a whole interval.
	free    []*entry
	freeLow int
	waiting int // queued waiters, to bound stale timers
	obs     shardObservations
	_       [64]byte // keeps neighbouring shards' locks off one cache line
}

// New returns an Engine sized by cfg.
func New(cfg Config) *Engine {
	shards := defaultShards
	if cfg.Shards > 0 {
		shards = 1 << bits.Len(uint(cfg.Shards-1))
	}
	maxKeys := defaults.Or(cfg.MaxKeys, DefaultMaxKeys)
	clock := cfg.Clock
	if clock == nil {
		clock = RealClock()
	}
	e := &Engine{
		clock:        clock,
		shards:       make([]shard, shards),
		shardMask:    uint64(shards - 1),
		seed:         maphash.MakeSeed(),
		freePerShard: max(1, maxKeys/(4*shards)),
		inflight:     NewAdmissionGate(defaults.Or(cfg.MaxInflight, DefaultMaxInflight)),
		keys:         NewAdmissionGate(maxKeys),
		waiters:      NewAdmissionGate(defaults.Or(cfg.MaxWaiters, DefaultMaxWaiters)),
		wake:         make(chan struct{}, 1),
		quotas:       NewTenantQuotas(cfg.TenantLimits),
		abandons:     abandonBook{tombs: NewTombstones[Namespace](cfg.TombstonesPerTenant)},
	}
	e.nextTick.Store(int64(noDeadline))
	lastToken := e.tokens.init(cfg) - 1
	for i := range e.shards {
		e.shards[i].tokens.Last = lastToken
	}
	return e
}

// Namespace interns tenant: the same tenant always gets the same Namespace.
// A tenant with limits gets its gates then.
func (e *Engine) Namespace(tenant string) Namespace {
	ns := e.tenants.Intern(tenant)
	e.quotas.Add(ns, tenant)
	return ns
}

// Tenants interns tenant names as Namespaces and maps them back. It is
// safe for concurrent use, and the zero value is ready; Namespace 0 is
// never issued.
type Tenants struct {
	mu     sync.RWMutex
	byName map[string]Namespace
	names  []string // names[ns-1] is the tenant of ns
}

// Intern returns tenant's Namespace, issuing one the first time.
func (t *Tenants) Intern(tenant string) Namespace {
	t.mu.RLock()
	ns, ok := t.byName[tenant]
	t.mu.RUnlock()
	if ok {
		return ns
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if ns, ok = t.byName[tenant]; !ok {
		if t.byName == nil {
			t.byName = make(map[string]Namespace)
		}
		t.names = append(t.names, tenant)
		ns = Namespace(len(t.names))
		t.byName[tenant] = ns
	}
	return ns
}

// Name returns the tenant of ns, or "" for a Namespace never issued.
func (t *Tenants) Name(ns Namespace) string {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if ns == 0 || int(ns) > len(t.names) {
		return ""
	}
	return t.names[ns-1]
}

// locate returns the shard of (ns, key) and the key's hash in that
// shard's table. Placement mixes eight bytes at a time with MurmurHash3's
// finalizer: deterministic, so that an engine's tokens are a function of
// its inputs alone and tests can reason about placement. The table's hash
// is seeded per engine (hash/maphash), so keys crafted to collide can at
// worst crowd one shard, never lengthen its probes.
func (e *Engine) locate(ns Namespace, key []byte) (*shard, uint64) {
	return &e.shards[placement(ns, key)&e.shardMask], e.hash(ns, key)
}

func (e *Engine) hash(ns Namespace, key []byte) uint64 {
	return maphash.Bytes(e.seed, key) ^ uint64(ns)*0x9E3779B97F4A7C15
}

func placement(ns Namespace, key []byte) uint64 {
	h := uint64(ns)<<32 | uint64(len(key))
	for len(key) >= 8 {
		h = fmix64(h ^ binary.LittleEndian.Uint64(key))
		key = key[8:]
	}
	var tail [8]byte
	copy(tail[:], key)
	return fmix64(h ^ binary.LittleEndian.Uint64(tail[:]))
}

func fmix64(h uint64) uint64 {
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	return h ^ h>>33
}

// Acquire tries to take the lock on key in ns for owner, the request
// tagged r (SPEC §6a; 0 when it has no session). On a held key it
// queues for up to wait (never when wait is 0), answers Queued with a
// non-nil *Wait, and later resolves w exactly once unless cancelled; w must
// be non-nil whenever wait > 0. A request r abandoned on key (a tombstone)
// is answered TimedOut. key is only borrowed during the call; a key
// longer than MaxKeyLen is refused Busy, never stored cut short. Other
// inputs are assumed valid (lease 1..3600 s, wait 0..255 s).
func (e *Engine) Acquire(ns Namespace, key []byte, owner uint64, r Requester, lease, wait time.Duration, w Waiter) (Result, *Wait) {
	if len(key) > MaxKeyLen {
		return Result{Outcome: Busy}, nil
	}
	s, h := e.locate(ns, key)
	s.mu.Lock()
	defer s.mu.Unlock()
	// Checked under the shard lock so that Shutdown, which takes every shard
	// lock after setting the flag, cannot miss a waiter queued here.
	if e.shuttingDown.Load() {
		return Result{Outcome: ShuttingDown}, nil
	}
	// Checked under the shard lock, which Abandon holds while it lays the
	// tombstone: an acquire either comes before the abandon (which then
	// finds its grant or its waiter) or is refused.
	if r != 0 && e.abandons.any() && e.abandons.refuses(ns, r, key, e.clock.Now()) {
		return Result{Outcome: TimedOut}, nil
	}
	quota := e.quotas.Of(ns)
	if !e.inflight.Admit() {
		return Result{Outcome: Busy}, nil
	}
	if !quota.AdmitInflight() {
		e.inflight.Leave()
		return Result{Outcome: Busy}, nil
	}
	// Read under the lock so that events within a shard are ordered in time.
	now := e.clock.Now()
	res, wt := e.acquireLocked(s, h, ns, quota, key, owner, r, lease, wait, w, now)
	if wt == nil {
		e.leaveInflight(quota)
	}
	return res, wt
}

func (e *Engine) acquireLocked(s *shard, h uint64, ns Namespace, quota *TenantGates, key []byte, owner uint64, r Requester, lease, wait time.Duration, w Waiter, now time.Duration) (Result, *Wait) {
	ent := s.table.get(h, ns, key)
	if ent != nil {
		// A due handoff goes first, or this acquire would jump the queue. An
		// expired key nobody waits for is retired here, so taking it again
		// passes the keys gate like a new key.
		ent = e.settle(s, h, ent, now)
	}
	var held Lease
	if ent != nil {
		held = ent.lease
	}
	switch Acquire(held, now, wait) {
	case TimedOut:
		return Result{Outcome: TimedOut}, nil
	case Granted:
		if limit := e.tokens.limit.Load(); !s.tokens.Room(limit) {
			return Result{Outcome: e.tokens.shortage(limit)}, nil
		}
		if !e.keys.Admit() {
			return Result{Outcome: Busy}, nil
		}
		if !quota.AdmitKey() {
			e.keys.Leave()
			return Result{Outcome: Busy}, nil
		}
		ent = s.newEntry(ns, key)
		s.table.insert(h, ent)
		e.grant(s, ent, r, now, lease)
		return Result{Outcome: Granted, Token: ent.lease.Token}, nil
	}
	if !e.waiters.Admit() {
		return Result{Outcome: Busy}, nil
	}
	if !quota.AdmitWaiter() {
		e.waiters.Leave()
		return Result{Outcome: Busy}, nil
	}
	wt := &Wait{
		shard:     s,
		entry:     ent,
		prev:      ent.tail,
		waiter:    w,
		owner:     owner,
		requester: r,
		arrived:   now,
		span:      spanOf(lease, wait),
	}
	if ent.tail != nil {
		ent.tail.next = wt
	} else {
		ent.head = wt
	}
	ent.tail = wt
	s.waiting++
	e.schedule(s, wt.deadline(), timer{wait: wt})
	e.armLease(s, ent)
	return Result{Outcome: Queued}, wt
}

// Cancel drops a queued acquire (its connection closed) without resolving
// it; the lock itself is untouched. It reports whether w was still queued,
// and is safe to call after w was resolved or cancelled, or with nil.
func (e *Engine) Cancel(w *Wait) bool {
	if w == nil {
		return false
	}
	s := w.shard
	s.mu.Lock()
	defer s.mu.Unlock()
	if !w.queued() {
		return false
	}
	ns := e.unqueue(s, w)
	w.waiter = nil
	e.leaveInflight(e.quotas.Of(ns))
	return true
}

// Release gives back the lock on key in ns if token is its current token and
// its lease has not expired, handing it to the head waiter if any. It passes
// no admission gate.
func (e *Engine) Release(ns Namespace, key []byte, token uint64) Result {
	s, h := e.locate(ns, key)
	s.mu.Lock()
	defer s.mu.Unlock()
	ent := s.table.get(h, ns, key)
	if ent == nil {
		return Result{Outcome: NotHeld}
	}
	return e.releaseLocked(s, h, ent, token, e.clock.Now())
}

// ReleaseGranted is Release of the lock that w, a queued acquire, was
// granted with token: for a grant its waiter could not take. It needs no
// key, so that the connection behind w keeps none per waiter.
func (e *Engine) ReleaseGranted(w *Wait, token uint64) Result {
	s := w.shard
	s.mu.Lock()
	defer s.mu.Unlock()
	ent := w.entry
	if w.queued() || ent == nil || ent.lease.Token != token {
		return Result{Outcome: NotHeld}
	}
	return e.releaseLocked(s, e.hash(ent.ns, ent.key()), ent, token, e.clock.Now())
}

func (e *Engine) releaseLocked(s *shard, h uint64, ent *entry, token uint64, now time.Duration) Result {
	if ent = e.settle(s, h, ent, now); ent == nil || Release(ent.lease, token, now) != Released {
		return Result{Outcome: NotHeld}
	}
	s.released(ent, now)
	if ent.head != nil {
		e.handoff(s, h, ent, now)
	} else {
		e.retire(s, h, ent)
	}
	return Result{Outcome: Released}
}

// Keep renews the lease on key in ns (SPEC §5, KEEP): if token is its
// current token and its lease has not expired, the lease ends at now +
// lease from now on, which may be sooner than before, and the token stays.
// Anything else is NotHeld. Like Release it passes no admission gate: it
// creates no key and no waiter. lease is assumed valid (1..3600 s).
func (e *Engine) Keep(ns Namespace, key []byte, token uint64, lease time.Duration) Result {
	s, h := e.locate(ns, key)
	s.mu.Lock()
	defer s.mu.Unlock()
	now := e.clock.Now()
	ent := s.table.get(h, ns, key)
	if ent != nil {
		ent = e.settle(s, h, ent, now)
	}
	if ent == nil {
		return Result{Outcome: NotHeld}
	}
	end := ent.lease.End
	if Keep(&ent.lease, token, now, lease) != Renewed {
		return Result{Outcome: NotHeld}
	}
	if ent.lease.End != end {
		// The armed timer, if any, carries the old lease end and is now
		// stale: a waiter must be handed the lock at the new one.
		ent.leaseArmed = false
		e.armLease(s, ent)
	}
	return Result{Outcome: Renewed, Token: token}
}

// Stats is a snapshot for /metrics.
type Stats struct {
	Keys, Waiters, Inflight int    // current counts
	TokensIssued            uint64 // total grants
	// LastToken is the highest token any shard has issued, or one below
	// the first token before any grant.
	LastToken uint64
	// TokenMark is the mark Config.HighWater recorded last, 0 without one:
	// every token issued is below it, and a restart starts at it.
	TokenMark uint64
	// TokensUnreserved counts grants refused (answered Busy) because the
	// tokens reserved so far had run out; TokenReserveFailures counts
	// marks that could not be recorded.
	TokensUnreserved, TokenReserveFailures uint64
	// HoldTimes are the leases that ended, from grant to release or
	// expiry; LeaseExpiries counts those that ended by expiry.
	HoldTimes     histogram.Snapshot
	LeaseExpiries uint64
	// UndeliveredQueued counts grants whose waiter could no longer take
	// them that the backend queued for release itself
	// (Backend.ReleaseUndelivered; each is released if its token is still
	// current then); UndeliveredDropped those it left to their lease (its
	// queue was full).
	UndeliveredQueued, UndeliveredDropped uint64
	// SPEC §6a: what the ABANDONs did — a grant released, a queued waiter
	// dropped, nothing there — and the tombstones: kept now (expired ones
	// not yet swept included), evicted past a tenant's bound, and the
	// acquires they refused.
	AbandonsReleased, AbandonsDroppedWaiter, AbandonsNothing uint64
	Tombstones                                               int
	TombstonesEvicted, TombstoneRefusals                     uint64

	KeysGate, WaitersGate, InflightGate GateStats
	// Tenants are the gates of the tenants with limits.
	Tenants []TenantStats
}

// Stats returns a snapshot of the counters.
func (e *Engine) Stats() Stats {
	var issued, last, expiries uint64
	var holds histogram.Snapshot
	for i := range e.shards {
		s := &e.shards[i]
		s.mu.Lock()
		issued += s.tokens.Issued
		last = max(last, s.tokens.Last)
		s.obs.holds.AddTo(&holds)
		expiries += s.obs.expiries
		s.mu.Unlock()
	}
	keys, waiters, inflight := e.keys.Stats(), e.waiters.Stats(), e.inflight.Stats()
	st := Stats{
		Keys:         keys.Count,
		Waiters:      waiters.Count,
		Inflight:     inflight.Count,
		TokensIssued: issued,
		LastToken:    last,
		TokenMark:    e.tokens.mark.Load(),

		HoldTimes:     holds,
		LeaseExpiries: expiries,

		TokensUnreserved:     e.tokens.unreserved.Load(),
		TokenReserveFailures: e.tokens.failures.Load(),

		KeysGate:     keys,
		WaitersGate:  waiters,
		InflightGate: inflight,

		Tenants: e.quotas.Stats(e.Namespace),
	}
	e.abandons.stats(&st)
	return st
}

// grant gives ent a fresh token; the caller has checked that the counter
// is below the token limit. Half a block before the limit it asks for the
// next block, which is recorded in the background.
func (e *Engine) grant(s *shard, ent *entry, r Requester, now, lease time.Duration) {
	s.tokens.Grant(&ent.lease, now, lease)
	ent.holder = r
	ent.granted = now
	ent.leaseArmed = false
	e.granted(s)
}

// granted asks for the next block of tokens half a block before the limit.
func (e *Engine) granted(s *shard) {
	if s.tokens.Last >= e.tokens.refillAt.Load() {
		e.tokens.want()
	}
}

// newEntry returns an entry for a key new to the table, reusing a retired
// one and its key buffer where it can.
func (s *shard) newEntry(ns Namespace, key []byte) *entry {
	n := len(s.free)
	var ent *entry
	if n == 0 {
		ent = &entry{}
	} else {
		ent = s.free[n-1]
		s.free[n-1] = nil
		s.free = s.free[:n-1]
		s.freeLow = min(s.freeLow, n-1)
	}
	ent.ns = ns
	ent.setKey(key)
	return ent
}

// settle applies a lease expiry that is due but not yet processed, and
// returns ent, or nil if it left the table.
func (e *Engine) settle(s *shard, h uint64, ent *entry, now time.Duration) *entry {
	if !ent.lease.Lapsed(now) {
		return ent
	}
	s.expired(ent)
	if ent.head != nil {
		return e.handoff(s, h, ent, now)
	}
	return e.retire(s, h, ent)
}

// handoff gives the freed lock of ent to the first waiter still within its
// wait, resolving the ones it passes, and returns ent, or nil if nobody could
// take it and it left the table.
func (e *Engine) handoff(s *shard, h uint64, ent *entry, now time.Duration) *entry {
	for ent.head != nil {
		w := ent.head
		e.unqueue(s, w)
		limit := e.tokens.limit.Load()
		r := HandOff(&ent.lease, &s.tokens, limit, w.waiting(), now)
		switch r.Outcome {
		case Granted:
			ent.holder = w.requester
			ent.granted = now
			ent.leaseArmed = false
			e.granted(s)
			w.entry = ent
			e.resolve(w, ent.ns, r)
			e.armLease(s, ent)
			return ent
		case TokenExhausted:
			r.Outcome = e.tokens.shortage(limit)
		}
		e.resolve(w, ent.ns, r)
	}
	return e.retire(s, h, ent)
}

// retire takes a key nobody holds or waits for out of the table; its entry
// goes to the shard's free list while that has room. It returns nil, the
// key's entry from now on.
func (e *Engine) retire(s *shard, h uint64, ent *entry) *entry {
	e.leaveKey(ent.ns)
	s.table.remove(h, ent)
	if len(s.free) < e.freePerShard {
		ent.lease = Lease{}
		s.free = append(s.free, ent)
	}
	return nil
}

// unqueue takes w out of its key's queue and returns the key's namespace.
func (e *Engine) unqueue(s *shard, w *Wait) Namespace {
	ent := w.entry
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		ent.head = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		ent.tail = w.prev
	}
	w.entry, w.prev, w.next = nil, nil, nil
	s.waiting--
	e.waiters.Leave()
	e.quotas.Of(ent.ns).LeaveWaiter()
	return ent.ns
}

// resolve answers a waiter of ns that has left its queue.
func (e *Engine) resolve(w *Wait, ns Namespace, r Result) {
	w.waiter.Resolve(w.owner, r)
	w.waiter = nil
	e.leaveInflight(e.quotas.Of(ns))
}

// leaveKey gives back the key units of a key of ns leaving the table.
func (e *Engine) leaveKey(ns Namespace) {
	e.keys.Leave()
	e.quotas.Of(ns).LeaveKey()
}

func (e *Engine) leaveInflight(quota *TenantGates) {
	e.inflight.Leave()
	quota.LeaveInflight()
}
