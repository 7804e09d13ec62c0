package client

import (
	"context"
	"errors"
	"time"

	"github.com/lockd/lockd/codec"
)

const (
	// maxAttempts bounds the retries of one call; each needs a session to
	// fail under it, so real calls end at their deadline long before.
	maxAttempts = 16
	// maxPickRounds bounds how often one call waits for a session to
	// become ready.
	maxPickRounds = 1024
	// releaseBackoffMin and releaseBackoffMax space the retries of a
	// release that every session was too full to take, or that a draining
	// or leaderless server refused: such a refusal comes back at once, and
	// retrying at once would spend the release's 5 s in a few
	// milliseconds.
	releaseBackoffMin = 20 * time.Millisecond
	releaseBackoffMax = 500 * time.Millisecond
)

// newRequest returns a pooled request with the single deadline of the
// call: the one the call's duration gives, or the context's if that is
// earlier.
func (c *Client) newRequest(ctx context.Context, kind opKind, owner uint64, key string, now, deadline time.Time) *request {
	// Rebased on now, so that the one deadline of the call is monotonic
	// even when the context's deadline carries only a wall-clock reading.
	if d, ok := ctx.Deadline(); ok {
		if left := d.Sub(now); left < deadline.Sub(now) {
			deadline = now.Add(left)
		}
	}
	req := c.requests.Get().(*request)
	req.kind, req.owner, req.key, req.deadline = kind, owner, key, deadline
	return req
}

// freeRequest pools req again; its timer is stopped already, by the wait
// that armed it.
func (c *Client) freeRequest(req *request) {
	*req = request{done: req.done, handoff: req.handoff, timer: req.timer, heapIndex: notInHeap}
	c.requests.Put(req)
}

// errPoolFull is a pick that found every ready session at its limit.
var errPoolFull = errors.New("every session is at its in-flight limit")

// errDeadline is a pick that reached the call's deadline.
var errDeadline = errors.New("operation deadline reached")

// pick enqueues req on a ready shared session, round-robin, waiting for
// one to become ready if none is. Waiting is the local queue of SPEC §6:
// its end at the deadline is certainly unsent.
func (c *Client) pick(ctx context.Context, req *request, limit int) (*session, error) {
	// A context already done must not reach a writer: once taken, the
	// request could only end by closing a session other calls share.
	if ctx.Err() != nil {
		req.expired = true
		return nil, context.Cause(ctx)
	}
	n := uint64(len(c.slots))
	for range maxPickRounds {
		ready := c.ready.Load()
		full := false
		start := c.next.Add(1)
		// A quiet session's server has left a PING unanswered: it is
		// taken only when no other session is ready.
		var quiet *session
		for i := range n {
			s := c.slots[(start+i)%n].session.Load()
			if s == nil || (req.kind == opAbandon && !s.servesAbandon) {
				continue
			}
			if s.quiet.Load() {
				if quiet == nil {
					quiet = s
				}
				continue
			}
			switch s.enqueue(req, limit) {
			case enqueued:
				return s, nil
			case sessionFull:
				full = true
			}
		}
		if quiet != nil {
			switch quiet.enqueue(req, limit) {
			case enqueued:
				return quiet, nil
			case sessionFull:
				full = true
			}
		}
		if full {
			return nil, errPoolFull
		}
		if _, err := waitLocally(c, ctx, req, ready.ch); err != nil {
			return nil, err
		}
	}
	return nil, ErrNotConnected
}

// pickWait enqueues a waiting acquire alone on a wait session.
func (c *Client) pickWait(ctx context.Context, req *request) (*session, error) {
	if ctx.Err() != nil {
		req.expired = true
		return nil, context.Cause(ctx)
	}
	for range maxPickRounds {
		s, err := c.waits.take(ctx, req)
		if err != nil {
			return nil, err
		}
		if s.enqueue(req, 1) == enqueued {
			return s, nil
		}
		// It closed since the pool handed it out; died accounts for it.
	}
	return nil, ErrNotConnected
}

// waitLocally waits for ch within req's deadline and ctx: a wait in the
// client, before anything is sent, so its end is certainly unsent.
func waitLocally[T any](c *Client, ctx context.Context, req *request, ch <-chan T) (T, error) {
	req.timer.Reset(req.deadline.Sub(c.clock.Now()))
	defer req.timer.Stop()
	var zero T
	select {
	case v := <-ch:
		return v, nil
	case <-req.timer.C():
		req.expired = true
		return zero, errDeadline
	case <-ctx.Done():
		req.expired = true
		return zero, context.Cause(ctx)
	case <-c.stopping:
		return zero, ErrClosed
	}
}

// await waits for req's outcome. The session ends it at its deadline; a
// context that ends first abandons it, or, when it is watched, has ended
// it already, unless it ended before the request entered the session.
func (c *Client) await(ctx context.Context, s *session, req *request) outcome {
	if req.watch != nil {
		if req.watch.ended.Load() {
			return s.abandon(req)
		}
		<-req.done
		return req.out
	}
	if done := ctx.Done(); done != nil {
		select {
		case <-req.done:
			return req.out
		case <-done:
			return s.abandon(req)
		}
	}
	<-req.done
	return req.out
}

// exchange runs req until it has an outcome no retry may change. A
// certainly-unsent attempt moves to another session with the same owner.
// A release (retrySent) is also retried when it may have been lost — a
// repeat cannot turn into a second grant — and, after a backoff, when
// every session was full or a draining or leaderless server refused it.
// pick's error means the last attempt was never enqueued.
func (c *Client) exchange(ctx context.Context, req *request, limit int, retrySent bool) (outcome, error) {
	out := outNone
	backoff := releaseBackoffMin
	waiting := req.kind == opAcquire && !req.immediate
	if !waiting {
		req.watch = c.watchFor(ctx)
	}
	for range maxAttempts {
		var s *session
		var err error
		if waiting {
			s, err = c.pickWait(ctx, req)
		} else {
			s, err = c.pick(ctx, req, limit)
		}
		if retrySent && errors.Is(err, errPoolFull) && c.pause(ctx, req, &backoff) {
			continue
		}
		if err != nil {
			return outNone, err
		}
		out = c.await(ctx, s, req)
		if waiting {
			c.waits.put(s)
		}
		if out == outLost {
			req.mayHaveLeft = true
		}
		refused := out == outRejected && (req.reason == codec.ShuttingDown || req.reason == codec.Unavailable)
		switch {
		case req.expired:
			return out, nil
		case out == outUnsent, retrySent && out == outLost:
		case retrySent && refused:
			if !c.pause(ctx, req, &backoff) {
				return out, nil
			}
		default:
			return out, nil
		}
	}
	if out == outUnsent {
		return outNone, ErrNotConnected
	}
	return out, nil
}

// pause waits out *backoff, doubling it, and reports false when the call's
// deadline or context comes first.
func (c *Client) pause(ctx context.Context, req *request, backoff *time.Duration) bool {
	t := c.clock.NewTimer()
	defer t.Stop()
	t.Reset(*backoff)
	*backoff = min(2**backoff, releaseBackoffMax)
	_, err := waitLocally(c, ctx, req, t.C())
	return err == nil
}
