package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/lockd/lockd/codec"
)

// driftFloor and driftRatio make the drift margin subtracted from a
// Ticket's validity: clocks of client and server may run at slightly
// different rates, and the client must never believe in a lease the
// server has already expired. 1 ms per second (1000 ppm) is far above the
// drift of real oscillators.
const (
	driftFloor = 100 * time.Millisecond
	driftRatio = 1000
)

func driftMargin(span time.Duration) time.Duration { return driftFloor + span/driftRatio }

// Acquire takes the lock on key and returns its Ticket.
//
// opts.Wait bounds the whole call: waiting for a ready session, retries of
// attempts that certainly never left, the send and the answer. ctx can end
// it earlier; its deadline then is the call's deadline. The lock is held
// exactly when the error is nil. ErrIndeterminate means the server may
// have granted it unseen; the client then gives back whatever the server
// did — a compensating release of a known token, or an ABANDON of the
// request where its session was closed — or, when it cannot, leaves it
// to its lease, held by nobody; the error says which. Every error says
// whether the lock may be held; when ctx ended the call, the error also
// matches ctx.Err() (context.DeadlineExceeded or context.Canceled) with
// errors.Is.
func (c *Client) Acquire(ctx context.Context, key string, opts AcquireOptions) (Ticket, error) {
	t, err := c.acquire(ctx, key, opts)
	return t, c.withContextEnd(ctx, err)
}

func (c *Client) acquire(ctx context.Context, key string, opts AcquireOptions) (Ticket, error) {
	now := c.clock.Now()
	if !codec.ValidClientKey(key) {
		return Ticket{}, fmt.Errorf("%w: %q", ErrBadKey, key)
	}
	p, err := opts.normalize()
	if err != nil {
		return Ticket{}, err
	}
	if c.closing.Load() {
		return Ticket{}, ErrClosed
	}
	owner, err := c.nextOwner()
	if err != nil {
		return Ticket{}, err
	}
	bound := time.Duration(p.waitSeconds) * time.Second
	if p.waitSeconds == 0 {
		bound = IODeadline
	}
	req := c.newRequest(ctx, opAcquire, owner, key, now, now.Add(bound))
	defer c.freeRequest(req)
	req.lease = p.leaseSeconds
	req.immediate = p.waitSeconds == 0

	out, err := c.exchange(ctx, req, c.cfg.MaxInFlight, false)
	if err != nil {
		return Ticket{}, unsentAcquireError(err)
	}
	switch out {
	case outAcquired:
		return c.gate(ctx, req, p)
	case outTimedOut:
		return Ticket{}, ErrTimeout
	case outBusy:
		return Ticket{}, ErrBusy
	case outRejected:
		return Ticket{}, reasonError(req.reason)
	case outUnsent, outExpired:
		return Ticket{}, notSentError(ctx)
	}
	// Lost: the request may have left and its session is closed.
	fate := c.giveBack(req)
	if c.waitElapsed(ctx, req) {
		return Ticket{}, fmt.Errorf("%w: %w: acquire of %q got no answer within its wait, so this call does not hold the lock; %s",
			ErrIndeterminate, ErrWaitElapsed, key, fate)
	}
	return Ticket{}, fmt.Errorf("%w: acquire of %q may have reached the server: %w; %s", ErrIndeterminate, key, req.cause, fate)
}

// waitElapsed reports whether a waiting acquire ended because its
// deadline — the wait's, or an earlier one of ctx — passed, rather than
// because ctx was cancelled or the session failed.
func (c *Client) waitElapsed(ctx context.Context, req *request) bool {
	if req.immediate {
		return false
	}
	return !c.clock.Now().Before(req.deadline) || errors.Is(ctx.Err(), context.DeadlineExceeded)
}

// unsentAcquireError maps why an acquire was never enqueued.
func unsentAcquireError(err error) error {
	switch {
	case errors.Is(err, ErrClosed), errors.Is(err, ErrNotConnected):
		return err
	case errors.Is(err, errPoolFull):
		return fmt.Errorf("%w: %w", ErrBusy, err)
	}
	return fmt.Errorf("%w: no session took the request before the deadline: %w", ErrTimeout, err)
}

// notSentError is the end of an acquire whose deadline or context came
// before a byte of it left.
func notSentError(ctx context.Context) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%w: not sent: %w", ErrTimeout, context.Cause(ctx))
	}
	return fmt.Errorf("%w: the deadline came before the request was sent", ErrTimeout)
}

// gate is the Ticket delivery gate (SPEC §6). A grant found after the
// call's deadline, or with less validity left than the work budget, is not
// handed out: its exact token is released as compensation, the session
// stays open, and the caller learns ErrIndeterminate.
func (c *Client) gate(ctx context.Context, req *request, p acquireParams) (Ticket, error) {
	now := c.clock.Now()
	span := time.Duration(req.waitedMs)*time.Millisecond + p.lease()
	validUntil := req.sentAt.Add(span - driftMargin(span))
	if !now.Before(req.deadline) || ctx.Err() != nil {
		fate := c.compensateRelease(req.key, req.granted, now)
		err := fmt.Errorf("%w: %q was granted (token %d) but the call had ended; %s",
			ErrIndeterminate, req.key, req.granted, fate)
		if c.waitElapsed(ctx, req) {
			err = fmt.Errorf("%w: %w", ErrWaitElapsed, err)
		}
		return Ticket{}, err
	}
	if left := validUntil.Sub(now); left < p.budget {
		fate := c.compensateRelease(req.key, req.granted, now)
		return Ticket{}, fmt.Errorf("%w: %q was granted (token %d) with %v of validity left, below the work budget %v; %s",
			ErrIndeterminate, req.key, req.granted, left, p.budget, fate)
	}
	return Ticket{c: c, key: req.key, token: req.granted, lease: p.lease(), validUntil: validUntil}, nil
}

