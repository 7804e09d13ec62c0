package client_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/lockd/lockd/client"
	"github.com/lockd/lockd/engine"
	"github.com/lockd/lockd/server"
)

// realServer is the in-process single-mode server with a fake engine
// clock, so that its leases and waits move only when a test says so.
type realServer struct {
	*server.Server
	clock *engine.FakeClock
}

func startRealServer(t testing.TB, auth map[string][]byte) *realServer {
	t.Helper()
	clock := engine.NewFakeClock()
	srv, err := server.Start(server.Config{Listen: "127.0.0.1:0", Auth: auth, Engine: engine.Config{Clock: clock}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return &realServer{Server: srv, clock: clock}
}

// advance moves the server's clock and runs the expiries that fell due.
func (s *realServer) advance(d time.Duration) {
	s.clock.Advance(d)
	s.Engine().Tick()
}

func (s *realServer) waiters() int { return s.Engine().Stats().Waiters }

func dialReal(t *testing.T, srv *realServer, configure func(*client.Config)) *client.Client {
	t.Helper()
	cfg := client.Config{Addrs: []string{srv.Addr()}, Sessions: 2}
	if configure != nil {
		configure(&cfg)
	}
	c, err := client.Dial(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestRealServerAcquireReleaseAndFencingTokens(t *testing.T) {
	srv := startRealServer(t, nil)
	c := dialReal(t, srv, nil)
	ctx := context.Background()
	first, err := c.Acquire(ctx, "k", client.WaitFor(0))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Release(ctx, first); err != nil {
		t.Fatal(err)
	}
	second, err := c.Acquire(ctx, "k", client.WaitFor(0))
	if err != nil {
		t.Fatal(err)
	}
	if second.Token() <= first.Token() {
		t.Fatalf("token %d after %d: fencing tokens must grow", second.Token(), first.Token())
	}
	if err := c.Release(ctx, first); err != client.ErrNotHeld {
		t.Fatalf("release of a superseded token: %v, want client.ErrNotHeld", err)
	}
	if err := c.Release(ctx, second); err != nil {
		t.Fatal(err)
	}
	if err := c.Release(ctx, second); err != client.ErrNotHeld {
		t.Fatalf("second release: %v, want client.ErrNotHeld", err)
	}
}

func TestRealServerImmediateAcquireOfAHeldKeyTimesOut(t *testing.T) {
	srv := startRealServer(t, nil)
	c := dialReal(t, srv, nil)
	if _, err := c.Acquire(context.Background(), "k", client.WaitFor(0)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Acquire(context.Background(), "k", client.WaitFor(0)); err != client.ErrTimeout {
		t.Fatalf("got %v, want client.ErrTimeout", err)
	}
}

func TestRealServerWaiterIsGrantedOnRelease(t *testing.T) {
	srv := startRealServer(t, nil)
	c := dialReal(t, srv, nil)
	holder, err := c.Acquire(context.Background(), "k", client.WaitFor(0))
	if err != nil {
		t.Fatal(err)
	}
	waiter := client.GoAcquire(c, "k", client.WaitFor(10*time.Second))
	client.Eventually(t, "the server queues the waiter", func() bool { return srv.waiters() == 1 })
	if err := c.Release(context.Background(), holder); err != nil {
		t.Fatal(err)
	}
	r := client.Await(t, waiter)
	if r.Err != nil || r.Ticket.Token() != holder.Token()+1 {
		t.Fatalf("waiter: token %d, %v", r.Ticket.Token(), r.Err)
	}
}

func TestRealServerWaitElapsesToTimeout(t *testing.T) {
	srv := startRealServer(t, nil)
	c := dialReal(t, srv, nil)
	if _, err := c.Acquire(context.Background(), "k", client.WaitFor(0)); err != nil {
		t.Fatal(err)
	}
	waiter := client.GoAcquire(c, "k", client.WaitFor(2*time.Second))
	client.Eventually(t, "the server queues the waiter", func() bool { return srv.waiters() == 1 })
	srv.advance(2 * time.Second)
	if r := client.Await(t, waiter); r.Err != client.ErrTimeout {
		t.Fatalf("got %v, want client.ErrTimeout", r.Err)
	}
}

func TestRealServerAbandonedWaiterClosesTheSessionAndIsDropped(t *testing.T) {
	srv := startRealServer(t, nil)
	c := dialReal(t, srv, nil)
	holder, err := c.Acquire(context.Background(), "k", client.WaitFor(0))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	waiter := client.GoAcquireCtx(ctx, c, "k", client.WaitFor(30*time.Second))
	client.Eventually(t, "the server queues the waiter", func() bool { return srv.waiters() == 1 })
	cancel() // gives up after the send, like a deadline
	if r := client.Await(t, waiter); !errors.Is(r.Err, client.ErrIndeterminate) {
		t.Fatalf("got %v, want ErrIndeterminate", r.Err)
	}
	client.Eventually(t, "closing the session drops the server's waiter", func() bool { return srv.waiters() == 0 })
	if err := c.Release(context.Background(), holder); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Acquire(context.Background(), "k", client.WaitFor(0)); err != nil {
		t.Fatalf("the dropped waiter must not have been granted: %v", err)
	}
}

func TestRealServerCompensationReleasesTheGrant(t *testing.T) {
	srv := startRealServer(t, nil)
	c := dialReal(t, srv, nil)
	tight := client.AcquireOptions{Lease: time.Second, MinWorkBudget: client.Budget(time.Second)}
	if _, err := c.Acquire(context.Background(), "k", tight); !errors.Is(err, client.ErrIndeterminate) {
		t.Fatalf("got %v, want client.ErrIndeterminate", err)
	}
	client.Eventually(t, "the compensation is answered", func() bool { return c.Stats().CompensationsDone == 1 })
	if _, err := c.Acquire(context.Background(), "k", client.WaitFor(0)); err != nil {
		t.Fatalf("the compensated grant still holds the key: %v", err)
	}
}

func TestRealServerExpiredLeaseIsNotHeld(t *testing.T) {
	srv := startRealServer(t, nil)
	c := dialReal(t, srv, nil)
	tk, err := c.Acquire(context.Background(), "k", client.AcquireOptions{Lease: time.Second, MinWorkBudget: client.Budget(0)})
	if err != nil {
		t.Fatal(err)
	}
	srv.advance(2 * time.Second)
	if err := c.Release(context.Background(), tk); err != client.ErrNotHeld {
		t.Fatalf("got %v, want client.ErrNotHeld", err)
	}
}

func TestRealServerDrainAnswersWaitersShuttingDown(t *testing.T) {
	srv := startRealServer(t, nil)
	c := dialReal(t, srv, nil)
	if _, err := c.Acquire(context.Background(), "k", client.WaitFor(0)); err != nil {
		t.Fatal(err)
	}
	waiter := client.GoAcquire(c, "k", client.WaitFor(10*time.Second))
	client.Eventually(t, "the server queues the waiter", func() bool { return srv.waiters() == 1 })
	srv.Close()
	if r := client.Await(t, waiter); !errors.Is(r.Err, client.ErrShuttingDown) {
		t.Fatalf("got %v, want client.ErrShuttingDown", r.Err)
	}
}

func TestRealServerMutualAuthentication(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	srv := startRealServer(t, map[string][]byte{"t1": secret, "t2": []byte("other secret")})
	ctx := context.Background()

	c := dialReal(t, srv, func(cfg *client.Config) { cfg.Tenant, cfg.Secret = "t1", secret })
	tk, err := c.Acquire(ctx, "k", client.WaitFor(0))
	if err != nil {
		t.Fatal(err)
	}

	refused := map[string]client.Config{
		"wrong secret":   {Tenant: "t1", Secret: []byte("wrong")},
		"unknown tenant": {Tenant: "t3", Secret: secret},
		"no secret":      {},
	}
	for name, cfg := range refused {
		cfg.Addrs = []string{srv.Addr()}
		if _, err := client.Dial(ctx, cfg); !errors.Is(err, client.ErrAuth) {
			t.Errorf("%s: got %v, want client.ErrAuth", name, err)
		}
	}

	other := dialReal(t, srv, func(cfg *client.Config) { cfg.Tenant, cfg.Secret = "t2", []byte("other secret") })
	if err := other.Release(ctx, tk); err != client.ErrNotHeld {
		t.Fatalf("another tenant released the lock: %v", err)
	}
	if _, err := other.Acquire(ctx, "k", client.WaitFor(0)); err != nil {
		t.Fatalf("tenants share a namespace: %v", err)
	}
}

func TestRealServerRefusesASecretTheServerCannotCheck(t *testing.T) {
	srv := startRealServer(t, nil)
	_, err := client.Dial(context.Background(), client.Config{Addrs: []string{srv.Addr()}, Tenant: "t1", Secret: []byte("s")})
	if !errors.Is(err, client.ErrAuth) {
		t.Fatalf("got %v, want client.ErrAuth", err)
	}
}

// TestRealServerThroughput runs 256 concurrent callers, each acquiring
// with a wait and so each on a wait session, and reports acquire+release
// pairs per second.
func TestRealServerThroughput(t *testing.T) {
	srv := startRealServer(t, nil)
	c := dialReal(t, srv, func(cfg *client.Config) { cfg.WaitSessions = 256 })
	const callers, rounds = 256, 40
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for i := range callers {
		wg.Go(func() {
			key := fmt.Sprintf("tp-%d", i)
			for range rounds {
				tk, err := c.Acquire(context.Background(), key, client.WaitFor(10*time.Second))
				if err == nil {
					err = c.Release(context.Background(), tk)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	elapsed := time.Since(start)
	t.Logf("%d callers on wait sessions: %d acquire+release pairs in %v = %.0f pairs/s",
		callers, callers*rounds, elapsed, float64(callers*rounds)/elapsed.Seconds())
}

// Renew against the real server: the lock outlives its granted lease with
// the same token, a waiter gets it only after the renewed lease, and a
// Renew of a lock that passed on is ErrNotHeld.
func TestRealServerRenew(t *testing.T) {
	srv := startRealServer(t, nil)
	c := dialReal(t, srv, nil)
	ctx := context.Background()
	tk, err := c.Acquire(ctx, "renew", client.AcquireOptions{Lease: 10 * time.Second, MinWorkBudget: client.Budget(0)})
	if err != nil {
		t.Fatal(err)
	}
	token := tk.Token()
	srv.advance(8 * time.Second)
	if err := tk.Renew(ctx, 10*time.Second); err != nil || tk.Token() != token {
		t.Fatalf("renew: %v, token %d (was %d)", err, tk.Token(), token)
	}
	srv.advance(8 * time.Second) // 16 s: past the granted lease
	if _, err := c.Acquire(ctx, "renew", client.WaitFor(0)); !errors.Is(err, client.ErrTimeout) {
		t.Fatalf("acquire of the renewed lock: %v, want ErrTimeout", err)
	}
	srv.advance(2 * time.Second) // 18 s: the renewed lease ends
	next, err := c.Acquire(ctx, "renew", client.WaitFor(0))
	if err != nil || next.Token() <= token {
		t.Fatalf("acquire after the renewed lease: %v, token %d", err, next.Token())
	}
	if err := tk.Renew(ctx, 10*time.Second); !errors.Is(err, client.ErrNotHeld) {
		t.Fatalf("renew of a lock that passed on: %v, want ErrNotHeld", err)
	}
	if pending := tk.Lost(); !isClosed(pending) {
		t.Fatal("Lost not closed after NOT HELD")
	}
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// A waiting acquire whose grant is lost on the wire runs out
// (ErrIndeterminate and ErrWaitElapsed); the client abandons it on
// another connection, the server releases the grant it made, and the
// key's next waiter is granted at once, not after the lost grant's 30 s
// lease (the server's clock never moves here). A tombstone is left to
// refuse the abandoned acquire should it come again.
func TestRealServerWaitThatRunsOutIsAbandonedAndTheNextWaiterIsNotHeldUp(t *testing.T) {
	srv := startRealServer(t, nil)
	dial, stall := client.NewStallingDialer()
	c := dialReal(t, srv, func(cfg *client.Config) {
		cfg.WaitSpares = 1 // connections 0 and 1 are shared, 2 the spare
		cfg.Dialer = dial
		cfg.SilenceTimeout = time.Minute // the wait, not the silence, ends it
	})
	ctx := context.Background()
	holder, err := c.Acquire(ctx, "k", client.WaitFor(0))
	if err != nil {
		t.Fatal(err)
	}
	client.Eventually(t, "the spare is connected", func() bool { return c.Stats().WaitSessionsIdle == 1 })
	runaway := client.GoAcquire(c, "k", client.WaitFor(2*time.Second))
	client.Eventually(t, "the server queues the waiter", func() bool { return srv.waiters() == 1 })
	stall(2) // its ACQUIRED will be lost
	next := client.GoAcquire(c, "k", client.WaitFor(10*time.Second))
	client.Eventually(t, "the server queues the next waiter", func() bool { return srv.waiters() == 2 })
	if err := c.Release(ctx, holder); err != nil {
		t.Fatal(err)
	}

	r := client.Await(t, runaway)
	if !errors.Is(r.Err, client.ErrIndeterminate) || !errors.Is(r.Err, client.ErrWaitElapsed) {
		t.Fatalf("the wait whose grant was lost: %v, want ErrIndeterminate and ErrWaitElapsed", r.Err)
	}
	n := client.Await(t, next)
	if n.Err != nil || n.Ticket.Token() != holder.Token()+2 {
		t.Fatalf("the next waiter: token %d, %v; want %d, after the lost grant", n.Ticket.Token(), n.Err, holder.Token()+2)
	}
	client.Eventually(t, "the abandon is counted", func() bool { return c.Stats().AbandonsReleased == 1 })
	if st := srv.Engine().Stats(); st.AbandonsReleased != 1 || st.Tombstones != 1 {
		t.Fatalf("server: %d grants abandoned, %d tombstones; want 1 and 1", st.AbandonsReleased, st.Tombstones)
	}
}
