package bench

import (
	"bytes"
	"context"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"testing"
	"time"
)

// echoServer answers every connection with what it reads, until closed.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(c, c); c.Close() }()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return ln.Addr().String()
}

// A relay with a delay: 1 MiB through it and back arrives whole and in
// order although each read is held for its own jittered time, and a
// round trip takes at least the delay each way; a relay whose target is
// down closes what it accepted; close leaves no goroutine behind
// (TestMain's goleak).
func TestDelayRelay(t *testing.T) {
	const delay, jitter = 40 * time.Millisecond, 30 * time.Millisecond
	r, err := startDelayRelay("127.0.0.1:0", echoServer(t), delay, jitter, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer r.close()
	c, err := net.Dial("tcp", r.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sent := make([]byte, 1<<20)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range sent {
		sent[i] = byte(rng.Uint32())
	}
	start := time.Now()
	go func() {
		for b := sent; len(b) > 0; b = b[min(len(b), 4096):] {
			if _, err := c.Write(b[:min(len(b), 4096)]); err != nil {
				return
			}
		}
	}()
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	got := make([]byte, len(sent))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatalf("reading back through the relay: %v", err)
	}
	if !bytes.Equal(got, sent) {
		t.Fatal("the bytes came back changed or out of order")
	}
	if rtt := time.Since(start); rtt < 2*(delay-jitter) {
		t.Fatalf("1 MiB there and back in %v, under the %v the delay takes each way", rtt, delay-jitter)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := ln.Addr().String()
	ln.Close()
	dead, err := startDelayRelay("127.0.0.1:0", down, delay, 0, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer dead.close()
	d, err := net.Dial("tcp", dead.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	_ = d.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := d.Read(make([]byte, 1)); err == nil || strings.Contains(err.Error(), "timeout") {
		t.Fatalf("a relay to a port nobody listens on: read %d bytes, %v; want the connection closed", n, err)
	}
}

// The failover workload with every peer link delayed, and the nodes given
// a Raft tick to match (NodeFlags): the nodes know each other only at
// their relays' addresses (lockd binding its Raft port with
// --raft-listen), so a cluster that elects a leader and grants on both
// sides of a SIGSTOP of its leader talks through them; the report says
// so.
func TestFailoverPeerDelay(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster: skipped in -short mode")
	}
	dir := t.TempDir()
	bin := buildLockd(t, dir)
	cfg := FailoverConfig{
		System: FailoverLockd, Bin: bin, Fault: FaultStop, Victim: VictimLeader,
		Duration: 7 * time.Second, FaultAt: 2 * time.Second, Frozen: time.Second,
		Callers: 6, Lease: 2 * time.Second, Wait: time.Second, Dir: dir,
		PeerDelay: 100 * time.Millisecond, PeerJitter: 20 * time.Millisecond,
		NodeFlags: []string{"--rtt-ms", "200"}, // a Raft tick about the round trip
	}
	res, err := RunFailover(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	f := res.Failover
	if f.GrantsPerSBefore == 0 || f.GrantsPerSAfter == 0 || f.PeerDelayS != 0.1 || f.PeerJitterS != 0.02 {
		t.Errorf("grants/s %g before the fault, %g after, peer delay %gs ± %gs: want grants on both sides and the delay reported",
			f.GrantsPerSBefore, f.GrantsPerSAfter, f.PeerDelayS, f.PeerJitterS)
	}
	var text bytes.Buffer
	WriteTable(&text, []*Result{res})
	if want := "peer links delayed 100ms ± 20ms each way"; !strings.Contains(text.String(), want) || !strings.Contains(res.Target, want) {
		t.Errorf("the report does not say %q:\n%s", want, text.String())
	}
	t.Logf("SIGSTOP of the leader with peer links delayed: longest gap %.2fs, grants/s %.0f → %.0f", f.LongestGapS, f.GrantsPerSBefore, f.GrantsPerSAfter)
}
