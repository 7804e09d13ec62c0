package client_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockd/lockd/client"
	"github.com/lockd/lockd/server"
)

type campaignResult struct {
	l   *client.Leadership
	err error
}

func goCampaign(ctx context.Context, c *client.Client, name string, opts client.ElectionOptions) <-chan campaignResult {
	ch := make(chan campaignResult, 1)
	go func() {
		l, err := c.Campaign(ctx, name, opts)
		ch <- campaignResult{l, err}
	}()
	return ch
}

func campaign(t *testing.T, c *client.Client, name string, opts client.ElectionOptions) *client.Leadership {
	t.Helper()
	l, err := c.Campaign(context.Background(), name, opts)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// A candidate that cannot win queues in bounded rounds — each round that
// runs out ends on the client (its session closed, the server's waiter
// dropped) and a new round is queued — and wins with a higher term as
// soon as the leader resigns.
func TestCampaignQueuesInBoundedRoundsAndWinsOnResign(t *testing.T) {
	srv := startRealServer(t, nil)
	first := dialReal(t, srv, nil)
	second := dialReal(t, srv, nil)
	opts := client.ElectionOptions{Lease: 3 * time.Second, Round: time.Second}

	leader := campaign(t, first, "svc/leader", opts)
	next := goCampaign(context.Background(), second, "svc/leader", opts)
	client.Eventually(t, "two rounds of the second candidate run out and are queued again", func() bool {
		return second.Stats().AbandonedSessions >= 2 && srv.waiters() == 1
	})
	if !pending(next) {
		t.Fatal("the second candidate won while the first led")
	}
	if isClosed(leader.Lost()) {
		t.Fatalf("the leader lost its leadership while renewing it: %v", leader.Err())
	}
	if err := leader.Resign(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !isClosed(leader.Lost()) || !errors.Is(leader.Err(), client.ErrResigned) {
		t.Fatalf("after Resign: Lost closed %v, Err %v", isClosed(leader.Lost()), leader.Err())
	}
	r := client.Await(t, next)
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.l.Term() <= leader.Term() {
		t.Fatalf("the new leader's term %d is not above the old one's %d", r.l.Term(), leader.Term())
	}
	if err := r.l.Resign(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := leader.Resign(context.Background()); !errors.Is(err, client.ErrNotHeld) {
		t.Fatalf("a second Resign: %v, want ErrNotHeld", err)
	}
}

// NOT HELD to a renewal — here the leader's term was released by someone
// else — ends the leadership at once.
func TestLeadershipLostWhenTheServerNoLongerHoldsIt(t *testing.T) {
	srv := startRealServer(t, nil)
	c := dialReal(t, srv, nil)
	leader := campaign(t, c, "svc/leader", client.ElectionOptions{Lease: 3 * time.Second})
	if err := c.ReleaseToken(context.Background(), "svc/leader", leader.Term()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-leader.Lost():
	case <-time.After(10 * time.Second):
		t.Fatal("Lost not closed after the leadership was released behind the leader's back")
	}
	if !errors.Is(leader.Err(), client.ErrNotHeld) {
		t.Fatalf("Err %v, want ErrNotHeld", leader.Err())
	}
}

// cuttableDialer dials through the network until cut, then refuses, and
// cut closes the connections it made.
type cuttableDialer struct {
	mu    sync.Mutex
	cut   bool
	conns []net.Conn
}

func (d *cuttableDialer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cut {
		return nil, errors.New("network cut by the test")
	}
	nc, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err == nil {
		d.conns = append(d.conns, nc)
	}
	return nc, err
}

func (d *cuttableDialer) cutOff() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.cut = true
	for _, nc := range d.conns {
		nc.Close()
	}
}

// A leader cut off from the server closes Lost on its own, before the
// lease it last had confirmed could lapse on the server, so that it stops
// acting as the leader before another can be elected.
func TestLeadershipLostBeforeTheLeaseCouldLapse(t *testing.T) {
	srv, err := server.Start(server.Config{Listen: "127.0.0.1:0", DataDir: ""})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	d := &cuttableDialer{}
	c, err := client.Dial(context.Background(), client.Config{Addrs: []string{srv.Addr()}, Dialer: d.dial})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const lease = 3 * time.Second
	leader := campaign(t, c, "svc/leader", client.ElectionOptions{Lease: lease, Grace: 500 * time.Millisecond})
	won := time.Now() // after the grant's send instant, so later than the lease's start
	d.cutOff()
	select {
	case <-leader.Lost():
	case <-time.After(2 * lease):
		t.Fatal("Lost not closed for a leader cut off from the server")
	}
	if lostAfter := time.Since(won); lostAfter >= lease {
		t.Fatalf("Lost closed %v after the win: the %v lease could already have lapsed", lostAfter, lease)
	}
	if err := leader.Err(); err == nil || errors.Is(err, client.ErrNotHeld) || errors.Is(err, client.ErrResigned) {
		t.Fatalf("Err %v, want the renewal that could not be confirmed", err)
	}
}

// A campaign ends with its context, and says so with errors.Is; the
// round it was in leaves no waiter on the server.
func TestCampaignEndsWithItsContext(t *testing.T) {
	srv := startRealServer(t, nil)
	c := dialReal(t, srv, nil)
	leader := campaign(t, c, "svc/leader", client.ElectionOptions{})
	defer leader.Resign(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	_, err := c.Campaign(ctx, "svc/leader", client.ElectionOptions{Round: time.Second})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want context.DeadlineExceeded", err)
	}
	client.Eventually(t, "the last round's waiter is dropped", func() bool { return srv.waiters() == 0 })
}

func TestCampaignRefusesBadInputBeforeSending(t *testing.T) {
	srv := startRealServer(t, nil)
	c := dialReal(t, srv, nil)
	for name, tc := range map[string]struct {
		key  string
		opts client.ElectionOptions
		want error
	}{
		"bad name":              {"two words", client.ElectionOptions{}, client.ErrBadKey},
		"lease below 2 s":       {"n", client.ElectionOptions{Lease: time.Second}, client.ErrUnsupportedDuration},
		"round above 255 s":     {"n", client.ElectionOptions{Round: 256 * time.Second}, client.ErrUnsupportedDuration},
		"grace fills the lease": {"n", client.ElectionOptions{Lease: 3 * time.Second, Grace: 2 * time.Second}, client.ErrInsufficientLease},
	} {
		if _, err := c.Campaign(context.Background(), tc.key, tc.opts); !errors.Is(err, tc.want) {
			t.Errorf("%s: got %v, want %v", name, err, tc.want)
		}
	}
}

// A waiting acquire that its context ended keeps its meaning
// (ErrIndeterminate, ErrWaitElapsed) and also says that the context was
// the cause; one whose own Wait ran out does not claim a context error.
func TestAcquireErrorsNameTheContextThatEndedThem(t *testing.T) {
	srv := startRealServer(t, nil)
	c := dialReal(t, srv, nil)
	if _, err := c.Acquire(context.Background(), "k", client.WaitFor(0)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err := c.Acquire(ctx, "k", client.WaitFor(30*time.Second))
	if !errors.Is(err, client.ErrIndeterminate) || !errors.Is(err, client.ErrWaitElapsed) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("deadline: got %v, want ErrIndeterminate, ErrWaitElapsed and context.DeadlineExceeded", err)
	}

	// The timed-out waiter leaves with its session first, so that the
	// count below is the next waiter's.
	client.Eventually(t, "the timed-out waiter leaves the server", func() bool { return srv.waiters() == 0 })
	cancelled, cancel := context.WithCancel(context.Background())
	waiter := client.GoAcquireCtx(cancelled, c, "k", client.WaitFor(30*time.Second))
	client.Eventually(t, "the server queues the waiter", func() bool { return srv.waiters() == 1 })
	cancel()
	if r := client.Await(t, waiter); !errors.Is(r.Err, client.ErrIndeterminate) || !errors.Is(r.Err, context.Canceled) {
		t.Fatalf("cancel: got %v, want ErrIndeterminate and context.Canceled", r.Err)
	}

	_, err = c.Acquire(context.Background(), "k", client.WaitFor(time.Second))
	if !errors.Is(err, client.ErrWaitElapsed) || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("own wait: got %v, want ErrWaitElapsed without a context error", err)
	}
}

func TestMissingWorkBudgetSaysWhatToPass(t *testing.T) {
	srv := startRealServer(t, nil)
	c := dialReal(t, srv, nil)
	_, err := c.Acquire(context.Background(), "k", client.AcquireOptions{Lease: 10 * time.Second})
	if !errors.Is(err, client.ErrUnsupportedDuration) || !strings.Contains(err.Error(), "client.Budget(d)") || !strings.Contains(err.Error(), "client.Budget(0)") {
		t.Fatalf("got %v, want ErrUnsupportedDuration naming client.Budget(d) and client.Budget(0)", err)
	}
}

func pending[T any](ch <-chan T) bool {
	select {
	case v := <-ch:
		_ = v
		return false
	default:
		return true
	}
}
