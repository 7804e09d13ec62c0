package client

import (
	"sync"
	"sync/atomic"
	"time"
)

// Ticket is a held lock: the key, the fencing token the server issued for
// this grant, and how long the client may rely on it. Pass Token to every
// system the critical section writes to, so that a write carrying an older
// token can be refused. A Ticket is a value; copies are the same lock.
type Ticket struct {
	c          *Client
	key        string
	token      uint64
	validUntil time.Time
}

// Key is the locked key.
func (t Ticket) Key() string { return t.key }

// Token is the fencing token: never 0, strictly increasing per key.
func (t Ticket) Token() uint64 { return t.token }

// ValidUntil is the instant until which the lock is surely held: the send
// instant of the ACQUIRE, plus the server's reported wait, plus the lease,
// minus a drift margin. It carries the monotonic clock reading, so wall
// clock jumps do not move it.
func (t Ticket) ValidUntil() time.Time { return t.validUntil }

// Remaining is the validity left, never negative.
func (t Ticket) Remaining() time.Duration {
	if t.c == nil {
		return 0
	}
	return max(t.validUntil.Sub(t.c.clock.Now()), 0)
}

// Lost returns a channel that is closed when the ticket's validity ends:
// at ValidUntil, or earlier when a release through this client is answered
// RELEASED or NOT HELD. Every copy of the Ticket returns the same channel.
// The watch costs a timer and is only set up by the first call.
func (t Ticket) Lost() <-chan struct{} {
	if t.c == nil {
		return closedChan
	}
	return t.c.watches.lost(t)
}

var closedChan = func() chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}()

type watchKey struct {
	key   string
	token uint64
}

type leaseWatch struct {
	lost  chan struct{}
	timer timer
}

// watches are the Lost channels handed out, keyed by grant, so that a
// release can close them early. active lets a release skip the lock when
// nobody watches.
type watches struct {
	mu     sync.Mutex
	byKey  map[watchKey]*leaseWatch
	active atomic.Int64
}

func (w *watches) lost(t Ticket) <-chan struct{} {
	k := watchKey{key: t.key, token: t.token}
	w.mu.Lock()
	defer w.mu.Unlock()
	if lw, ok := w.byKey[k]; ok {
		return lw.lost
	}
	left := t.validUntil.Sub(t.c.clock.Now())
	if left <= 0 {
		return closedChan
	}
	if w.byKey == nil {
		w.byKey = make(map[watchKey]*leaseWatch)
	}
	lw := &leaseWatch{lost: make(chan struct{})}
	w.byKey[k] = lw
	w.active.Add(1)
	lw.timer = t.c.clock.AfterFunc(left, func() { w.end(k.key, k.token) })
	return lw.lost
}

// end closes the watch of a grant whose validity is over.
func (w *watches) end(key string, token uint64) {
	if w.active.Load() == 0 {
		return
	}
	k := watchKey{key: key, token: token}
	w.mu.Lock()
	lw, ok := w.byKey[k]
	if ok {
		delete(w.byKey, k)
		w.active.Add(-1)
	}
	w.mu.Unlock()
	if ok {
		lw.timer.Stop()
		close(lw.lost)
	}
}
