package client

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockd/lockd/client/lockdtest"
	"github.com/lockd/lockd/codec"
	"github.com/lockd/lockd/internal/poll"
)

// frame is one request as a scripted peer saw it.
type frame struct {
	conn  int
	op    byte
	owner uint64
	lease uint16
	wait  uint8
	token uint64
	key   string
	// target is an ABANDON's owner of the ACQUIRE it gives back.
	target uint64
	// clientID is a SESSION's client_id.
	clientID [codec.ClientIDLen]byte
}

// answerFunc scripts a peer's reaction to one request: reply, stay
// silent, close, or hand the frame to the test.
type answerFunc func(p *peer, c *lockdtest.Conn, f frame)

// peer is a scripted fake server that records every request. It answers
// PING itself, unless muted, and SESSION where its GREETING offers SPEC
// §6a; the other requests go to its answerFunc.
type peer struct {
	srv     *lockdtest.Server
	answer  answerFunc
	secrets map[string][]byte
	flags   uint8 // further GREETING flags
	tokens  atomic.Uint64
	// muted stops answering PING: a server gone silent.
	muted atomic.Bool

	mu      sync.Mutex
	frames  []frame
	conns   int
	ended   map[int]bool
	maxOpen int // the most connections open at once
}

func startPeer(t *testing.T, answer answerFunc) *peer {
	return startAuthPeer(t, answer, nil)
}

// startAbandonPeer is a peer whose GREETING offers SESSION and ABANDON
// (SPEC §6a).
func startAbandonPeer(t *testing.T, answer answerFunc) *peer {
	return startFlagsPeer(t, answer, nil, codec.GreetingAbandon)
}

func startAuthPeer(t *testing.T, answer answerFunc, secrets map[string][]byte) *peer {
	return startFlagsPeer(t, answer, secrets, 0)
}

func startFlagsPeer(t *testing.T, answer answerFunc, secrets map[string][]byte, flags uint8) *peer {
	t.Helper()
	p := &peer{answer: answer, secrets: secrets, flags: flags, ended: make(map[int]bool)}
	srv, err := lockdtest.Start(p.serve)
	if err != nil {
		t.Fatal(err)
	}
	p.srv = srv
	t.Cleanup(func() { srv.Close() })
	return p
}

func (p *peer) serve(c *lockdtest.Conn) {
	p.mu.Lock()
	index := p.conns
	p.conns++
	p.maxOpen = max(p.maxOpen, p.conns-len(p.ended))
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.ended[index] = true
		p.mu.Unlock()
	}()
	if c.HandshakeWith(p.secrets, p.flags) != nil {
		return
	}
	c.Serve(func(c *lockdtest.Conn, req *codec.Request) {
		f := frame{conn: index, op: req.Op, owner: req.Owner, lease: req.LeaseSeconds,
			wait: req.WaitSeconds, token: req.Token, key: string(req.Key), target: req.Target, clientID: req.ClientID}
		p.mu.Lock()
		p.frames = append(p.frames, f)
		p.mu.Unlock()
		switch {
		case f.op == codec.OpPing:
			if !p.muted.Load() {
				c.Reply(codec.OpPong, f.owner)
			}
		case f.op == codec.OpSession && p.flags&codec.GreetingAbandon != 0:
			c.Reply(codec.OpPong, f.owner)
		case p.answer != nil:
			p.answer(p, c, f)
		}
	})
}

// seen returns the recorded requests with op.
func (p *peer) seen(op byte) []frame {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []frame
	for _, f := range p.frames {
		if f.op == op {
			out = append(out, f)
		}
	}
	return out
}

// seenOn returns the recorded requests with op on connection conn.
func (p *peer) seenOn(conn int, op byte) []frame {
	var out []frame
	for _, f := range p.seen(op) {
		if f.conn == conn {
			out = append(out, f)
		}
	}
	return out
}

func (p *peer) connEnded(index int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ended[index]
}

// grant answers every acquire ACQUIRED with a fresh token and every
// release RELEASED.
func grant(p *peer, c *lockdtest.Conn, f frame) {
	switch f.op {
	case codec.OpAcquire:
		c.Acquired(f.owner, p.tokens.Add(1), 0)
	case codec.OpRelease:
		c.Reply(codec.OpReleased, f.owner)
	}
}

// newClient dials one shared session to p with clk and keeps no spare
// wait sessions, unless cfg says otherwise: connections are then numbered
// in the order the test causes them — the shared session is 0, a wait
// session is dialled when a waiting acquire needs one.
func newClient(t *testing.T, p *peer, clk *fakeClock, configure func(*Config)) *Client {
	t.Helper()
	cfg := Config{Addrs: []string{p.srv.Addr()}, Sessions: 1, WaitSpares: -1}
	if configure != nil {
		configure(&cfg)
	}
	c, err := dial(context.Background(), cfg, clk)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeClient(t, c, clk) })
	return c
}

