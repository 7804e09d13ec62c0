// Package engine is the lock table of lockd: it knows locks, waiters, tokens
// and time, and nothing of sockets, connections or bytes on the wire. Its
// rule core (rules.go, and abandon.go for SPEC §6a: requester tags, the
// ABANDON rule, tombstones) states the lock rules and the admission
// hysteresis as pure functions of a key's state and an instant; the
// Engine here and the cluster's replicated state machine both decide
// through it. Every grant and waiter records the Requester it was made
// for, so that its client can abandon it (abandons.go). The Engine is a
// sharded in-memory table keyed by (namespace, key) with one mutex per shard
// and no global lock on the hot path; every decision is a function of the
// calls it receives and of an injected monotonic Clock, so tests drive it with
// a FakeClock and Tick/Sweep and get the same result every run. Leases with
// queued waiters expire through a per-shard deadline min-heap whose entries
// are checked against the current token and lease end, or the waiter, when
// they come due (stale ones, such as the old end of a renewed lease, are
// dropped), so a lock is handed to the next waiter promptly without
// scanning; keys nobody waits for expire lazily and the 5 s Sweep reclaims
// them. Each shard indexes its live keys in an open-addressed table keyed by
// a hash computed once per request, so a lookup compares hashes in a flat
// array and key bytes only on a match. To keep acquire+release free of
// allocations, a key released with nobody waiting leaves the table and its
// entry, key buffer included, goes to the shard's free list for the next new
// key: at most max(1, MaxKeys/(4*Shards)) per shard (a quarter of MaxKeys in
// all), and Sweep drops those nobody needed since the previous Sweep and
// shrinks tables a flood left mostly empty.
// Tokens come from one counter per shard, starting at Config.FirstToken
// (default 1) and failing closed before it would wrap; a key always lives in
// the same shard, so its tokens strictly increase for the engine's lifetime.
// With a Config.HighWater they also grow across restarts: every counter stays
// below a mark recorded durably a block ahead, a grant only compares against
// it and wakes the next reservation half a block early (Run records it in the
// background, so no grant waits for a disk), and an engine started on the
// same mark begins above every token issued before. The engine never sees the
// file behind a HighWaterMark. Inspect and List (inspect.go) show locks to
// operators read-only, holding one shard's lock at a time.
package engine
