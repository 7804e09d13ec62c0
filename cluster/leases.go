package cluster

// This file owns a replica's lease deadlines: the heap of lease ends on
// this node's clock, which only the group's leader acts on
// (housekeeping.go), and the wait ends that ask for a dated batch.

import (
	"time"

	"github.com/lockd/lockd/engine"
)

// expiry is a lease end in a replica's expiry heap, due at an instant of
// this process's monotonic clock, valid while key still holds token and
// no KEEP renewed it since (renewals).
type expiry struct {
	key      string
	token    uint64
	renewals uint32
	lease    time.Duration // for entries not yet in the heap
}

// waitEnded pops the wait ends due at now and reports whether there was
// one; called with f.mu held.
func (f *fsm) waitEnded(now time.Duration) bool {
	ended := false
	for at, ok := f.waitEnds.Next(); ok && at <= now; at, ok = f.waitEnds.Next() {
		f.waitEnds.Pop()
		ended = true
	}
	f.waitEnds.Shrink()
	return ended
}

// valid reports whether e still names the key's current lease: its token
// and its latest renewal.
func (f *fsm) valid(e expiry) bool {
	l := f.state.locks[e.key]
	return l != nil && l.Token == e.token && l.renewals == e.renewals
}

// compactHeap drops stale heap entries when they outnumber live locks.
func (f *fsm) compactHeap() {
	if len(f.heap) > 64 && len(f.heap) > 2*len(f.state.locks) {
		f.heap.Retain(func(d engine.Deadline[expiry]) bool { return f.valid(d.Item) })
	}
}

// rebuild is run when this replica becomes the group's leader: the heap
// is rebuilt from the replicated lock table, keeping every deadline this
// replica already knew (never shorter) and giving a lock it has no entry
// for a full lease from now.
func (f *fsm) rebuild(now time.Duration) {
	known := make(map[string]time.Duration, len(f.heap))
	for _, d := range f.heap {
		if f.valid(d.Item) {
			known[d.Item.key] = max(known[d.Item.key], d.At)
		}
	}
	f.heap = f.heap[:0]
	for k, l := range f.state.locks {
		at, ok := known[k]
		if !ok {
			at = now + seconds(l.lease)
		}
		f.heap = append(f.heap, engine.Deadline[expiry]{At: at, Item: expiry{key: k, token: l.Token, renewals: l.renewals}})
	}
	f.heap.Init()
}

// due pops the valid entries due at now, re-arming each retry later in
// case the expire proposal is lost (a later token makes it stale).
func (f *fsm) due(now, retry time.Duration, out []expiry) []expiry {
	for at, ok := f.heap.Next(); ok && at <= now; at, ok = f.heap.Next() {
		e := f.heap.Pop().Item
		if !f.valid(e) {
			continue
		}
		out = append(out, e)
		f.heap.Push(now+retry, e)
	}
	return out
}
