package cluster

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/lockd/lockd/codec"
	"github.com/lockd/lockd/server"
)

// wire is a minimal protocol client for tests; its methods return errors
// so that goroutines can use it.
type wire struct {
	nc  net.Conn
	buf []byte
	// flags are the GREETING's (codec.GreetingAbandon: SPEC §6a served).
	flags uint8
}

func dialWire(addr string) (*wire, error) {
	nc, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return nil, err
	}
	return newWire(nc)
}

// newWire reads the greeting on a fresh connection; it closes nc on error.
func newWire(nc net.Conn) (*wire, error) {
	w := &wire{nc: nc}
	g, err := w.read(5 * time.Second)
	if err != nil {
		nc.Close()
		return nil, err
	}
	if g.Op != codec.OpGreeting {
		nc.Close()
		return nil, fmt.Errorf("first frame %q", g.Op)
	}
	w.flags = g.Flags
	return w, nil
}

func (w *wire) close() { w.nc.Close() }

func (w *wire) send(frame []byte) error {
	_ = w.nc.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_, err := w.nc.Write(frame)
	return err
}

func (w *wire) read(within time.Duration) (codec.Response, error) {
	var r codec.Response
	chunk := make([]byte, 4096)
	deadline := time.Now().Add(within)
	for {
		n, err := codec.DecodeResponse(w.buf, &r)
		if err == nil {
			w.buf = w.buf[n:]
			r.NodeName = nil
			return r, nil
		}
		if err != codec.ErrIncomplete {
			return r, err
		}
		_ = w.nc.SetReadDeadline(deadline)
		m, rerr := w.nc.Read(chunk)
		w.buf = append(w.buf, chunk[:m]...)
		if rerr != nil && m == 0 {
			return r, rerr
		}
	}
}

// clusterServers runs a lockd server, with its admin endpoint, over each
// node of tc.
func clusterServers(t *testing.T, tc *testCluster) []*server.Server {
	t.Helper()
	var srvs []*server.Server
	for _, n := range tc.nodes {
		s, err := server.Start(server.Config{Listen: "127.0.0.1:0", Admin: "127.0.0.1:0", Backend: n, Logger: testLogger(), NodeName: fmt.Sprintf("node-%d", n.ID())})
		if err != nil {
			t.Fatal(err)
		}
		srvs = append(srvs, s)
		t.Cleanup(func() { s.Close() })
	}
	return srvs
}

func mustWire(t *testing.T, addr string) *wire {
	t.Helper()
	w, err := dialWire(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.close)
	return w
}

func expectResp(t *testing.T, w *wire, op byte, owner uint64) codec.Response {
	t.Helper()
	r, err := w.read(15 * time.Second)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	if r.Op != op || r.Owner != owner {
		t.Fatalf("got %q owner %d reason %v, want %q owner %d", r.Op, r.Owner, r.Reason, op, owner)
	}
	return r
}

// The same wire protocol on every node: acquire through one node's
// server, release through another's, waiters across servers, a waiter's
// connection closing (its waiter leaves the queue), and E unavailable
// without quorum.
func TestWireProtocolOnEveryNode(t *testing.T) {
	tc := newTestCluster(t, 3, func(c *Config) { c.ProposeTimeout = time.Second })
	srvs := clusterServers(t, tc)
	c1, c2, c3 := mustWire(t, srvs[0].Addr()), mustWire(t, srvs[1].Addr()), mustWire(t, srvs[2].Addr())

	if err := c1.send(codec.AppendAcquire(nil, 1, 30, 0, "wire/1")); err != nil {
		t.Fatal(err)
	}
	tok := expectResp(t, c1, codec.OpAcquired, 1).Token
	// A waiter on node 3 whose connection closes, then one on node 2.
	gone := mustWire(t, srvs[2].Addr())
	if err := gone.send(codec.AppendAcquire(nil, 5, 30, 30, "wire/1")); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 10*time.Second, "queued", func() bool { return queueLen(tc.node(1), "wire/1") == 1 })
	gone.close()
	waitUntil(t, 10*time.Second, "the closed connection's waiter to leave the queue", func() bool { return queueLen(tc.node(1), "wire/1") == 0 })
	if err := c2.send(codec.AppendAcquire(nil, 2, 30, 30, "wire/1")); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 10*time.Second, "queued", func() bool { return queueLen(tc.node(1), "wire/1") == 1 })
	// Pipelined on node 3: a release with a wrong token, then the right one.
	if err := c3.send(append(codec.AppendRelease(nil, 3, tok+100, "wire/1"), codec.AppendRelease(nil, 4, tok, "wire/1")...)); err != nil {
		t.Fatal(err)
	}
	got := map[uint64]byte{}
	for range 2 {
		r, err := c3.read(10 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		got[r.Owner] = r.Op
	}
	if got[3] != codec.OpNotHeld || got[4] != codec.OpReleased {
		t.Fatalf("releases on node 3: %v", got)
	}
	// The closed waiter left the queue, so node 2's waiter gets the lock
	// with the next token.
	r := expectResp(t, c2, codec.OpAcquired, 2)
	if r.Token != tok+1 {
		t.Fatalf("token %d after %d, want %d", r.Token, tok, tok+1)
	}
	// dup_owner holds for an in-flight release too: none here, so ping.
	if err := c2.send(codec.AppendPing(nil, 9)); err != nil {
		t.Fatal(err)
	}
	expectResp(t, c2, codec.OpPong, 9)

	// Without quorum: E unavailable, connection kept open.
	for _, s := range srvs[1:] {
		s.Close()
	}
	tc.stop(2)
	tc.stop(3)
	if err := c1.send(codec.AppendAcquire(nil, 7, 30, 0, "wire/2")); err != nil {
		t.Fatal(err)
	}
	if r := expectResp(t, c1, codec.OpError, 7); r.Reason != codec.Unavailable {
		t.Fatalf("reason %v", r.Reason)
	}
	if err := c1.send(codec.AppendPing(nil, 8)); err != nil {
		t.Fatal(err)
	}
	expectResp(t, c1, codec.OpPong, 8)
}

