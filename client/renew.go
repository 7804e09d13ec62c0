package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/lockd/lockd/codec"
)

// Renew extends the lease of the lock t holds to lease from now: it sends
// KEEP with t's token (SPEC §6). lease is rounded up to whole seconds and
// must be 1..3600 s; it may be shorter than the lease in force. The call
// has IODeadline, reconnects and retries included; ctx can end it earlier.
//
// nil means the server renewed the lock: t's token is unchanged and its
// validity moves to the send instant of the answered KEEP plus lease,
// minus the drift margin. ErrNotHeld means the lock is gone (the lease had
// expired, or the token is no longer current): t's validity ends and Lost
// fires. Any other error — ErrIndeterminate above all, when no answer came
// in time — leaves t's validity as it was: the lease may or may not have
// been extended, and the client never assumes it was.
//
// Renew changes t; calls on one Ticket must not overlap, and t must not be
// read by other goroutines meanwhile (copies and Lost may be).
func (t *Ticket) Renew(ctx context.Context, lease time.Duration) error {
	err := t.renew(ctx, lease)
	if t.c == nil {
		return err
	}
	return t.c.withContextEnd(ctx, err)
}

func (t *Ticket) renew(ctx context.Context, lease time.Duration) error {
	c := t.c
	if c == nil {
		return fmt.Errorf("%w: the zero Ticket holds no lock", ErrNotHeld)
	}
	now := c.clock.Now()
	seconds, err := wholeSeconds("Lease", lease, 1, codec.MaxLeaseSeconds)
	if err != nil {
		return err
	}
	if c.closing.Load() {
		return ErrClosed
	}
	owner, err := c.nextOwner()
	if err != nil {
		return err
	}
	req := c.newRequest(ctx, opKeep, owner, t.key, now, now.Add(IODeadline))
	defer c.freeRequest(req)
	req.token, req.lease = t.token, uint16(seconds)

	// Retried like a release, even after a byte may have left: a repeat
	// with the same lease renews the same token again, later, so the lease
	// it leaves on the server ends no sooner than the validity computed
	// from the answered attempt's send instant.
	out, err := c.exchange(ctx, req, c.cfg.MaxInFlight+c.releaseReserve, true)
	if err != nil {
		return tokenCallFailure("renewal", t.key, t.token, req, out, err)
	}
	switch out {
	case outAcquired:
		span := time.Duration(seconds) * time.Second
		t.lease = span
		t.validUntil = req.sentAt.Add(span - driftMargin(span))
		c.watches.renew(t.key, t.token, t.validUntil, c.clock.Now())
		return nil
	case outNotHeld:
		t.validUntil = time.Time{}
		c.watches.end(t.key, t.token)
		return fmt.Errorf("%w: renewal of %q token %d", ErrNotHeld, t.key, t.token)
	}
	return tokenCallFailure("renewal", t.key, t.token, req, out, nil)
}

// KeepAlive renews t with its lease (that of the grant or of the latest
// Renew) every interval until ctx ends, and then returns nil. It returns
// early when the lock is lost: at once when a renewal is answered NOT
// HELD (ErrNotHeld), or when t's validity runs out before a renewal was
// confirmed, with the first failed renewal's error. A renewal that fails
// otherwise (no answer, E unavailable) is tried again at the next tick
// while validity remains. interval must be positive and should be well
// under the lease — a third of it leaves two more tries; each renewal
// waits at most IODeadline.
//
// KeepAlive changes t like Renew, so other goroutines must not read t
// while it runs; they watch Lost (of any copy), which follows every
// confirmed renewal.
func (t *Ticket) KeepAlive(ctx context.Context, interval time.Duration) error {
	if interval <= 0 {
		return fmt.Errorf("%w: keep-alive interval %v", ErrUnsupportedDuration, interval)
	}
	if t.c == nil {
		return fmt.Errorf("%w: the zero Ticket holds no lock", ErrNotHeld)
	}
	tick := t.c.clock.NewTimer()
	defer tick.Stop()
	var failed error // the first renewal that failed since the last confirmed one
	for {
		wait := interval
		if failed != nil {
			wait = min(interval, t.Remaining())
		}
		tick.Reset(wait)
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C():
		}
		if failed != nil && t.Remaining() == 0 {
			return fmt.Errorf("the lease of %q lapsed without a confirmed renewal: %w", t.key, failed)
		}
		err := t.Renew(ctx, t.lease)
		switch {
		case err == nil:
			failed = nil
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, ErrNotHeld):
			return err
		case failed == nil:
			failed = err
		}
	}
}
