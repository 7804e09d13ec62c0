package raftnet

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/lni/dragonboat/v4"
	"github.com/lni/dragonboat/v4/raftio"
	pb "github.com/lni/dragonboat/v4/raftpb"
	"github.com/lockd/lockd/internal/loopback"
)

// granted reports whether c's grant has come, without waiting.
func granted(c *budgetClaim) bool {
	select {
	case <-c.granted:
		return true
	default:
		return false
	}
}

func checkBudget(t *testing.T, b *FrameBudget, wantHeld, wantWaiting int) {
	t.Helper()
	if held, waiting := b.inUse(); held != wantHeld || waiting != wantWaiting {
		t.Fatalf("budget holds %d with %d waiting, want %d with %d", held, waiting, wantHeld, wantWaiting)
	}
}

// A claim past what is left waits, allocating nothing, until enough is
// given back; claims are granted in their order of arrival.
func TestFrameBudgetClaimWaitsForWhatIsGivenBack(t *testing.T) {
	b := newFrameBudget(100, 100)
	first := b.enqueue(60, false)
	second := b.enqueue(50, false)
	third := b.enqueue(10, false)
	if !granted(first) || granted(second) || granted(third) {
		t.Fatalf("granted: %v %v %v, want only the first (60 of 100); the third waits behind the second", granted(first), granted(second), granted(third))
	}
	checkBudget(t, b, 60, 2)
	b.release(first)
	if !granted(second) || !granted(third) {
		t.Fatal("the claims behind were not granted once the first was given back")
	}
	checkBudget(t, b, 60, 0)
	b.release(second)
	b.release(third)
	checkBudget(t, b, 0, 0)
}

// Guests hold at most their share; what is left is members' alone, and a
// member's claim is granted from it while guests wait.
func TestFrameBudgetKeepsMembersPartFromGuests(t *testing.T) {
	b := newFrameBudget(100, 60)
	guest := b.enqueue(60, false)
	another := b.enqueue(10, false)
	if !granted(guest) || granted(another) {
		t.Fatal("guests were granted past their share of 60")
	}
	member := b.enqueue(40, true)
	if !granted(member) {
		t.Fatal("a member's claim waited while the members' part (40) was free")
	}
	checkBudget(t, b, 100, 1)
	b.release(member)
	if granted(another) {
		t.Fatal("a guest was granted out of the members' part")
	}
	b.release(guest)
	if !granted(another) {
		t.Fatal("a guest was not granted once the guests' share had room")
	}
	b.release(another)
	checkBudget(t, b, 0, 0)
}

// A member's claim that does not fit goes before every guest's: guests
// arriving after it, even ones that would fit, wait until it is granted,
// so the guests' grants drain to it.
func TestFrameBudgetMemberGoesBeforeGuests(t *testing.T) {
	b := newFrameBudget(100, 100)
	guest := b.enqueue(80, false)
	member := b.enqueue(50, true)
	late := b.enqueue(10, false)
	if granted(member) || granted(late) {
		t.Fatalf("member granted %v, late guest granted %v with 20 free; want neither (the guest's 10 would fit, but the member waits)", granted(member), granted(late))
	}
	b.release(guest)
	if !granted(member) || !granted(late) {
		t.Fatal("the member and then the late guest were not granted once the first guest was done")
	}
	b.release(member)
	b.release(late)
	checkBudget(t, b, 0, 0)
}

// A claim whose deadline passes, or whose transport closes, leaves its
// queue and lets the claims behind it through; a grant that raced with
// the deadline is given back.
func TestFrameBudgetWaitEndsAtItsDeadline(t *testing.T) {
	b := newFrameBudget(100, 100)
	holder := b.enqueue(70, false)
	waiter := b.enqueue(50, false)
	behind := b.enqueue(30, false)
	expire := make(chan time.Time, 1)
	done := make(chan error, 1)
	go func() { done <- b.wait(waiter, nil, expire) }()
	if granted(behind) {
		t.Fatal("a claim of 30 passed the claim of 50 ahead of it")
	}
	expire <- time.Now()
	if err := <-done; !errors.Is(err, errBudgetExpired) {
		t.Fatalf("expired claim: %v, want errBudgetExpired", err)
	}
	if !granted(behind) {
		t.Fatal("the claim behind the expired one was not granted")
	}
	b.release(behind)

	member := b.enqueue(50, true)
	stop := make(chan struct{})
	go func() { done <- b.wait(member, stop, nil) }()
	close(stop)
	if err := <-done; !errors.Is(err, errBudgetStopped) {
		t.Fatalf("claim of a closed transport: %v, want errBudgetStopped", err)
	}
	checkBudget(t, b, 70, 0)

	raced := b.enqueue(10, false)
	if !granted(raced) {
		t.Fatal("a claim of 10 with 30 free waited")
	}
	b.withdraw(raced) // granted, then its reader gave up: the grant comes back
	if err := b.wait(holder, nil, nil); err != nil {
		t.Fatalf("granted claim: %v", err)
	}
	b.release(holder)
	checkBudget(t, b, 0, 0)
}

