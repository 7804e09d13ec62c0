package cluster

// This file owns a replica's lease deadlines: the heap of lease ends on
// this node's clock, which only the group's leader acts on
// (housekeeping.go), and the wait ends that ask for a dated batch.

import (
	"time"

	"github.com/lockd/lockd/engine"
)

// leaseRef names one lease: key's grant of token at its renewals-th
// renewal, valid while the key still holds that token and no KEEP renewed
// it since. In the lease heap it is due at an instant of this node's
// clock; an orphan release names the grant it releases by it.
type leaseRef struct {
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
func (f *fsm) valid(e leaseRef) bool {
	l := f.state.locks[e.key]
	return l != nil && l.Token == e.token && l.renewals == e.renewals
}

// compactHeap drops stale heap entries when they outnumber live locks.
func (f *fsm) compactHeap() {
	if len(f.heap) > 64 && len(f.heap) > 2*len(f.state.locks) {
		f.heap.Retain(func(d engine.Deadline[leaseRef]) bool { return f.valid(d.Item) })
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
			at = now + seconds(l.leaseSeconds)
		}
		f.heap = append(f.heap, engine.Deadline[leaseRef]{At: at, Item: leaseRef{key: k, token: l.Token, renewals: l.renewals}})
	}
	f.heap.Init()
}

// due pops the valid entries due at now, re-arming each retry later in
// case the expire proposal is lost (a later token makes it stale).
func (f *fsm) due(now, retry time.Duration, out []leaseRef) []leaseRef {
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
