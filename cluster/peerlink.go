package cluster

// This file owns the node's own messages to its peers, in frames of kind
// 'L' on their Raft ports: the hold a draining leader asks for and the
// send-again nudge of a leader whose hand-over was given up (proposer.go),
// and the statements of log formats
// (version.go), with their dispatch on the receiving side; dragonboat's
// message streams are its own and carry nothing else.

import (
	"bufio"
	"context"
	"net"
	"sync"

	"github.com/lni/dragonboat/v4"
	"github.com/lockd/lockd/cluster/raftnet"
)

// peerLinks is one link per peer this node has sent messages to.
type peerLinks struct {
	n     *Node
	mu    sync.Mutex
	links map[uint64]*peerLink
}

// peerLink sends messages to one peer and reads its answers. A message
// lost with a broken connection is lost: a send-again only hastens what
// the follower's attempt timeout does anyway, so the link only keeps what
// it has not written yet.
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
	l.out = raftnet.AppendFrame(l.out, raftnet.FrameLockd, b)
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// run writes what is queued, dialing when it has no connection; a
// failed dial or write drops what it held.
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
		if err := raftnet.WriteWithin(conn, frames, raftnet.WriteTimeout); err != nil {
			conn.Close()
			<-readerDone
			conn = nil
		}
	}
}

func (l *peerLink) dial(ctx context.Context) (net.Conn, error) {
	addr := l.n.peerAddr(l.peer)
	if addr == "" {
		return nil, raftnet.ErrUnknownPeer
	}
	ctx, cancel := context.WithTimeout(ctx, raftnet.DialTimeout)
	defer cancel()
	return raftnet.Dial(ctx, l.n.cfg.RaftTLS, l.n.log, addr)
}

// read hands the answers the peer writes back to the node, until the
// connection closes.
func (l *peerLink) read(conn net.Conn) {
	r := bufio.NewReaderSize(conn, 4096)
	var buf []byte
	for {
		kind, body, err := raftnet.ReadFrame(r, buf)
		if err != nil {
			return
		}
		if kind == raftnet.FrameLockd {
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

// replySink answers a peer's message on the connection it came by.
type replySink interface{ reply(b []byte) }

// replyFunc is the transport's reply on a connection a peer opened.
type replyFunc func(b []byte)

func (f replyFunc) reply(b []byte) { f(b) }

// onServedFrame takes a frame of kind 'L' that came on a connection the
// peer opened, answered through the transport's reply.
func (n *Node) onServedFrame(body []byte, reply func(b []byte)) {
	n.onPeerFrame(body, replyFunc(reply))
}

// onPeerFrame dispatches a frame of kind 'L' from a peer: a format
// statement (answered through sink when the peer opened the connection)
// or a send-again. A kind this build does not know is ignored.
func (n *Node) onPeerFrame(body []byte, sink replySink) {
	if len(body) == 0 {
		return
	}
	switch kind, b := body[0], body[1:]; kind {
	case peerFormat:
		n.onStatement(b, sink)
	case peerSendAgain:
		if sink != nil { // a request on this node's own link answers nobody
			n.onSendAgain(b)
		}
	case peerHold:
		if sink != nil {
			n.onHold(b)
		}
	}
}