// Release releases the lock t holds. It has IODeadline from the call,
// reconnects and retries included; ctx can end it earlier. nil means
// RELEASED; ErrNotHeld means the lock was already gone or passed on;
// ErrIndeterminate means no answer came, and the lock may still be held
// until its lease expires.
func (c *Client) Release(ctx context.Context, t Ticket) error {
	return c.ReleaseToken(ctx, t.key, t.token)
}

// ReleaseToken is Release for a lock known by key and token only, such as
// one acquired by another process.
func (c *Client) ReleaseToken(ctx context.Context, key string, token uint64) error {
	return c.withContextEnd(ctx, c.releaseToken(ctx, key, token))
}

func (c *Client) releaseToken(ctx context.Context, key string, token uint64) error {
	now := c.clock.Now()
	if !codec.ValidClientKey(key) {
		return fmt.Errorf("%w: %q", ErrBadKey, key)
	}
	if token == 0 {
		return fmt.Errorf("%w: token 0 is never issued", ErrNotHeld)
	}
	if c.closing.Load() {
		return ErrClosed
	}
	return c.release(ctx, key, token, now, now.Add(IODeadline))
}

// release sends RELEASE until it is answered or deadline passes. Unlike an
// acquire it may be repeated after a byte may have left: a repeat can at
// worst turn RELEASED into NOT HELD, never free another holder's lock,
// because the token names the grant.
func (c *Client) release(ctx context.Context, key string, token uint64, now, deadline time.Time) error {
	owner, err := c.nextOwner()
	if err != nil {
		return err
	}
	req := c.newRequest(ctx, opRelease, owner, key, now, deadline)
	defer c.freeRequest(req)
	req.token = token

	out, err := c.exchange(ctx, req, c.cfg.MaxInFlight+c.releaseReserve, true)
	if err != nil {
		return tokenCallFailure("release", key, token, req, out, err)
	}
	switch out {
	case outReleased:
		c.watches.end(key, token)
		return nil
	case outNotHeld:
		c.watches.end(key, token)
		return ErrNotHeld
	}
	return tokenCallFailure("release", key, token, req, out, nil)
}

// tokenCallFailure is the error of a release or a renewal (op) of key's
// token that exchange ended with err, or, when err is nil, with an
// outcome other than the answers the call handles itself. Both are
// retried after a byte may have left, so the same rules decide what the
// caller can rely on.
func tokenCallFailure(op, key string, token uint64, req *request, out outcome, err error) error {
	if err != nil {
		if !req.mayHaveLeft && (errors.Is(err, ErrClosed) || errors.Is(err, ErrNotConnected)) {
			return fmt.Errorf("%s of %q token %d: %w", op, key, token, err)
		}
		// %v: the cause's promise that nothing was sent no longer holds.
		return fmt.Errorf("%w: %s of %q token %d: %v", ErrIndeterminate, op, key, token, err)
	}
	switch out {
	case outRejected:
		// A refusal means the call did not happen — unless an earlier
		// attempt may have got through, or the server could not say
		// (unavailable: its proposal may still apply).
		if req.mayHaveLeft || req.reason == codec.Unavailable {
			return fmt.Errorf("%w: %s of %q token %d: last answer %v", ErrIndeterminate, op, key, token, reasonError(req.reason))
		}
		return fmt.Errorf("%s of %q token %d: %w", op, key, token, reasonError(req.reason))
	case outUnsent, outExpired:
		return fmt.Errorf("%w: %s of %q token %d: the deadline came before it was sent", ErrIndeterminate, op, key, token)
	}
	return fmt.Errorf("%w: %s of %q token %d got no answer: %w", ErrIndeterminate, op, key, token, req.cause)
}

// Close stops the client. Queued compensating releases are sent first,
// each still bounded by its own IODeadline, so Close returns within about
// IODeadline. Calls in flight end with ErrClosed, or ErrIndeterminate when
// their request may have left.
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		c.closing.Store(true)
		c.compMu.Lock()
		c.compClosed = true
		close(c.compQueue)
		c.compMu.Unlock()
		c.compWG.Wait()
		close(c.stopping)
		c.stop()
		c.wg.Wait()
		c.stopWatch()
	})
	return nil
}

// Stats returns the client's counters.
func (c *Client) Stats() Stats {
	st := Stats{
		Reconnects:           c.stats.reconnects.Load(),
		ProtocolErrors:       c.stats.protocolErrors.Load(),
		CompensationsQueued:  c.stats.compensationsQueued.Load(),
		CompensationsDone:    c.stats.compensationsDone.Load(),
		CompensationsFailed:  c.stats.compensationsFailed.Load(),
		CompensationsDropped: c.stats.dropped.Load(),
		SilentSessions:       c.stats.silentSessions.Load(),
		AbandonsSent:         c.stats.abandonsSent.Load(),
		AbandonsReleased:     c.stats.abandonsReleased.Load(),
		AbandonsNotHeld:      c.stats.abandonsNotHeld.Load(),
		AbandonsGivenUp:      c.stats.abandonsGivenUp.Load(),
	}
	for i := range c.slots {
		if s := c.slots[i].session.Load(); s != nil && s.alive() {
			st.Sessions++
		}
	}
	st.WaitSessions, st.WaitSessionsIdle = c.waits.counts()
	st.AbandonedSessions = c.stats.abandoned.Load()
	return st
}
