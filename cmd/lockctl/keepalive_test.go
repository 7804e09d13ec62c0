package main

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/lockd/lockd/client"
	"github.com/lockd/lockd/client/lockdtest"
	"github.com/lockd/lockd/codec"
)

// With keep-alive (the default) a command three times longer than the
// lease runs to its end and exits 0, and the lock is still held past the
// lease it was granted with.
func TestExecKeepsTheLockForAJobThreeTimesItsLease(t *testing.T) {
	addr := startServer(t, nil)
	stdin, feed := io.Pipe()
	var out, errs syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(context.Background(),
			[]string{"exec", "--addr", addr, "--lease", "2s", "--grace", "500ms", "k", "--",
				"sh", "-c", `sleep 3; echo past-the-lease; read line; sleep 3; echo three-leases`},
			func(string) (string, bool) { return "", false }, proc{in: stdin, out: &out, err: &errs})
	}()
	out.awaitOutput(t, "past-the-lease", done)
	c, err := client.Dial(context.Background(), client.Config{Addrs: []string{addr}, Sessions: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Acquire(context.Background(), "k", client.AcquireOptions{MinWorkBudget: client.Budget(0)}); !errors.Is(err, client.ErrTimeout) {
		t.Fatalf("past its granted lease the lock is not held: %v", err)
	}
	feed.Write([]byte("go\n"))
	feed.Close()
	if code := <-done; code != exitOK {
		t.Fatalf("exit %d (%s), want 0", code, errs.String())
	}
	if !strings.Contains(out.String(), "three-leases") {
		t.Fatalf("the command did not run its three leases to the end: %q", out.String())
	}
	if strings.Contains(errs.String(), "SIG") {
		t.Fatalf("lockctl signalled the command: %s", errs.String())
	}
	if _, err := c.Acquire(context.Background(), "k", client.AcquireOptions{MinWorkBudget: client.Budget(0)}); err != nil {
		t.Fatalf("the lock was not released after the command: %v", err)
	}
}

// With --keepalive=false the same kind of command is stopped at the lease.
func TestExecWithoutKeepaliveStopsTheCommandAtTheLease(t *testing.T) {
	addr := startServer(t, nil)
	code, _, errs := ctl{}.run("exec", "--addr", addr, "--keepalive=false", "--lease", "2s", "--grace", "500ms", "k", "--", "sleep", "6")
	if code != exitLeaseEnded || !strings.Contains(errs, "SIGTERM") {
		t.Fatalf("exit %d (%s), want %d after SIGTERM", code, errs, exitLeaseEnded)
	}
	if strings.Contains(errs, "SIGKILL") {
		t.Fatalf("the command outlived the lease: %s", errs)
	}
	checkReleasedWhileHeld(t, errs)
}

// keepServer grants every acquire token 1, answers every KEEP with keep,
// and every release RELEASED. It counts the KEEPs it was sent.
func keepServer(t *testing.T, keep func(c *lockdtest.Conn, req *codec.Request)) (string, *atomic.Int32) {
	t.Helper()
	var keeps atomic.Int32
	srv, err := lockdtest.Start(func(c *lockdtest.Conn) {
		if c.Handshake(nil) != nil {
			return
		}
		c.Serve(func(c *lockdtest.Conn, req *codec.Request) {
			switch req.Op {
			case codec.OpAcquire:
				c.QueueAcquired(req.Owner, 1, 0)
			case codec.OpKeep:
				keeps.Add(1)
				keep(c, req)
			case codec.OpRelease:
				c.QueueReply(codec.OpReleased, req.Owner)
			}
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return srv.Addr(), &keeps
}

// A renewal answered NOT HELD means the lock is gone: the command is
// killed at once, long before the lease it had — before any second
// renewal, and before the SIGTERM that the lease's end would bring.
func TestExecKillsTheCommandWhenARenewalIsNotHeld(t *testing.T) {
	addr, keeps := keepServer(t, func(c *lockdtest.Conn, req *codec.Request) { c.QueueReply(codec.OpNotHeld, req.Owner) })
	// Renewals every 3 s; the lease's own SIGTERM would come at 8 s.
	code, _, errs := ctl{}.run("exec", "--addr", addr, "--lease", "9s", "--grace", "1s", "k", "--", "sleep", "60")
	if code != exitLeaseEnded || !strings.Contains(errs, "no longer held") || !strings.Contains(errs, "SIGKILL") {
		t.Fatalf("exit %d (%s), want %d after SIGKILL", code, errs, exitLeaseEnded)
	}
	if n := keeps.Load(); n != 1 || strings.Contains(errs, "SIGTERM") {
		t.Fatalf("killed after %d renewals (%s): the first one said the lock was gone", n, errs)
	}
}

// Renewals that get no answer leave the validity the lock was granted
// with: the command is signalled by that lease, not kept running on
// renewals nobody confirmed.
func TestExecUnconfirmedRenewalsDoNotExtendTheLease(t *testing.T) {
	addr, keeps := keepServer(t, func(*lockdtest.Conn, *codec.Request) {})
	code, _, errs := ctl{}.run("exec", "--addr", addr, "--lease", "3s", "--grace", "1s", "k", "--", "sleep", "60")
	if code != exitLeaseEnded || !strings.Contains(errs, "SIGTERM") {
		t.Fatalf("exit %d (%s), want %d after SIGTERM", code, errs, exitLeaseEnded)
	}
	if keeps.Load() == 0 {
		t.Fatalf("no renewal went out before SIGTERM: nothing unconfirmed was tested (%s)", errs)
	}
	// The end of the granted lease brings SIGKILL: a command gone before
	// it was signalled before that lease ended.
	if strings.Contains(errs, "SIGKILL") {
		t.Fatalf("the command outlived the lease it was granted with: %s", errs)
	}
}
