package bench

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/lockd/lockd/client"
)

// lockdTarget drives lockd through the official client, as applications do.
type lockdTarget struct {
	c         *client.Client
	lease     time.Duration
	transport string
}

func openLockd(ctx context.Context, addr string, opts TargetOptions) (*lockdTarget, error) {
	c, err := client.Dial(ctx, client.Config{
		Addrs:    []string{addr},
		Sessions: opts.Conns,
		// Every session may have to carry all outstanding requests, so
		// that a refusal is always the server's, never the pool's.
		MaxInFlight: max(opts.MaxInFlight, 1024),
		Tenant:      opts.Tenant,
		Secret:      opts.Secret,
		TLS:         opts.TLS,
	})
	if err != nil {
		return nil, err
	}
	transport := "official client, its default Sessions"
	if opts.Conns > 0 {
		transport = fmt.Sprintf("official client, Sessions %d", opts.Conns)
	}
	if opts.TLS != nil {
		transport += ", TLS"
	}
	return &lockdTarget{c: c, lease: opts.Lease, transport: transport}, nil
}

func (t *lockdTarget) Kind() string { return SchemeLockd }

func (t *lockdTarget) Transport() string { return t.transport }

func (t *lockdTarget) Conns(context.Context) (int, error) { return t.c.Stats().Sessions, nil }

// Reconnects is the client's count of sessions dialled after Dial.
func (t *lockdTarget) Reconnects() uint64 { return t.c.Stats().Reconnects }

func (t *lockdTarget) NewCaller(context.Context, int) (Caller, error) {
	return &lockdCaller{t: t}, nil
}

func (t *lockdTarget) Close() error { return t.c.Close() }

type lockdCaller struct {
	t      *lockdTarget
	ticket client.Ticket
}

func (c *lockdCaller) Acquire(ctx context.Context, key string, wait time.Duration) (Outcome, error) {
	ticket, err := c.t.c.Acquire(ctx, key, client.AcquireOptions{
		Lease: c.t.lease,
		Wait:  wait,
		// The benchmark's critical section is empty.
		MinWorkBudget: client.Budget(0),
	})
	if err == nil {
		c.ticket = ticket
	}
	return acquireOutcome(err)
}

// acquireOutcome classifies the client's answer to Acquire.
func acquireOutcome(err error) (Outcome, error) {
	switch {
	case err == nil:
		return Acquired, nil
	case errors.Is(err, client.ErrTimeout):
		return TimedOut, nil
	case errors.Is(err, client.ErrBusy):
		return Busy, nil
	case errors.Is(err, client.ErrWaitElapsed):
		return WaitElapsed, err
	case errors.Is(err, client.ErrIndeterminate):
		return Indeterminate, err
	}
	return Failed, err
}

func (c *lockdCaller) Release(ctx context.Context) (Outcome, error) {
	err := c.t.c.Release(ctx, c.ticket)
	c.ticket = client.Ticket{}
	return releaseOutcome(err)
}

// releaseOutcome classifies the client's answer to Release.
func releaseOutcome(err error) (Outcome, error) {
	switch {
	case err == nil:
		return Released, nil
	case errors.Is(err, client.ErrNotHeld):
		return NotHeld, nil
	case errors.Is(err, client.ErrIndeterminate):
		return Indeterminate, err
	}
	return Failed, err
}

// Renew extends the lease of the held lock by the target's lease.
func (c *lockdCaller) Renew(ctx context.Context) (Outcome, error) {
	switch err := c.ticket.Renew(ctx, c.t.lease); {
	case err == nil:
		return Acquired, nil
	case errors.Is(err, client.ErrNotHeld):
		return NotHeld, err
	case errors.Is(err, client.ErrIndeterminate):
		return Indeterminate, err
	default:
		return Failed, err
	}
}

func (c *lockdCaller) Close() error { return nil }
