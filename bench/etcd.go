package bench

import (
	"context"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
)

// etcdPrefix keeps the benchmark's locks apart from anything else in etcd.
const etcdPrefix = "/lockbench/"

// etcdTarget is etcd's standard lock, concurrency.Mutex: a key per waiter
// under the lock's prefix, bound to the waiter's lease, granted in order of
// creation. Each caller has its own session (lease), as each process of an
// application would; a Mutex is not meant to be shared by two waiters of
// one session.
type etcdTarget struct {
	clients []*clientv3.Client
	ttl     int
}

func openEtcd(ctx context.Context, addr string, opts TargetOptions) (*etcdTarget, error) {
	t := &etcdTarget{ttl: int(max(wholeSeconds(opts.Lease), 1))}
	if opts.Conns == 0 {
		opts.Conns = defaultConns
	}
	for range opts.Conns {
		c, err := clientv3.New(clientv3.Config{
			Endpoints:   []string{addr},
			DialTimeout: answerSlack,
			Logger:      zap.NewNop(),
		})
		if err != nil {
			t.Close()
			return nil, fmt.Errorf("etcd %s: %w", addr, err)
		}
		t.clients = append(t.clients, c)
	}
	// clientv3.New does not wait for the server: ask it something.
	probe, cancel := context.WithTimeout(ctx, answerSlack)
	defer cancel()
	if _, err := t.clients[0].Get(probe, etcdPrefix); err != nil {
		t.Close()
		return nil, fmt.Errorf("etcd %s: %w", addr, err)
	}
	return t, nil
}

func (t *etcdTarget) Kind() string { return SchemeEtcd }

func (t *etcdTarget) Transport() string { return fmt.Sprintf("%d etcd clients", len(t.clients)) }

// Conns counts the clients: each holds one gRPC connection.
func (t *etcdTarget) Conns(context.Context) (int, error) { return len(t.clients), nil }

func (t *etcdTarget) NewCaller(ctx context.Context, id int) (Caller, error) {
	s, err := concurrency.NewSession(t.clients[id%len(t.clients)], concurrency.WithTTL(t.ttl))
	if err != nil {
		return nil, fmt.Errorf("etcd session: %w", err)
	}
	return &etcdCaller{s: s}, nil
}

func (t *etcdTarget) Close() error {
	var errs []error
	for _, c := range t.clients {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}

type etcdCaller struct {
	s *concurrency.Session
	m *concurrency.Mutex
}

func (c *etcdCaller) Acquire(ctx context.Context, key string, wait time.Duration) (Outcome, error) {
	m := concurrency.NewMutex(c.s, etcdPrefix+key)
	if wait <= 0 {
		tryCtx, cancel := context.WithTimeout(ctx, answerSlack)
		defer cancel()
		err := m.TryLock(tryCtx)
		switch {
		case err == nil:
			c.m = m
			return Acquired, nil
		case errors.Is(err, concurrency.ErrLocked):
			return TimedOut, nil
		}
		return Failed, err
	}
	waitCtx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	err := m.Lock(waitCtx)
	switch {
	case err == nil:
		c.m = m
		return Acquired, nil
	case waitCtx.Err() != nil && ctx.Err() == nil:
		// Lock removed its waiter key before it returned.
		return TimedOut, nil
	}
	return Failed, err
}

func (c *etcdCaller) Release(ctx context.Context) (Outcome, error) {
	releaseCtx, cancel := context.WithTimeout(ctx, answerSlack)
	defer cancel()
	err := c.m.Unlock(releaseCtx)
	c.m = nil
	if err != nil {
		return Failed, err
	}
	// A delete of an absent key succeeds too: etcd cannot tell us NotHeld.
	return Released, nil
}

func (c *etcdCaller) Close() error { return c.s.Close() }
