package cluster

// This file owns the node's own connections to its peers' Raft ports,
// which carry grant claims to a group's leader and witness requests and
// queries to its members, and their answers back (frames of kind 'L',
// claims.go and witness.go); dragonboat's message streams are its own
// and carry nothing else.

import (
	"bufio"
	"context"
	"crypto/tls"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/lni/dragonboat/v4"
	"golang.org/x/sys/unix"
)

// peerLinks is one link per peer this node has sent messages to.
type peerLinks struct {
	n     *Node
	mu    sync.Mutex
	links map[uint64]*peerLink
}

// peerLink sends messages to one peer and reads its answers. A message
// lost with a broken connection is sent again by the expiry driver's pass
// (askClaims, revokeUnwitnessed), so the link only keeps what it has not
// written yet.
type peerLink struct {
	n    *Node
	peer uint64
	mu   sync.Mutex
	out  []byte // whole frames not written yet
	wake chan struct{}
}

// send queues the message b (kind | entries) for peer, in a frame of its
// own.
func (ls *peerLinks) send(peer uint64, b []byte) {
	ls.mu.Lock()
	l := ls.links[peer]
	if l == nil {
		if ls.n.ctx.Err() != nil {
			ls.mu.Unlock()
			return
		}
		if ls.links == nil {
			ls.links = make(map[uint64]*peerLink)
		}
		l = &peerLink{n: ls.n, peer: peer, wake: make(chan struct{}, 1)}
		ls.links[peer] = l
		ls.n.wg.Add(1)
		go func() { defer ls.n.wg.Done(); l.run(ls.n.ctx) }()
	}
	ls.mu.Unlock()
	l.mu.Lock()
	at := len(l.out)
	l.out = append(append(l.out, make([]byte, frameHeaderLen)...), b...)
	putFrameHeader(l.out[at:], frameLockd, l.out[at+frameHeaderLen:])
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// run writes what is queued, dialing when it has no connection; a
// failed dial or write drops what it held (asked again later).
func (l *peerLink) run(ctx context.Context) {
	var conn net.Conn
	var readerDone chan struct{}
	defer func() {
		if conn != nil {
			conn.Close()
			<-readerDone
		}
	}()
	var frames []byte
	for {
		select {
		case <-ctx.Done():
			return
		case <-l.wake:
		}
		l.mu.Lock()
		frames = append(frames[:0], l.out...)
		l.out = l.out[:0]
		l.mu.Unlock()
		if len(frames) == 0 {
			continue
		}
		if conn == nil {
			var err error
			if conn, err = l.dial(ctx); err != nil {
				l.n.log.Debug().Err(err).Uint64("peer", l.peer).Msg("peer link: dial failed")
				conn = nil
				continue
			}
			readerDone = make(chan struct{})
			go func(c net.Conn) { defer close(readerDone); l.read(c) }(conn)
		}
		if err := writeWithin(conn, frames, raftWriteTimeout); err != nil {
			conn.Close()
			<-readerDone
			conn = nil
		}
	}
}

func (l *peerLink) dial(ctx context.Context) (net.Conn, error) {
	addr := l.n.peerAddr(l.peer)
	if addr == "" {
		return nil, errUnknownPeer
	}
	ctx, cancel := context.WithTimeout(ctx, raftDialTimeout)
	defer cancel()
	return dialRaft(ctx, l.n.cfg.RaftTLS, l.n.log, addr)
}

// read hands the answers the peer writes back to the node, until the
// connection closes.
func (l *peerLink) read(conn net.Conn) {
	r := bufio.NewReaderSize(conn, 4096)
	var buf []byte
	for {
		kind, body, err := readFrame(r, buf)
		if err != nil {
			return
		}
		if kind == frameLockd {
			l.n.onPeerFrame(body, nil)
		}
		buf = body[:0]
	}
}

// peerAddr is peer's Raft address: from --peers, or from the groups'
// membership as this node last applied it (a node added later).
func (n *Node) peerAddr(peer uint64) string {
	if addr, ok := n.cfg.Peers[peer]; ok {
		return addr
	}
	info := n.nh.GetNodeHostInfo(dragonboat.NodeHostInfoOption{SkipLogInfo: true})
	if info == nil {
		return ""
	}
	for _, s := range info.ShardInfoList {
		if addr, ok := s.Replicas[peer]; ok {
			return addr
		}
	}
	return ""
}

// servedSink answers claims on the connection they came by (the
// accepting side of a link). Its writes, from the transport's reader and
// from the apply goroutine (parked claims), are serialized, and short:
// a verdict is a few dozen bytes, and a peer that does not read them
// within verdictWriteTimeout loses the connection (it asks again on a
// new one) rather than stall this node's applies.
type servedSink struct {
	mu   sync.Mutex
	conn net.Conn
}

const verdictWriteTimeout = 200 * time.Millisecond

func (s *servedSink) sendVerdicts(b []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if writeFrame(s.conn, frameLockd, b, verdictWriteTimeout) != nil {
		s.conn.Close()
	}
}

// peerGone reports whether the peer closed the connection or reset it.
// A node killed just after it sent a claim or a witness request is read
// here after its death, and a verdict for it reaches nobody: accepting
// it would leave a grant nobody delivers until its lease ends.
func (s *servedSink) peerGone() bool { return connClosedByPeer(s.conn) }

// connClosedByPeer reports whether conn's peer has closed or reset it, by
// peeking at its socket without blocking and without taking anything
// from it: a read of zero bytes is the peer's FIN, an error other than
// "would block" a reset. Data still to read counts as open.
func connClosedByPeer(conn net.Conn) bool {
	if tc, ok := conn.(*tls.Conn); ok {
		conn = tc.NetConn()
	}
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return true
	}
	gone := false
	var b [1]byte
	if err := rc.Control(func(fd uintptr) {
		n, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		gone = err == nil && n == 0 || err != nil && err != unix.EAGAIN && err != unix.EINTR
	}); err != nil {
		return true // closed on this side
	}
	return gone
}

// writeFrame writes one frame of kind with payload within timeout.
func writeFrame(conn net.Conn, kind byte, payload []byte, timeout time.Duration) error {
	b := make([]byte, frameHeaderLen+len(payload))
	putFrameHeader(b, kind, payload)
	copy(b[frameHeaderLen:], payload)
	return writeWithin(conn, b, timeout)
}
