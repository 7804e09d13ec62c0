package main

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/lockd/lockd/client"
	"github.com/lockd/lockd/client/lockdtest"
	"github.com/lockd/lockd/codec"
)

// With keep-alive (the default) a command three times longer than the
// lease runs to its end and exits 0, and the lock is still held past the
// lease it was granted with.
func TestExecKeepsTheLockForAJobThreeTimesItsLease(t *testing.T) {
	addr := startServer(t, nil)
	const lease = 2 * time.Second
	stdin, feed := io.Pipe()
	var out, errs syncBuffer
	done := make(chan int, 1)
	start := time.Now()
	go func() {
		done <- run(context.Background(),
			[]string{"exec", "--addr", addr, "--lease", "2s", "--grace", "500ms", "k", "--",
				"sh", "-c", `sleep 3; echo past-the-lease; read line; sleep 3`},
			func(string) (string, bool) { return "", false }, proc{in: stdin, out: &out, err: &errs})
	}()
	for !strings.Contains(out.String(), "past-the-lease") {
		select {
		case code := <-done:
			t.Fatalf("exec ended (%d: %s) before the command got past its lease", code, errs.String())
		case <-time.After(10 * time.Millisecond):
		}
	}
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
	if elapsed := time.Since(start); elapsed < 3*lease {
		t.Fatalf("the command ran %v, less than three leases", elapsed)
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
	start := time.Now()
	code, _, errs := ctl{}.run("exec", "--addr", addr, "--keepalive=false", "--lease", "2s", "--grace", "500ms", "k", "--", "sleep", "6")
	if code != exitLeaseEnded || !strings.Contains(errs, "SIGTERM") {
		t.Fatalf("exit %d (%s), want %d after SIGTERM", code, errs, exitLeaseEnded)
	}
	if elapsed := time.Since(start); elapsed > 2*time.Second {
		t.Fatalf("SIGTERM came after %v, past the 2 s lease", elapsed)
	}
}

// keepServer grants every acquire token 1, answers every KEEP with keep,
// and every release RELEASED.
func keepServer(t *testing.T, keep func(c *lockdtest.Conn, req *codec.Request)) string {
	t.Helper()
	srv, err := lockdtest.Start(func(c *lockdtest.Conn) {
		if c.Handshake(nil) != nil {
			return
		}
		c.Serve(func(c *lockdtest.Conn, req *codec.Request) {
			switch req.Op {
			case codec.OpAcquire:
				c.QueueAcquired(req.Owner, 1, 0)
			case codec.OpKeep:
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
	return srv.Addr()
}

// A renewal answered NOT HELD means the lock is gone: the command is
// killed at once, long before the lease it had.
func TestExecKillsTheCommandWhenARenewalIsNotHeld(t *testing.T) {
	addr := keepServer(t, func(c *lockdtest.Conn, req *codec.Request) { c.QueueReply(codec.OpNotHeld, req.Owner) })
	start := time.Now()
	code, _, errs := ctl{}.run("exec", "--addr", addr, "--lease", "30s", "k", "--", "sleep", "60")
	if code != exitLeaseEnded || !strings.Contains(errs, "no longer held") || !strings.Contains(errs, "SIGKILL") {
		t.Fatalf("exit %d (%s), want %d after SIGKILL", code, errs, exitLeaseEnded)
	}
	if elapsed := time.Since(start); elapsed > 20*time.Second {
		t.Fatalf("killed after %v: the first renewal (at 10 s) said the lock was gone", elapsed)
	}
}

// Renewals that get no answer leave the validity the lock was granted
// with: the command is signalled by that lease, not kept running on
// renewals nobody confirmed.
func TestExecUnconfirmedRenewalsDoNotExtendTheLease(t *testing.T) {
	addr := keepServer(t, func(*lockdtest.Conn, *codec.Request) {})
	start := time.Now()
	code, _, errs := ctl{}.run("exec", "--addr", addr, "--lease", "3s", "--grace", "1s", "k", "--", "sleep", "60")
	if code != exitLeaseEnded || !strings.Contains(errs, "SIGTERM") {
		t.Fatalf("exit %d (%s), want %d after SIGTERM", code, errs, exitLeaseEnded)
	}
	if elapsed := time.Since(start); elapsed > 3*time.Second {
		t.Fatalf("SIGTERM came after %v, past the 3 s lease", elapsed)
	}
}
