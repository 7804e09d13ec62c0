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
// Renew updates the Ticket it is called on. Copies made before keep the
// validity they had: an earlier bound after a renewal that extended the
// lease, but a too late one after a renewal that shortened it. Lost
// follows the latest renewal for every copy once any copy has asked for
// it, so watch Lost where other copies renew.
type Ticket struct {
	c          *Client
	key        string
	token      uint64
	lease      time.Duration // of the grant or the latest confirmed renewal
	validUntil time.Time
}

// Key is the locked key.
func (t Ticket) Key() string { return t.key }

// Token is the fencing token: never 0, strictly increasing per key.
func (t Ticket) Token() uint64 { return t.token }

// ValidUntil is the instant until which the lock is surely held: the send
// instant of the ACQUIRE, plus the server's reported wait, plus the lease,
// minus a drift margin; after a confirmed Renew, the send instant of its
// KEEP plus its lease, minus the margin. After a Renew answered NOT HELD it
// is the zero Time. It carries the monotonic clock reading, so wall
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
// at ValidUntil — moved by each confirmed Renew of any copy —, or earlier
// when a release or renewal through this client is answered NOT HELD, or a
// release RELEASED. Every copy of the Ticket returns the same channel. The
// watch costs a timer and is only set up by the first call. A closed
// channel stays closed: a renewal confirmed after the validity ran out
// gives the Ticket new validity, and Lost a new channel.
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
	until time.Time // the validity it closes at; moved by renew
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
	lw := &leaseWatch{lost: make(chan struct{}), until: t.validUntil}
	w.byKey[k] = lw
	w.active.Add(1)
	clk := t.c.clock
	lw.timer = clk.AfterFunc(left, func() { w.lapse(k, lw, clk) })
	return lw.lost
}

// lapse is a watch's timer: it ends the watch unless a renewal moved its
// validity after the timer fired.
func (w *watches) lapse(k watchKey, lw *leaseWatch, clk clock) {
	w.mu.Lock()
	if w.byKey[k] != lw || clk.Now().Before(lw.until) {
		w.mu.Unlock()
		return
	}
	delete(w.byKey, k)
	w.active.Add(-1)
	w.mu.Unlock()
	close(lw.lost)
}

// renew moves the watch of a grant, if any, to a new validity.
func (w *watches) renew(key string, token uint64, until, now time.Time) {
	if w.active.Load() == 0 {
		return
	}
	k := watchKey{key: key, token: token}
	w.mu.Lock()
	defer w.mu.Unlock()
	if lw, ok := w.byKey[k]; ok {
		lw.until = until
		lw.timer.Reset(until.Sub(now))
	}
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