func startServer(n *Node) (*server.Server, error) {
	return server.Start(server.Config{Listen: "127.0.0.1:0", Backend: n, Logger: testLogger()})
}

// KEEP over the wire in cluster mode: renewed through any node's server
// with the same token, N for a stale token, field errors and dup_owner
// answered by the server, and no gate on the way: with this node's
// in-flight and waiters gates closed by queued acquires, the holder still
// renews.
func TestKeepOnEveryNode(t *testing.T) {
	tc := newTestCluster(t, 3, func(c *Config) { c.MaxInflight, c.MaxWaiters = 10, 10 })
	srvs := clusterServers(t, tc)
	c1, c2, c3 := mustWire(t, srvs[0].Addr()), mustWire(t, srvs[1].Addr()), mustWire(t, srvs[2].Addr())
	if err := c1.send(codec.AppendAcquire(nil, 1, 30, 0, "keep/1")); err != nil {
		t.Fatal(err)
	}
	tok := expectResp(t, c1, codec.OpAcquired, 1).Token

	// Close node 2's gates: 9 of 10 queued acquires, then one refused.
	for i := range 9 {
		if err := c2.send(codec.AppendAcquire(nil, uint64(100+i), 30, 60, "keep/1")); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, 10*time.Second, "queued", func() bool { return queueLen(tc.node(2), "keep/1") == 9 })
	if err := c2.send(codec.AppendAcquire(nil, 200, 30, 60, "keep/1")); err != nil {
		t.Fatal(err)
	}
	expectResp(t, c2, codec.OpBusy, 200)

	for i, c := range []*wire{c2, c3, c1} {
		owner := uint64(10 + i)
		if err := c.send(codec.AppendKeep(nil, owner, tok, 30, "keep/1")); err != nil {
			t.Fatal(err)
		}
		if r := expectResp(t, c, codec.OpAcquired, owner); r.Token != tok || r.WaitedMs != 0 {
			t.Fatalf("KEEP through node %d: token %d waited %d, want token %d waited 0", i+1, r.Token, r.WaitedMs, tok)
		}
	}
	if err := c3.send(codec.AppendKeep(nil, 20, tok+1, 30, "keep/1")); err != nil {
		t.Fatal(err)
	}
	expectResp(t, c3, codec.OpNotHeld, 20)
	if err := c3.send(codec.AppendKeep(nil, 21, tok, 0, "keep/1")); err != nil {
		t.Fatal(err)
	}
	if r := expectResp(t, c3, codec.OpError, 21); r.Reason != codec.BadLease {
		t.Fatalf("reason %v", r.Reason)
	}
	if err := c2.send(codec.AppendKeep(nil, 100, tok, 30, "keep/1")); err != nil { // owner 100 is queued
		t.Fatal(err)
	}
	if r := expectResp(t, c2, codec.OpError, 100); r.Reason != codec.DupOwner {
		t.Fatalf("reason %v", r.Reason)
	}
	if got := tc.node(3).Token("default", []byte("keep/1")); got != tok {
		t.Fatalf("token after the renewals: %d, want %d", got, tok)
	}
}
