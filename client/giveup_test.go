package client

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/lockd/lockd/client/lockdtest"
)

// readWatch reports, once armed, when the client's reader has read some
// bytes and come back for more: it has handled what it read.
type readWatch struct {
	net.Conn
	mu       sync.Mutex
	armed    bool
	gotData  bool
	cameBack chan struct{}
	closed   chan struct{}
	once     sync.Once
}

func (w *readWatch) Read(b []byte) (int, error) {
	w.mu.Lock()
	if w.gotData {
		w.gotData = false
		close(w.cameBack)
	}
	w.mu.Unlock()
	n, err := w.Conn.Read(b)
	w.mu.Lock()
	if w.armed && n > 0 {
		w.armed, w.gotData = false, true
	}
	w.mu.Unlock()
	return n, err
}

func (w *readWatch) Close() error {
	w.once.Do(func() { close(w.closed) })
	return w.Conn.Close()
}

func (w *readWatch) arm() {
	w.mu.Lock()
	w.armed = true
	w.mu.Unlock()
}

// A caller that gives up on a request it has sent closes the session
// (SPEC §6). An answer that arrives while it does must not find the
// session open without that request: that would be taken for a protocol
// error, closing the session for the wrong reason and giving every other
// caller on it a protocol error as the cause of its lost call. The answer
// is made to arrive exactly as the session starts shutting down.
func TestGiveUpClosesSessionBeforeALateAnswer(t *testing.T) {
	clk := newFakeClock()
	type arrival struct {
		conn *lockdtest.Conn
		f    frame
	}
	arrivals := make(chan arrival, 4)
	p := startPeer(t, func(p *peer, c *lockdtest.Conn, f frame) { arrivals <- arrival{c, f} })
	var watch *readWatch
	c := newClient(t, p, clk, func(cfg *Config) {
		cfg.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			watch = &readWatch{Conn: conn, cameBack: make(chan struct{}), closed: make(chan struct{})}
			return watch, nil
		}
	})
	immediate := AcquireOptions{MinWorkBudget: Budget(0)}
	other := goAcquire(c, "other", immediate)
	await(t, arrivals)
	ctx, cancel := context.WithCancel(context.Background())
	givenUp := goAcquireCtx(ctx, c, "given-up", immediate)
	late := await(t, arrivals)

	var answered atomic.Bool
	hook := func() {
		if !answered.CompareAndSwap(false, true) {
			return
		}
		watch.arm()
		if err := late.conn.Acquired(late.f.owner, 7, 0); err != nil {
			t.Error(err)
		}
		select {
		case <-watch.cameBack:
		case <-watch.closed:
		}
	}
	onlySession(c).testHookShutdown.Store(&hook)
	cancel()

	if r := await(t, givenUp); !errors.Is(r.Err, ErrIndeterminate) {
		t.Fatalf("given-up acquire: %v, want ErrIndeterminate", r.Err)
	}
	r := await(t, other)
	if !errors.Is(r.Err, ErrIndeterminate) || !errors.Is(r.Err, errAbandoned) || errors.Is(r.Err, ErrProtocol) {
		t.Fatalf("the other caller's acquire: %v, want ErrIndeterminate caused by the abandoned session", r.Err)
	}
	if !answered.Load() {
		t.Fatal("the session never shut down")
	}
	st := c.Stats()
	if st.ProtocolErrors != 0 || st.AbandonedSessions != 1 {
		t.Fatalf("ProtocolErrors %d, AbandonedSessions %d; want 0 and 1", st.ProtocolErrors, st.AbandonedSessions)
	}
}
