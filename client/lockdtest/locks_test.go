package lockdtest

import (
	"net"
	"testing"
	"time"

	"github.com/lockd/lockd/codec"
)

// rawConn is a client that speaks frames by hand.
type rawConn struct {
	t  *testing.T
	nc net.Conn
	rr *codec.ResponseReader
}

func dialRaw(t *testing.T, l *Locks) (*rawConn, uint8) {
	t.Helper()
	srv, err := Start(l.Serve)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return dialTo(t, srv.Addr())
}

func dialTo(t *testing.T, addr string) (*rawConn, uint8) {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	nc.SetDeadline(time.Now().Add(10 * time.Second))
	c := &rawConn{t: t, nc: nc, rr: codec.NewResponseReader(nc, 4096)}
	g := c.next()
	if g.Op != codec.OpGreeting {
		t.Fatalf("first frame %q, want GREETING", g.Op)
	}
	return c, g.Flags
}

func (c *rawConn) send(frame []byte) {
	c.t.Helper()
	if _, err := c.nc.Write(frame); err != nil {
		c.t.Fatal(err)
	}
}

func (c *rawConn) next() codec.Response {
	c.t.Helper()
	var resp codec.Response
	if err := c.rr.Next(&resp); err != nil {
		c.t.Fatal(err)
	}
	return resp
}

func (c *rawConn) expect(op byte, owner uint64) codec.Response {
	c.t.Helper()
	resp := c.next()
	if resp.Op != op || resp.Owner != owner {
		c.t.Fatalf("got %q for owner %d, want %q for %d", resp.Op, resp.Owner, op, owner)
	}
	return resp
}

func (c *rawConn) expectClosedWithBadRequest() {
	c.t.Helper()
	resp := c.expect(codec.OpError, 0)
	if resp.Reason != codec.BadRequest {
		c.t.Fatalf("reason %v, want bad_request", resp.Reason)
	}
	var more codec.Response
	if err := c.rr.Next(&more); err == nil {
		c.t.Fatalf("connection still open: %q", more.Op)
	}
}

var clientA = [codec.ClientIDLen]byte{1}

// ABANDON from another connection of the same client releases the grant
// its ACQUIRE got, and its tombstone refuses that ACQUIRE should it come
// again; another client_id cannot abandon it.
func TestLocksAbandonReleasesTheGrantOfThatRequestOnly(t *testing.T) {
	l := &Locks{}
	first, flags := dialRaw(t, l)
	if flags&codec.GreetingAbandon == 0 {
		t.Fatalf("GREETING flags %b, want bit1", flags)
	}
	first.send(codec.AppendSession(nil, 1, clientA))
	first.expect(codec.OpPong, 1)
	first.send(codec.AppendAcquire(nil, 2, 30, 0, "k"))
	first.expect(codec.OpAcquired, 2)

	addr := first.nc.RemoteAddr().String()
	stranger, _ := dialTo(t, addr)
	stranger.send(codec.AppendSession(nil, 1, [codec.ClientIDLen]byte{2}))
	stranger.expect(codec.OpPong, 1)
	stranger.send(codec.AppendAbandon(nil, 3, 2, "k"))
	stranger.expect(codec.OpNotHeld, 3)

	second, _ := dialTo(t, addr)
	second.send(codec.AppendSession(nil, 4, clientA))
	second.expect(codec.OpPong, 4)
	second.send(codec.AppendAbandon(nil, 5, 2, "k"))
	second.expect(codec.OpReleased, 5)
	second.send(codec.AppendAbandon(nil, 6, 2, "k"))
	second.expect(codec.OpNotHeld, 6)

	first.send(codec.AppendAcquire(nil, 2, 30, 0, "k")) // the abandoned request again
	first.expect(codec.OpTimeout, 2)
	first.send(codec.AppendAcquire(nil, 7, 30, 0, "k"))
	first.expect(codec.OpAcquired, 7)
}

// SESSION and ABANDON out of SPEC §6a's order close the connection with
// E bad_request; a server playing one without §6a refuses them.
func TestLocksRefusesSessionAndAbandonOutOfOrder(t *testing.T) {
	for name, tc := range map[string]struct {
		locks  *Locks
		frames [][]byte
	}{
		"second SESSION":          {&Locks{}, [][]byte{codec.AppendSession(nil, 1, clientA), codec.AppendSession(nil, 2, clientA)}},
		"SESSION after ACQUIRE":   {&Locks{}, [][]byte{codec.AppendAcquire(nil, 1, 30, 0, "k"), codec.AppendSession(nil, 2, clientA)}},
		"ABANDON without SESSION": {&Locks{}, [][]byte{codec.AppendAbandon(nil, 1, 9, "k")}},
		"SESSION without §6a":     {&Locks{NoAbandon: true}, [][]byte{codec.AppendSession(nil, 1, clientA)}},
	} {
		t.Run(name, func(t *testing.T) {
			c, flags := dialRaw(t, tc.locks)
			if tc.locks.NoAbandon && flags&codec.GreetingAbandon != 0 {
				t.Fatal("bit1 set without §6a")
			}
			for i, f := range tc.frames {
				c.send(f)
				if i < len(tc.frames)-1 {
					c.next()
				}
			}
			c.expectClosedWithBadRequest()
		})
	}
}
