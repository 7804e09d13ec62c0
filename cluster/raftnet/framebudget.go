package raftnet

// This file owns the node-wide budget for the bodies of the Raft frames
// the transport reads at once (frameBudget). A frame's body is held whole
// until it is handed over, and without a bound on their sum twenty
// connections that each send a 72 MiB frame grow a node by more than
// 1.4 GiB, which anyone who reaches a plain TCP Raft port can do.
//
// A frame whose body is at most frameReadStep is read without the budget:
// heartbeats, votes and the replicate messages of ordinary lock traffic
// are that small, so they never wait, and maxRaftConns connections hold
// at most maxRaftConns×frameReadStep of them. A larger frame claims its
// whole length once its header is in, and its reader waits, reading
// nothing, until the budget grants it; only then is its buffer mapped.
// A claim waits no longer than its sender's own write deadline
// (WriteTimeout plus the length at raftWriteMinRate, from the
// header's arrival): past that the sender has given up on the frame.
// Once granted, the body's bytes must keep arriving at raftWriteMinRate
// (serve's readBody), so a peer that declares a frame and then goes
// silent gives its grant back after WriteTimeout, and one that
// trickles at the lowest rate allowed holds it for at most the frame's
// write deadline.
//
// Members are never starved by others. A connection is a member's from
// its start when it comes over mutual TLS (the cluster's CA signed its
// certificate) or from the host of a member's recorded Raft address, and
// once a frame it sent came from members of the groups at their recorded
// addresses (raft_sources.go); until then it is a guest, and so is every
// connection from elsewhere: an attacker must run on a member's host, or
// hold a certificate, to be more. Guests together hold at most
// guestShare of the budget; the rest is members' alone. Claims wait in
// two queues, first come first served in each, and a member's claim at
// the head of its queue goes before every guest's: while it waits, no
// guest is granted anything, so the guests' grants drain (each within
// its deadline) until it fits. On a plain TCP Raft port someone who can
// forge a member's frame (raft_sources.go) can also become a member
// here, and on a loopback cluster every local process is on a member's
// host; mutual TLS closes both.

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

const (
	// DefaultFrameBudget is a node's default budget: the guests'
	// share, one frame of the largest size (a peer's first frame on a new
	// connection may be a guest's, and must be admitted whole), and
	// 56 MiB that only members use, room for a follower's catch-up batch
	// of tens of MiB or 28 snapshot chunks (dragonboat's are 2 MiB)
	// while guests hold their whole share. A flood from outside the
	// membership thus grows a node by the guests' share, and all frames
	// together by the budget (the cluster package's
	// TestProcessesFrameFloodStaysWithinTheBudget floods a node with 20
	// frames of the largest size; docs/cluster.md has its figures).
	DefaultFrameBudget = 128 << 20
	// MinFrameBudget keeps the members' part at least 8 MiB.
	MinFrameBudget = MaxFrame + 8<<20
	// guestShare is the most that guests' frames hold together.
	guestShare = MaxFrame
	// budgetReadStep is how much of a granted body is read under one
	// read deadline (readBody).
	budgetReadStep = 1 << 20
)

var (
	errBudgetExpired = errors.New("cluster: raft frame waited past its write deadline for the frame budget")
	errBudgetStopped = errors.New("cluster: raft transport closed while a frame waited for the frame budget")
)

// frameBudget is the node-wide budget for frame bodies in flight.
type FrameBudget struct {
	mu         sync.Mutex
	total      int
	guestShare int
	held       int // granted, all claims
	guestsHeld int // granted, guests' claims
	members    []*budgetClaim
	guests     []*budgetClaim
}

// budgetClaim is one frame's claim on the budget; granted is closed once
// it is granted.
type budgetClaim struct {
	n       int
	member  bool
	granted chan struct{}
	body    []byte // mapped by mapBody, unmapped by release
}

