package client

import (
	"context"
	"sync/atomic"
)

// contextWatch ends, when one context ends, every call on a shared session
// that waits under it, so that those calls wait for their answer alone
// instead of in a select over the answer and the context. Many callers
// commonly share one context — a service's base context, a load
// generator's run — and a select on its Done channel locks that one
// channel twice per call from every caller at once.
//
// A client watches one context at a time: one that watchAfter calls in a
// row came with, once the context it watched before has ended; calls
// under any other context select as before. Installing a watch costs a few
// allocations, once per watched context; the run of calls keeps a context
// of one request — an acquire, a release and perhaps a renewal under it —
// from being watched, and allocating, request after request.
type contextWatch struct {
	done  <-chan struct{}
	ended atomic.Bool
	stop  func() bool
}

// watchAfter is the run of calls under one context that has it watched.
const watchAfter = 8

// watchFor returns the watch of ctx, installing one if ctx qualifies, or
// nil when the call is to select on ctx.Done itself.
func (c *Client) watchFor(ctx context.Context) *contextWatch {
	done := ctx.Done()
	if done == nil {
		return nil
	}
	w := c.watch.Load()
	if w != nil && w.done == done {
		return w
	}
	if w != nil && !w.ended.Load() {
		return nil
	}
	if last, _ := c.unwatched.Swap(done).(<-chan struct{}); last != done {
		c.unwatchedRun.Store(1)
		return nil
	}
	if c.unwatchedRun.Add(1) < watchAfter {
		return nil
	}
	fresh := &contextWatch{done: done}
	fresh.stop = context.AfterFunc(ctx, func() { c.contextEnded(fresh) })
	if !c.watch.CompareAndSwap(w, fresh) {
		fresh.stop()
		return nil
	}
	return fresh
}

// contextEnded ends every call waiting under w on a shared session. A call
// that enters a session after this has passed it finds w ended in await.
func (c *Client) contextEnded(w *contextWatch) {
	w.ended.Store(true)
	for i := range c.slots {
		if s := c.slots[i].session.Load(); s != nil {
			s.endWatched(w)
		}
	}
}

// stopWatch releases the watched context, for Close.
func (c *Client) stopWatch() {
	if w := c.watch.Load(); w != nil {
		w.stop()
	}
}

// endWatched ends the requests under w as abandon would for each: one
// still queued is withdrawn, certainly unsent; if one may have left, the
// session is closed and those ends lost, the others with it.
func (s *session) endWatched(w *contextWatch) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	kept := s.queue[:0]
	for _, req := range s.queue {
		if req.watch != w {
			kept = append(kept, req)
			continue
		}
		req.expired = true
		s.table.remove(req.owner)
		s.deadlines.remove(req)
		s.resolve(req, outExpired, nil)
	}
	clear(s.queue[len(kept):])
	s.queue = kept
	sent := false
	for i := range s.table.slots {
		if req := s.table.slots[i].req; req != nil && req.watch == w && req.state == stateSent {
			req.expired = true
			sent = true
		}
	}
	closing := sent && s.markClosed()
	s.mu.Unlock()
	if closing {
		s.shutdown(errAbandoned)
	}
}