// rawFrame opens a connection from 127.0.0.from to addr that sends a
// header declaring a frame of kind 'M' and n bytes, then the first sent
// bytes of its body.
func rawFrame(t *testing.T, from byte, addr string, n, sent int) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, from)}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	b := make([]byte, frameHeaderLen+sent)
	binary.BigEndian.PutUint16(b, frameMagic)
	b[2] = FrameMessages
	binary.BigEndian.PutUint32(b[3:], uint32(n))
	if _, err := c.Write(b); err != nil {
		t.Fatal(err)
	}
	return c
}

// A member's frame goes through while guests hold their whole share and
// more guests wait, whether its connection showed it is a member's by an
// earlier frame or comes from a member's host; every grant comes back once
// frames are handed over or their connections close mid-frame.
func TestRaftTransportMembersPassGuestsAndGrantsComeBack(t *testing.T) {
	sources := &Sources{}
	sources.view.Store(newSourcesView(time.Now(), []dragonboat.ShardInfo{{ShardID: 5, ReplicaID: 3,
		Replicas: map[uint64]string{1: "127.0.0.1:7001", 2: "127.0.0.2:7002"}}}))
	ln := loopback.Listeners(t, 1)[0]
	budget := newFrameBudget(3<<20, 2<<20)
	server, batches, _ := startTransportAt(t, Factory{Listener: ln, Sources: sources, Budget: budget}, ln.Addr().String(), true)
	client, _, _ := startTransport(t, true)
	conn, err := client.GetConnection(context.Background(), server.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	batch := func(entry int) pb.MessageBatch {
		m := pb.Message{Type: pb.Heartbeat, ShardID: 5, From: 1, To: 3, Term: 1}
		if entry > 0 {
			m.Type = pb.Replicate
			m.Entries = []pb.Entry{{Index: 1, Term: 1, Cmd: make([]byte, entry)}}
		}
		return pb.MessageBatch{DeploymentId: DeploymentID, BinVer: raftio.TransportBinVersion, SourceAddress: "127.0.0.1:7001", Requests: []pb.Message{m}}
	}
	if err := conn.SendMessageBatch(batch(0)); err != nil { // shows the connection is member 1's
		t.Fatal(err)
	}
	receive(t, batches)

	// 127.0.0.3 is no member's host; 127.0.0.1 is, which would make the
	// raw connections members'.
	guests := []net.Conn{rawFrame(t, 3, server.addr, 2<<20, 1000)}
	waitUntil(t, 10*time.Second, "a guest granted its share", func() bool {
		held, _ := budget.inUse()
		return held == 2<<20
	})
	guests = append(guests, rawFrame(t, 3, server.addr, 1<<20, 1000))
	waitUntil(t, 10*time.Second, "another guest waiting", func() bool {
		_, waiting := budget.inUse()
		return waiting == 1
	})
	if err := conn.SendMessageBatch(batch(900 << 10)); err != nil {
		t.Fatal(err)
	}
	if got := receive(t, batches); len(got.Requests[0].Entries) != 1 || len(got.Requests[0].Entries[0].Cmd) != 900<<10 {
		t.Fatalf("member's large batch arrived as %d messages", len(got.Requests))
	}
	waitUntil(t, 10*time.Second, "the member's grant given back", func() bool {
		held, waiting := budget.inUse()
		return held == 2<<20 && waiting == 1
	})
	fromMemberHost := rawFrame(t, 2, server.addr, 1<<20, 1000)
	waitUntil(t, 10*time.Second, "the frame from member 2's host granted", func() bool {
		held, waiting := budget.inUse()
		return held == 3<<20 && waiting == 1
	})
	guests = append(guests, fromMemberHost)
	for _, g := range guests {
		g.Close()
	}
	waitUntil(t, 10*time.Second, "the guests' connections closed by the node", func() bool {
		server.mu.Lock()
		defer server.mu.Unlock()
		return len(server.conns) == 1
	})
	checkBudget(t, budget, 0, 0)
}
