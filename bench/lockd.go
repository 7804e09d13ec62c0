package bench

import (
	"context"
	"errors"
	"time"

	"github.com/lockd/lockd/client"
)

// lockdTarget drives lockd through the official client, as applications do.
type lockdTarget struct {
	c     *client.Client
	lease time.Duration
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
	})
	if err != nil {
		return nil, err
	}
	return &lockdTarget{c: c, lease: opts.Lease}, nil
}

func (t *lockdTarget) Kind() string { return SchemeLockd }

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
	switch {
	case err == nil:
		c.ticket = ticket
		return Acquired, nil
	case errors.Is(err, client.ErrTimeout):
		return TimedOut, nil
	case errors.Is(err, client.ErrBusy):
		return Busy, nil
	}
	return Failed, err
}

func (c *lockdCaller) Release(ctx context.Context) (Outcome, error) {
	err := c.t.c.Release(ctx, c.ticket)
	c.ticket = client.Ticket{}
	switch {
	case err == nil:
		return Released, nil
	case errors.Is(err, client.ErrNotHeld):
		return NotHeld, nil
	}
	return Failed, err
}

func (c *lockdCaller) Close() error { return nil }