// closeClient closes c while moving the fake clock, so that compensating
// releases still waiting for an answer reach their deadline.
func closeClient(t *testing.T, c *Client, clk *fakeClock) {
	done := make(chan struct{})
	go func() {
		c.Close()
		close(done)
	}()
	for range 10000 {
		select {
		case <-done:
			return
		case <-time.After(time.Millisecond):
			clk.Advance(time.Second)
		}
	}
	t.Error("Close did not return")
}

// eventually polls cond; it waits for another goroutine to get somewhere,
// never for a deadline to pass.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if !poll.Until(10*time.Second, time.Millisecond, cond) {
		t.Fatalf("timed out waiting until %s", what)
	}
}

type result struct {
	Ticket Ticket
	Err    error
}

func goAcquire(c *Client, key string, opts AcquireOptions) <-chan result {
	return goAcquireCtx(context.Background(), c, key, opts)
}

func goAcquireCtx(ctx context.Context, c *Client, key string, opts AcquireOptions) <-chan result {
	ch := make(chan result, 1)
	go func() {
		t, err := c.Acquire(ctx, key, opts)
		ch <- result{t, err}
	}()
	return ch
}

func goRelease(c *Client, key string, token uint64) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- c.ReleaseToken(context.Background(), key, token) }()
	return ch
}

// await is a safety net against a hung test, not a way to reach a
// deadline: every deadline in these tests is on the fake clock.
func await[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(20 * time.Second):
		t.Fatal("no result")
		panic("unreachable")
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

func waitFor(wait time.Duration) AcquireOptions {
	return AcquireOptions{Wait: wait, MinWorkBudget: Budget(0)}
}

// onlySession is the shared session of a one-session client.
func onlySession(c *Client) *session { return c.slots[0].session.Load() }

// deadlineCtx is a context whose deadline is on the fake clock and which
// never ends by itself: its deadline reaches the call only as the call's
// one operation deadline.
type deadlineCtx struct {
	context.Context
	deadline time.Time
}

func withFakeDeadline(clk *fakeClock, d time.Duration) context.Context {
	return deadlineCtx{Context: context.Background(), deadline: clk.Now().Add(d)}
}

func (c deadlineCtx) Deadline() (time.Time, bool) { return c.deadline, true }

func queued(s *session) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.queue)
}

// hookedConn routes a real connection's writes through a test hook.
type hookedConn struct {
	net.Conn
	index  int
	closed chan struct{}
	once   sync.Once
	write  func(c *hookedConn, b []byte) (int, error)
}

func (c *hookedConn) Write(b []byte) (int, error) { return c.write(c, b) }

func (c *hookedConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

// hookDialer dials real connections whose writes go through write;
// connections are numbered in dial order.
func hookDialer(write func(c *hookedConn, b []byte) (int, error)) func(context.Context, string, string) (net.Conn, error) {
	var dialled atomic.Int32
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		index := int(dialled.Add(1) - 1)
		return &hookedConn{Conn: conn, index: index, closed: make(chan struct{}), write: write}, nil
	}
}

// firstWriteGate holds the first write of the client until open is closed,
// so that later requests stay queued behind it.
type firstWriteGate struct {
	open    chan struct{}
	entered atomic.Bool
}

func newFirstWriteGate() *firstWriteGate { return &firstWriteGate{open: make(chan struct{})} }

func (g *firstWriteGate) write(c *hookedConn, b []byte) (int, error) {
	if g.entered.CompareAndSwap(false, true) {
		select {
		case <-g.open:
		case <-c.closed:
			return 0, net.ErrClosed
		}
	}
	return c.Conn.Write(b)
}

// stallingDialer dials real connections, numbered in dial order, any of
// which the test can make deaf: from then on its reads return nothing of
// what arrives, as if the server had gone silent, until it is closed.
type stallingDialer struct {
	mu      sync.Mutex
	conns   []*stallingConn
	stalled map[int]bool
}

type stallingConn struct {
	net.Conn
	stalled atomic.Bool
	closed  chan struct{}
	once    sync.Once
}

func (d *stallingDialer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	sc := &stallingConn{Conn: conn, closed: make(chan struct{})}
	d.mu.Lock()
	sc.stalled.Store(d.stalled[len(d.conns)])
	d.conns = append(d.conns, sc)
	d.mu.Unlock()
	return sc, nil
}

// stallConn makes connection index deaf, now or when it is dialled.
func (d *stallingDialer) stallConn(index int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if index < len(d.conns) {
		d.conns[index].stalled.Store(true)
		return
	}
	if d.stalled == nil {
		d.stalled = make(map[int]bool)
	}
	d.stalled[index] = true
}

func (c *stallingConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if c.stalled.Load() {
		<-c.closed
		return 0, net.ErrClosed
	}
	return n, err
}

func (c *stallingConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.Conn.Close()
}
