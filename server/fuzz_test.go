package server

import (
	"net"
	"testing"
	"time"

	"github.com/lockd/lockd/codec"
)

// FuzzServerFrameLoop sends arbitrary byte streams over a real connection.
// Whatever arrives, the server must answer only well-formed frames, never
// crash, and keep serving the next client.
func FuzzServerFrameLoop(f *testing.F) {
	f.Add(codec.AppendAcquire(nil, 1, 30, 0, "k"))
	f.Add(append(codec.AppendAcquire(nil, 1, 30, 0, "k"), codec.AppendRelease(nil, 2, 1, "k")...))
	f.Add(codec.AppendHello(nil, [16]byte{0x0A}, [32]byte{}, "t"))
	f.Add([]byte("Z\n"))
	f.Add(make([]byte, 300))
	s := startServer(f, nil)
	f.Fuzz(func(t *testing.T, stream []byte) {
		nc, err := net.Dial("tcp", s.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		c := newTestConn(t, nc)
		if r := c.recv(); r.Op != codec.OpGreeting {
			t.Fatalf("first frame %q", r.Op)
		}
		_ = nc.SetWriteDeadline(time.Now().Add(ioTimeout))
		if _, err := nc.Write(stream); err != nil {
			return // the server may close mid-write after an error
		}
		_ = nc.(*net.TCPConn).CloseWrite()
		// Every stream ends: the server must answer what it can and close.
		c.drainUntilClosed()
		probe := dial(t, s)
		probe.expectOpen()
	})
}