// mapBody maps the buffer of a granted claim's body. It lives outside Go's
// heap and is unmapped when the claim is released, so the budget bounds
// what the node holds for frame bodies, not Go's collector, which lets the
// heap grow to twice what is live: with heap buffers, a flood within the
// guests' 72 MiB share grew a node by 216 MiB. The transport hands
// dragonboat only what Unmarshal copied out of a body.
func (c *budgetClaim) mapBody() ([]byte, error) {
	body, err := unix.Mmap(-1, 0, c.n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON)
	if err != nil {
		return nil, fmt.Errorf("cluster: map a raft frame body of %d bytes: %w", c.n, err)
	}
	c.body = body
	return body, nil
}

// NewFrameBudget is a budget of total bytes (at least MinFrameBudget),
// of which guests hold at most guestShare together.
func NewFrameBudget(total int) *FrameBudget { return newFrameBudget(total, guestShare) }

// newFrameBudget is a budget of total bytes, of which guests hold at most
// guests together. A claim must fit both: serve claims at most MaxFrame,
// which MinFrameBudget and guestShare admit.

func newFrameBudget(total, guests int) *FrameBudget {
	return &FrameBudget{total: total, guestShare: min(guests, total)}
}

// wait waits until c is granted, expire fires or stop closes; a nil
// error is a grant that release must give back.
func (b *FrameBudget) wait(c *budgetClaim, stop <-chan struct{}, expire <-chan time.Time) error {
	var err error
	select {
	case <-c.granted:
		return nil
	case <-stop:
		err = errBudgetStopped
	case <-expire:
		err = errBudgetExpired
	}
	b.withdraw(c)
	return err
}

// enqueue files a claim and grants what now fits, without waiting.
func (b *FrameBudget) enqueue(n int, member bool) *budgetClaim {
	c := &budgetClaim{n: n, member: member, granted: make(chan struct{})}
	b.mu.Lock()
	defer b.mu.Unlock()
	if member {
		b.members = append(b.members, c)
	} else {
		b.guests = append(b.guests, c)
	}
	b.grant()
	return c
}

// withdraw takes back a claim its reader no longer waits for: granted in
// the meantime, its bytes are given back; still queued, it leaves its
// queue, which may let the claims behind it through.
func (b *FrameBudget) withdraw(c *budgetClaim) {
	b.mu.Lock()
	defer b.mu.Unlock()
	select {
	case <-c.granted:
		b.giveBack(c)
		return
	default:
	}
	if c.member {
		b.members = slices.DeleteFunc(b.members, func(q *budgetClaim) bool { return q == c })
	} else {
		b.guests = slices.DeleteFunc(b.guests, func(q *budgetClaim) bool { return q == c })
	}
	b.grant()
}

// release gives back a granted claim's bytes, once its frame is handed
// over or its connection is given up.
func (b *FrameBudget) release(c *budgetClaim) {
	if c.body != nil {
		_ = unix.Munmap(c.body) // fails only on a range that was never mapped
		c.body = nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.giveBack(c)
}

func (b *FrameBudget) giveBack(c *budgetClaim) {
	b.held -= c.n
	if !c.member {
		b.guestsHeld -= c.n
	}
	b.grant()
}

// grant grants the claims at the queues' heads that fit, members' first;
// a member's claim that does not fit stops every grant until it does.
func (b *FrameBudget) grant() {
	for {
		if len(b.members) > 0 {
			c := b.members[0]
			if b.held+c.n > b.total {
				return
			}
			b.members = b.members[1:]
			b.held += c.n
			close(c.granted)
			continue
		}
		if len(b.guests) == 0 {
			return
		}
		c := b.guests[0]
		if b.held+c.n > b.total || b.guestsHeld+c.n > b.guestShare {
			return
		}
		b.guests = b.guests[1:]
		b.held += c.n
		b.guestsHeld += c.n
		close(c.granted)
	}
}

// inUse reports the bytes granted and the claims waiting.
func (b *FrameBudget) inUse() (held, waiting int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.held, len(b.members) + len(b.guests)
}

// fromMemberHost reports whether ip is the host of a member's Raft address
// in the latest reading of the memberships; a member recorded by host name
// is not matched.
func (s *Sources) fromMemberHost(ip net.IP) bool {
	v := s.view.Load()
	if v == nil || ip == nil {
		return false
	}
	for addr := range v.memberAt {
		if host, _, err := net.SplitHostPort(addr); err == nil && ip.Equal(net.ParseIP(host)) {
			return true
		}
	}
	return false
}
