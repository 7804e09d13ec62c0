package server

import (
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockd/lockd/codec"
)

// muteProxy relays one client connection to the server, and once muted
// drops every byte the server sends: the server writes its answers, the
// client never sees them.
type muteProxy struct {
	ln      net.Listener
	target  string
	muted   atomic.Bool
	dropped atomic.Int64 // bytes of the server's dropped since muted
	wg      sync.WaitGroup

	mu    sync.Mutex
	conns []net.Conn
}

func startMuteProxy(t *testing.T, target string) *muteProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &muteProxy{ln: ln, target: target}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(p.close)
	return p
}

func (p *muteProxy) serve() {
	defer p.wg.Done()
	client, err := p.ln.Accept()
	if err != nil {
		return
	}
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		client.Close()
		return
	}
	p.mu.Lock()
	p.conns = append(p.conns, client, server)
	p.mu.Unlock()
	p.wg.Add(2)
	go func() { defer p.wg.Done(); _, _ = io.Copy(server, client) }()
	go func() {
		defer p.wg.Done()
		buf := make([]byte, 4096)
		for {
			n, err := server.Read(buf)
			if n > 0 {
				if p.muted.Load() {
					p.dropped.Add(int64(n))
				} else if _, werr := client.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
}

// cut closes both sides of the relayed connection.
func (p *muteProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
}

func (p *muteProxy) close() {
	p.ln.Close()
	p.cut()
	p.wg.Wait()
}

// startLockdProcess builds cmd/lockd and serves single mode on a free
// loopback port with a data dir of its own, until the test ends.
func startLockdProcess(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "lockd")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/lockd").CombinedOutput(); err != nil {
		t.Fatalf("build lockd: %v\n%s", err, out)
	}
	var addrs [2]string
	for i := range addrs {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addrs[i] = l.Addr().String()
		l.Close()
	}
	logPath := filepath.Join(dir, "lockd.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "serve", "--listen", addrs[0], "--admin", addrs[1],
		"--data-dir", filepath.Join(dir, "data"), "--log-level", "warn")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		logFile.Close()
		if t.Failed() {
			if b, err := os.ReadFile(logPath); err == nil {
				t.Logf("lockd log:\n%s", b)
			}
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		nc, err := net.Dial("tcp", addrs[0])
		if err == nil {
			nc.Close()
			return addrs[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("lockd never listened on %s: %v", addrs[0], err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func dialAddr(t *testing.T, addr string) *testConn {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { nc.Close() })
	c := newTestConn(t, nc)
	c.greeting = c.expect(codec.OpGreeting, 0)
	return c
}

// TestAbandonFreesAGrantWhoseAnswerWasLost is SPEC §6a end to end against
// the lockd binary: the server writes the A of an ACQUIRE, the client
// never sees it (a proxy drops it) and then loses the connection. The
// key stays held for the 30 s lease, until the client, on another
// connection with the same client_id, abandons the request: then the key
// is free within a second of the client seeing the cut.
func TestAbandonFreesAGrantWhoseAnswerWasLost(t *testing.T) {
	if testing.Short() {
		t.Skip("process test skipped in -short mode")
	}
	addr := startLockdProcess(t)
	proxy := startMuteProxy(t, addr)
	id := [codec.ClientIDLen]byte{'p', 'r', 'o', 'c', 'e', 's', 's', '-', 'c', 'l', 'i', 'e', 'n', 't'}

	lost := dialAddr(t, proxy.ln.Addr().String())
	if lost.greeting.Flags&codec.GreetingAbandon == 0 {
		t.Fatalf("single mode's greeting flags %#x lack bit1", lost.greeting.Flags)
	}
	lost.session(1, id)
	proxy.muted.Store(true)
	lost.acquire(7, 30, 0, "jobs/nightly")
	acquired := len(codec.AppendAcquired(nil, 7, 1, 0))
	for deadline := time.Now().Add(ioTimeout); proxy.dropped.Load() < int64(acquired); {
		if time.Now().After(deadline) {
			t.Fatalf("the server's answer never reached the proxy (%d bytes dropped)", proxy.dropped.Load())
		}
		time.Sleep(time.Millisecond)
	}
	proxy.cut()
	if r, err := lost.read(); err == nil {
		t.Fatalf("the client saw %q through a muted, cut proxy", r.Op)
	}
	cutSeen := time.Now()

	other := dialAddr(t, addr)
	other.acquire(1, 30, 0, "jobs/nightly")
	other.expect(codec.OpTimeout, 1) // held: the A was written, the lease runs

	again := dialAddr(t, addr)
	again.session(1, id)
	again.send(codec.AppendAbandon(nil, 2, 7, "jobs/nightly"))
	again.expect(codec.OpReleased, 2)
	other.acquire(2, 30, 0, "jobs/nightly")
	token := other.expect(codec.OpAcquired, 2).Token
	if free := time.Since(cutSeen); free > time.Second {
		t.Errorf("the key was free %v after the client saw the cut, want within 1 s", free)
	}

	// The lost ACQUIRE, were it to arrive now, is refused though the key
	// is free; the session's other requests are not.
	other.send(codec.AppendRelease(nil, 3, token, "jobs/nightly"))
	other.expect(codec.OpReleased, 3)
	again.acquire(7, 30, 0, "jobs/nightly")
	again.expect(codec.OpTimeout, 7)
	again.acquire(9, 30, 0, "jobs/nightly")
	again.expect(codec.OpAcquired, 9)
}
