package server

import (
	"crypto/rand"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/lockd/lockd/codec"
	"github.com/lockd/lockd/engine"
	"github.com/lockd/lockd/server/servertest"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, servertest.IgnoreGnetWorkers()...)
}

// ioTimeout bounds every read a test makes, so a broken server fails the
// test instead of hanging it.
const ioTimeout = 5 * time.Second

type testServer struct {
	*Server
	clock *engine.FakeClock
}

// startServer runs a server on a free loopback port with a fake clock.
func startServer(t testing.TB, configure func(*Config)) *testServer {
	t.Helper()
	clock := engine.NewFakeClock()
	cfg := Config{
		Listen:   "127.0.0.1:0",
		NodeName: "test-node",
		Loops:    2,
		Engine:   engine.Config{Clock: clock},
		Logger:   zerolog.Nop(),
	}
	if configure != nil {
		configure(&cfg)
	}
	s, err := Start(cfg)
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return &testServer{Server: s, clock: clock}
}

// advance moves the fake clock and lets the engine act on what fell due.
func (s *testServer) advance(d time.Duration) {
	s.clock.Advance(d)
	s.Engine().Tick()
}

type testConn struct {
	t        *testing.T
	nc       net.Conn
	rr       *codec.ResponseReader
	greeting codec.Response
}

func newTestConn(t *testing.T, nc net.Conn) *testConn {
	return &testConn{t: t, nc: nc, rr: codec.NewResponseReader(nc, 4096)}
}

// dial connects and reads the greeting.
func dial(t *testing.T, s *testServer) *testConn {
	t.Helper()
	nc, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { nc.Close() })
	c := newTestConn(t, nc)
	c.greeting = c.recv()
	if c.greeting.Op != codec.OpGreeting {
		t.Fatalf("first frame is %q, want a greeting", c.greeting.Op)
	}
	return c
}

func (c *testConn) send(frames ...[]byte) {
	c.t.Helper()
	for _, f := range frames {
		if _, err := c.nc.Write(f); err != nil {
			c.t.Fatalf("write: %v", err)
		}
	}
}

// read decodes the next response; io.EOF when the server closed.
func (c *testConn) read() (codec.Response, error) {
	var r codec.Response
	_ = c.nc.SetReadDeadline(time.Now().Add(ioTimeout))
	err := c.rr.Next(&r)
	r.NodeName = append([]byte(nil), r.NodeName...)
	return r, err
}

func (c *testConn) recv() codec.Response {
	c.t.Helper()
	r, err := c.read()
	if err != nil {
		c.t.Fatalf("read: %v", err)
	}
	return r
}

// expect reads the next response and checks its op and owner.
func (c *testConn) expect(op byte, owner uint64) codec.Response {
	c.t.Helper()
	r := c.recv()
	if r.Op != op || r.Owner != owner {
		c.t.Fatalf("got %q owner %d (reason %v), want %q owner %d", r.Op, r.Owner, r.Reason, op, owner)
	}
	return r
}

func (c *testConn) expectError(owner uint64, reason codec.Reason) {
	c.t.Helper()
	r := c.expect(codec.OpError, owner)
	if r.Reason != reason {
		c.t.Fatalf("reason %v, want %v", r.Reason, reason)
	}
}

// expectClosed checks that the server closed the connection with nothing
// more to say.
func (c *testConn) expectClosed() {
	c.t.Helper()
	r, err := c.read()
	if err == nil {
		c.t.Fatalf("got %q (reason %v), want the connection closed", r.Op, r.Reason)
	}
	if !errors.Is(err, io.EOF) && !isReset(err) {
		c.t.Fatalf("want EOF, got %v", err)
	}
}

// drainUntilClosed reads well-formed frames until the server closes.
func (c *testConn) drainUntilClosed() {
	c.t.Helper()
	for {
		r, err := c.read()
		if err == nil {
			continue
		}
		if !errors.Is(err, io.EOF) && !isReset(err) {
			c.t.Fatalf("after %q: want a close, got %v", r.Op, err)
		}
		return
	}
}

// expectOpen checks the connection still answers.
func (c *testConn) expectOpen() {
	c.t.Helper()
	c.send(codec.AppendPing(nil, 999_999))
	c.expect(codec.OpPong, 999_999)
}

func isReset(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && !op.Timeout()
}

func (c *testConn) acquire(owner uint64, lease uint16, wait uint8, key string) {
	c.t.Helper()
	c.send(codec.AppendAcquire(nil, owner, lease, wait, key))
}

// mustAcquire acquires a free key and returns its token.
func (c *testConn) mustAcquire(owner uint64, key string) uint64 {
	c.t.Helper()
	c.acquire(owner, 30, 0, key)
	return c.expect(codec.OpAcquired, owner).Token
}

// hello authenticates as tenant with secret and checks the server's MAC.
func (c *testConn) hello(tenant string, secret []byte) codec.Response {
	c.t.Helper()
	var nonce [codec.NonceLen]byte
	_, _ = rand.Read(nonce[:])
	mac := codec.ClientMAC(secret, c.greeting.ServerNonce, nonce, []byte(tenant))
	c.send(codec.AppendHello(nil, nonce, mac, tenant))
	r := c.recv()
	if r.Op == codec.OpWelcome && c.greeting.Flags&codec.GreetingAuthRequired != 0 {
		want := codec.ServerMAC(secret, nonce, c.greeting.ServerNonce, []byte(tenant))
		if !codec.EqualMAC(want, r.ServerMAC) {
			c.t.Fatal("server MAC does not verify")
		}
	}
	return r
}
