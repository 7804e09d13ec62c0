package raftnet

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	_ "unsafe" // go:linkname, for dragonboat's number of streams per peer

	"github.com/lni/dragonboat/v4/config"
	"github.com/lni/dragonboat/v4/raftio"
	pb "github.com/lni/dragonboat/v4/raftpb"
	"github.com/rs/zerolog"
)

// The Raft transport between nodes. Dragonboat's built-in TCP transport
// writes every message batch with three write calls (magic number, header,
// payload) and reads it with three or more. A proposal moves four to seven
// batches (forward, replicate, acknowledge, commit notice), and on a
// virtual machine each system call and each wake-up of the reading side
// costs tens of microseconds, a large share of a leader's CPU time at low
// load. This transport sends a batch as one frame in one write and reads
// through a buffer. Dragonboat above it still checks the deployment id
// and binary version of every batch, batches messages per target and
// reconnects.
//
// A frame is
//
//	magic u16 (0x4c52, "LR") | kind u8 | length u32 | CRC-32C u32 of the payload | payload
//
// with kind 'M' (FrameMessages, a raftpb.MessageBatch), 'C' (FrameChunk,
// a raftpb.Chunk of a snapshot) or 'L' (FrameLockd: lockd's own messages
// between nodes, format statements and send-agains, which the cluster
// package's peerlink.go reads). The checksum is there because Raft does
// not check what an entry holds: one flipped bit that TCP's own checksum
// missed would be stored and applied by one replica only, and its lock
// table would no longer be the others'. A peer speaking anything else, or
// a frame that fails its checksum, is disconnected, so nodes of a build
// with another transport cannot join (all nodes must run the same build).
const (
	// DeploymentID is the dragonboat deployment id of every lockd node;
	// frames of another are refused (checkOrigin).
	DeploymentID   = 0x6c6f636b64 // "lockd"
	frameMagic     = 0x4c52
	frameHeaderLen = 2 + 1 + 4 + 4
	FrameMessages  = 'M'
	FrameChunk     = 'C'
	FrameLockd     = 'L'
	// MaxFrame bounds a frame: dragonboat's largest message batch (64 MiB)
	// and some room. A frame past frameReadStep is read into a buffer
	// mapped only once the node's frame budget grants its length
	// (framebudget.go): a header alone cannot make this node allocate past
	// the budget.
	MaxFrame      = 72 << 20
	frameReadStep = 64 << 10
	// A connection's first frame must arrive within DialTimeout, as a
	// TLS handshake must; once a frame's header is in, the rest must
	// arrive at raftWriteMinRate, as its sender writes it. Between frames
	// of a peer that has shown it is a member there is no deadline: a
	// stream between two followers carries nothing until an election, and
	// a vote request lost on a stream closed for idling would delay the
	// election (TCP keep-alive finds a peer that is gone).
	// maxRaftConns and maxRaftConnsPerHost bound the accepted connections:
	// a node keeps one message stream to each peer, and a snapshot stream
	// while one is sent; past these, a connection is closed at once.
	maxRaftConns        = 256
	maxRaftConnsPerHost = 16
	// A frame's write may take WriteTimeout plus its length at
	// raftWriteMinRate; past that the peer is taken to have stopped
	// reading, and dragonboat's sender reconnects.
	WriteTimeout     = 5 * time.Second
	raftWriteMinRate = 1 << 20 // bytes per second
	DialTimeout      = 5 * time.Second
	// acceptRetryMax caps the pause after a failed Accept (say, out of
	// file descriptors); the transport keeps accepting until closed.
	acceptRetryMax = time.Second
)

var (
	errBadFrame    = errors.New("cluster: bad raft frame")
	ErrUnknownPeer = errors.New("cluster: no Raft address known for the peer")
	castagnoliCRC  = crc32.MakeTable(crc32.Castagnoli)
)

// dragonboatStreams is how many message streams dragonboat keeps to each
// peer, each a send queue, a sender goroutine and a connection; it spreads
// the groups over them by shard id. Its default, 4, comes from dragonboat's
// soft settings, which only a JSON file in the process's working directory
// can change (its internal/settings package), so lockd sets the variable
// those settings were copied into, before any NodeHost starts.
//
//go:linkname dragonboatStreams github.com/lni/dragonboat/v4.streamConnections
var dragonboatStreams uint64

// One stream per peer: the messages of all the groups bound for a peer go
// out in one batch, one frame and one write, and the peer reads them with
// one wake-up. With a stream per group, three groups led by one node send
// three frames per peer where one does, at every heartbeat and under load
// alike (docs/cluster.md, Performance, has the paired runs). A group's
// messages still keep their order: they share one queue.
func init() { dragonboatStreams = 1 }

// Factory plugs the transport into a NodeHost. With TLS (LoadTLS) every
// connection is mutual TLS: a peer whose certificate the CA did not sign
// is refused at the handshake, before a frame, and a peer's certificate
// must name the host of the source address its frames give.
type Factory struct {
	Log zerolog.Logger
	TLS *tls.Config
	// Sources checks where each frame comes from (raft_sources.go); nil
	// only in tests of the framing.
	Sources *Sources
	// Heard, when set, is told of every peer a message batch came from
	// (the node's liveness record).
	Heard func(replica uint64)
	// FramesSent, when set, counts the message frames written to peers:
	// each is one network hop, which is what a commit's latency is made of.
	FramesSent *atomic.Uint64
	// StreamsOpened, when set, counts the message connections dialed,
	// redials included: one per peer while the links hold.
	StreamsOpened *atomic.Uint64
	// OnPeer, when set, takes the frames of kind FrameLockd, with a reply
	// that answers on the connection the frame came by.
	OnPeer func(body []byte, reply func(b []byte))
	// Listener, when set, is the bound port to serve.
	Listener net.Listener
	// Budget bounds the frame bodies read at once (framebudget.go); nil:
	// one of DefaultFrameBudget.
	Budget *FrameBudget
}

func (f Factory) Create(nhc config.NodeHostConfig, mh raftio.MessageHandler, ch raftio.ChunkHandler) raftio.ITransport {
	onMessages := mh
	if f.Heard != nil {
		onMessages = func(mb pb.MessageBatch) {
			for i := range mb.Requests {
				f.Heard(mb.Requests[i].From)
			}
			mh(mb)
		}
	}
	return &raftTransport{addr: nhc.GetListenAddress(), bound: f.Listener, log: f.Log, tls: f.TLS, sources: f.Sources, onMessages: onMessages, onChunk: ch, onPeer: f.OnPeer,
		framesSent: f.FramesSent, streamsOpened: f.StreamsOpened, conns: make(map[net.Conn]struct{}), perHost: make(map[string]int),
		done: make(chan struct{}), budget: f.frameBudget()}
}

func (f Factory) frameBudget() *FrameBudget {
	if f.Budget != nil {
		return f.Budget
	}
	return NewFrameBudget(DefaultFrameBudget)
}

func (Factory) Validate(addr string) bool { return validRaftAddr(addr) }

// raftTransport is one NodeHost's listener and dialer.
type raftTransport struct {
	addr          string
	bound         net.Listener // nil: Start listens on addr
	log           zerolog.Logger
	tls           *tls.Config // nil: plain TCP
	sources       *Sources    // nil: frames unchecked
	onMessages    raftio.MessageHandler
	onChunk       raftio.ChunkHandler
	onPeer        func(body []byte, reply func(b []byte)) // nil: 'L' frames are ignored
	framesSent    *atomic.Uint64                          // nil: not counted
	streamsOpened *atomic.Uint64                          // nil: not counted
	budget        *FrameBudget

	mu      sync.Mutex
	ln      net.Listener
	conns   map[net.Conn]struct{} // accepted, open
	perHost map[string]int        // accepted, open, by the peer's IP
	closed  bool
	done    chan struct{} // closed by Close
	wg      sync.WaitGroup
}

func (t *raftTransport) Name() string {
	if t.tls != nil {
		return "lockd-raft-tls"
	}
	return "lockd-raft-tcp"
}

func (t *raftTransport) Start() error {
	ln := t.bound
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", t.addr); err != nil {
			return err
		}
	}
	if t.tls != nil {
		ln = tls.NewListener(ln, t.tls)
	}
	t.ln = ln
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		t.accept()
	}()
	return nil
}

func (t *raftTransport) accept() {
	var pause time.Duration
	for {
		conn, err := t.ln.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			// Without this loop the node would stop hearing its peers
			// until restarted.
			pause = min(max(2*pause, 5*time.Millisecond), acceptRetryMax)
			t.log.Error().Err(err).Dur("retry_in", pause).Msg("raft transport: accept failed")
			select {
			case <-t.done:
				return
			case <-time.After(pause):
			}
			continue
		}
		pause = 0
		host := remoteHost(conn)
		t.mu.Lock()
		if t.closed {
			t.mu.Unlock()
			conn.Close()
			return
		}
		if open := len(t.conns); open >= maxRaftConns || t.perHost[host] >= maxRaftConnsPerHost {
			t.mu.Unlock()
			t.log.Warn().Str("remote", conn.RemoteAddr().String()).Int("open", open).
				Msg("raft transport: connection refused, too many open")
			conn.Close()
			continue
		}
		t.conns[conn] = struct{}{}
		t.perHost[host]++
		t.wg.Add(1)
		t.mu.Unlock()
		go func() {
			defer t.wg.Done()
			t.serve(conn)
			t.mu.Lock()
			delete(t.conns, conn)
			if t.perHost[host]--; t.perHost[host] == 0 {
				delete(t.perHost, host)
			}
			t.mu.Unlock()
			conn.Close()
		}()
	}
}

// remoteHost is the IP a connection comes from.
func remoteHost(conn net.Conn) string {
	if a, ok := conn.RemoteAddr().(*net.TCPAddr); ok {
		return a.IP.String()
	}
	return conn.RemoteAddr().String()
}

// serve hands every frame a peer sends to dragonboat, until the peer
// closes, stalls, sends something else than a frame or a frame from
// outside the membership, or a snapshot is refused.
func (t *raftTransport) serve(conn net.Conn) {
	p := peerConn{t: t, conn: conn, remote: conn.RemoteAddr().String()}
	if tc, ok := conn.(*tls.Conn); ok {
		if !t.handshake(tc) {
			return
		}
		p.cert = tc.ConnectionState().PeerCertificates[0]
		p.member = true // the cluster's CA signed its certificate
	}
	if a, ok := conn.RemoteAddr().(*net.TCPAddr); ok && t.sources != nil && t.sources.fromMemberHost(a.IP) {
		p.member = true
	}
	r := bufio.NewReaderSize(conn, 64<<10)
	var small []byte // the buffer of frames up to frameReadStep, kept
	if conn.SetReadDeadline(time.Now().Add(DialTimeout)) != nil {
		return
	}
	for {
		h, err := readFrameHeader(r)
		if err != nil {
			if errors.Is(err, errBadFrame) {
				t.log.Warn().Err(err).Str("remote", p.remote).Msg("raft transport: peer dropped")
			}
			return
		}
		body, claim, err := p.readBody(r, h, small)
		if err != nil {
			if errors.Is(err, errBadFrame) || errors.Is(err, errBudgetExpired) {
				t.log.Warn().Err(err).Str("remote", p.remote).Bool("member", p.member).Msg("raft transport: peer dropped")
			}
			return
		}
		err = p.handle(h.kind, body)
		if claim != nil {
			t.budget.release(claim) // Unmarshal copied what it keeps
		} else {
			small = body[:0]
		}
		if err != nil {
			t.log.Warn().Err(err).Str("remote", p.remote).Msg("raft transport: peer dropped")
			return
		}
		if conn.SetReadDeadline(time.Time{}) != nil {
			return
		}
	}
}

// readBody reads the body of the frame whose header h was read: one of at
// most frameReadStep into small, a larger one into a buffer of its length
// mapped once the budget grants it (claim, which the caller releases once
// the frame is handed over). The whole frame must arrive within its
// sender's write deadline, counted from the header, and a granted body at
// raftWriteMinRate from its grant (framebudget.go).
func (p *peerConn) readBody(r io.Reader, h frameHeader, small []byte) (body []byte, claim *budgetClaim, err error) {
	arrived := time.Now()
	last := arrived.Add(WriteTimeout + time.Duration(h.n)*time.Second/raftWriteMinRate)
	if h.n <= frameReadStep {
		if err := p.conn.SetReadDeadline(last); err != nil {
			return nil, nil, err
		}
		body = slices.Grow(small[:0], h.n)[:h.n]
		if _, err := io.ReadFull(r, body); err != nil {
			return nil, nil, err
		}
		return body, nil, h.check(body)
	}
	expire := time.NewTimer(last.Sub(arrived))
	c := p.t.budget.enqueue(h.n, p.member)
	err = p.t.budget.wait(c, p.t.done, expire.C)
	expire.Stop()
	if err != nil {
		return nil, nil, err
	}
	defer func() {
		if err != nil {
			p.t.budget.release(c)
		}
	}()
	if body, err = c.mapBody(); err != nil {
		return nil, nil, err
	}
	granted := time.Now()
	for off := 0; off < h.n; {
		end := min(h.n, off+budgetReadStep)
		due := granted.Add(WriteTimeout + time.Duration(end)*time.Second/raftWriteMinRate)
		if due.After(last) {
			due = last
		}
		if err := p.conn.SetReadDeadline(due); err != nil {
			return nil, nil, err
		}
		if _, err := io.ReadFull(r, body[off:end]); err != nil {
			return nil, nil, err
		}
		off = end
	}
	if err := h.check(body); err != nil {
		return nil, nil, err
	}
	return body, c, nil
}

// peerConn is what the transport knows of one accepted connection.
type peerConn struct {
	t      *raftTransport
	conn   net.Conn
	sink   *servedSink // replies on this connection, once one came
	remote string
	cert   *x509.Certificate // nil: plain TCP
	// member is set once the connection has shown it comes from a member
	// (framebudget.go): its frames then claim the budget as a member's.
	member bool
	// certFor is the last source address the certificate was found to
	// name, so that the check runs once per connection, not per frame.
	certFor string
}

// handle hands one frame to dragonboat, or tells why the connection must
// close: the frame does not decode, comes from outside the membership, or
// is a refused snapshot chunk.
func (p *peerConn) handle(kind byte, body []byte) error {
	t := p.t
	switch kind {
	case FrameMessages:
		var mb pb.MessageBatch
		if err := mb.Unmarshal(body); err != nil {
			return fmt.Errorf("%w: %w", errBadFrame, err)
		}
		if t.sources != nil {
			keepSource, err := t.sources.checkBatch(&mb)
			if err != nil {
				return err
			}
			if err := p.checkCert(mb.SourceAddress); err != nil {
				return err
			}
			if keepSource {
				return t.deliverWithSource(&mb)
			}
			mb.SourceAddress = "" // see raft_sources.go
			p.member = true       // every sender is a member at its address
		}
		t.onMessages(mb)
	case FrameChunk:
		var c pb.Chunk
		if err := c.Unmarshal(body); err != nil {
			return fmt.Errorf("%w: %w", errBadFrame, err)
		}
		if t.sources != nil {
			if err := t.sources.checkChunk(&c); err != nil {
				return err
			}
		}
		if !t.onChunk(c) {
			return errors.New("raft transport: snapshot chunk refused")
		}
	case FrameLockd:
		if t.onPeer != nil {
			if p.sink == nil {
				p.sink = &servedSink{conn: p.conn}
			}
			t.onPeer(body, p.sink.reply)
		}
	}
	return nil
}

// registryConflict is the format of the panic of dragonboat's address
// registry when it is given a second address for a replica.
const registryConflict = "inconsistent target for %s, %s:%s"

// dragonboatPanic is the value dragonboat's panics carry (Panicf): its
// format tells which one it is, for the one the transport takes back
// (deliverWithSource).
type dragonboatPanic struct{ format, msg string }

func (p dragonboatPanic) Error() string { return p.msg }

// Panicf is dragonboat's logger's Panicf: it panics, but for the registry
// conflict that supersedes an address lockd filed for a sender outside
// the membership, which is repaired instead (raft_sources.go): on
// dragonboat's apply path nothing could take that panic back, and the
// node would exit.
func Panicf(log zerolog.Logger, f string, a ...any) {
	if f == registryConflict && repairRegistryConflict(log, a) {
		return
	}
	p := dragonboatPanic{format: f, msg: fmt.Sprintf(f, a...)}
	log.WithLevel(zerolog.PanicLevel).Msg(p.msg)
	panic(p)
}

// deliverWithSource hands dragonboat a batch that keeps its source
// address, from a sender this node did not know as a member when it read
// the memberships (raft_sources.go). Dragonboat files an added member's
// address a moment before the membership shows it, so a frame giving that
// member another address in that instant makes the registry panic. The
// panic is raised as the address is filed, before the batch is handled
// and with nothing else changed, so it is taken back here: the frame is
// dropped with its connection instead of ending the process.
func (t *raftTransport) deliverWithSource(mb *pb.MessageBatch) (err error) {
	defer func() {
		r := recover()
		if r == nil {
			return
		}
		if p, ok := r.(dragonboatPanic); !ok || p.format != registryConflict {
			panic(r)
		}
		t.sources.unpin(mb)
		err = fmt.Errorf("%w: %v", errForeignSource, r)
	}()
	t.onMessages(*mb)
	return nil
}

// checkCert reports whether a TLS peer's certificate names the host of
// the source address its frame gives: a node can speak only for the
// members at its own host.
func (p *peerConn) checkCert(source string) error {
	if p.cert == nil || source == p.certFor {
		return nil
	}
	host, _, err := net.SplitHostPort(source)
	if err != nil {
		return fmt.Errorf("%w: source address %q: %w", errForeignSource, source, err)
	}
	if err := p.cert.VerifyHostname(host); err != nil {
		return fmt.Errorf("%w: %w", errForeignSource, err)
	}
	p.certFor = source
	return nil
}

// handshake runs an accepted connection's TLS handshake within
// DialTimeout and logs a peer it refused.
func (t *raftTransport) handshake(tc *tls.Conn) bool {
	_ = tc.SetDeadline(time.Now().Add(DialTimeout))
	if err := tc.Handshake(); err != nil {
		t.log.Warn().Err(err).Str("remote", tc.RemoteAddr().String()).
			Msg("raft transport: TLS handshake refused; a peer needs a certificate signed by --raft-tls-ca")
		return false
	}
	return tc.SetDeadline(time.Time{}) == nil
}

// frameHeader is what a frame's header declares.
type frameHeader struct {
	kind byte
	n    int    // the payload's length, at most MaxFrame
	sum  uint32 // the payload's CRC-32C
}

// readFrameHeader reads a frame's header and checks what it declares.
func readFrameHeader(r io.Reader) (frameHeader, error) {
	var hdr [frameHeaderLen]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return frameHeader{}, err
	}
	h := frameHeader{kind: hdr[2], n: int(binary.BigEndian.Uint32(hdr[3:])), sum: binary.BigEndian.Uint32(hdr[7:])}
	if binary.BigEndian.Uint16(hdr[:]) != frameMagic || (h.kind != FrameMessages && h.kind != FrameChunk && h.kind != FrameLockd) || h.n > MaxFrame {
		return frameHeader{}, fmt.Errorf("%w: header %x", errBadFrame, hdr)
	}
	return h, nil
}

// check reports whether body is the payload h declares.
func (h frameHeader) check(body []byte) error {
	if crc32.Checksum(body, castagnoliCRC) != h.sum {
		return errBadFrame
	}
	return nil
}

// ReadFrame reads one frame into buf, grown as its bytes arrive: it
// serves a node's own dialed connections, whose peer answers a question
// the node asked, outside the budget of the frames peers send it.
func ReadFrame(r io.Reader, buf []byte) (kind byte, body []byte, err error) {
	h, err := readFrameHeader(r)
	if err != nil {
		return 0, nil, err
	}
	body = buf[:0]
	for len(body) < h.n {
		step := min(h.n-len(body), max(frameReadStep, len(body)))
		body = slices.Grow(body, step)
		if _, err := io.ReadFull(r, body[len(body):len(body)+step]); err != nil {
			return 0, nil, err
		}
		body = body[:len(body)+step]
	}
	if err := h.check(body); err != nil {
		return 0, nil, err
	}
	return h.kind, body, nil
}

func (t *raftTransport) Close() error {
	t.mu.Lock()
	if !t.closed {
		close(t.done)
	}
	t.closed = true
	for conn := range t.conns {
		conn.Close()
	}
	t.mu.Unlock()
	var err error
	if t.ln != nil {
		err = t.ln.Close()
	}
	t.wg.Wait()
	return err
}

// dial connects to the peer dragonboat's registry places at target, or to
// the membership's address that superseded target (Sources.dialAddr).
func (t *raftTransport) dial(ctx context.Context, target string) (net.Conn, error) {
	if t.sources != nil {
		target = t.sources.dialAddr(target)
	}
	return Dial(ctx, t.tls, t.log, target)
}

// Dial connects to a peer's Raft port: mutual TLS when tlsCfg is set.
func Dial(ctx context.Context, tlsCfg *tls.Config, log zerolog.Logger, target string) (net.Conn, error) {
	d := net.Dialer{Timeout: DialTimeout}
	conn, err := d.DialContext(ctx, "tcp", target)
	if err != nil {
		return nil, err
	}
	if tlsCfg != nil {
		if conn, err = dialTLS(ctx, tlsCfg, log, conn, target); err != nil {
			return nil, err
		}
	}
	return conn, nil
}

// dialTLS runs the client side of the handshake within DialTimeout:
// the peer's certificate must carry target's host and verify against the
// CA.
func dialTLS(ctx context.Context, tlsCfg *tls.Config, log zerolog.Logger, conn net.Conn, target string) (net.Conn, error) {
	host, _, err := net.SplitHostPort(target)
	if err != nil {
		conn.Close()
		return nil, err
	}
	cfg := tlsCfg.Clone()
	cfg.ServerName = host
	tc := tls.Client(conn, cfg)
	ctx, cancel := context.WithTimeout(ctx, DialTimeout)
	defer cancel()
	if err := tc.HandshakeContext(ctx); err != nil {
		conn.Close()
		log.Warn().Err(err).Str("target", target).Msg("raft transport: TLS handshake with a peer failed")
		return nil, fmt.Errorf("raft transport: TLS with %s: %w", target, err)
	}
	return tc, nil
}

// GetConnection dials a message stream to target that redials once when a
// write fails on a connection the peer has dropped (see frameConn.redial).
func (t *raftTransport) GetConnection(ctx context.Context, target string) (raftio.IConnection, error) {
	dialStream := func() (net.Conn, error) {
		conn, err := t.dial(ctx, target)
		if err == nil && t.streamsOpened != nil {
			t.streamsOpened.Add(1)
		}
		return conn, err
	}
	conn, err := dialStream()
	if err != nil {
		return nil, err
	}
	return &frameConn{conn: conn, framesSent: t.framesSent, redial: dialStream}, nil
}

// GetSnapshotConnection dials a snapshot stream; its chunks belong to one
// connection, so it never redials.
func (t *raftTransport) GetSnapshotConnection(ctx context.Context, target string) (raftio.ISnapshotConnection, error) {
	conn, err := t.dial(ctx, target)
	if err != nil {
		return nil, err
	}
	return &frameConn{conn: conn}, nil
}

// frameConn is a dialed connection to a peer; dragonboat uses each from
// one goroutine at a time.
type frameConn struct {
	conn       net.Conn
	buf        []byte
	framesSent *atomic.Uint64 // nil: not counted (snapshot streams)
	// redial, when set, replaces a connection whose write failed other
	// than by timing out, and the frame is written once more on the new
	// one. Dragonboat keeps its message streams to a peer under one
	// circuit breaker per peer address; after the peer restarts, a stale
	// connection fails at its next write, and each failure trips the
	// breaker again (0.5–1.5 s during which every message to the peer is
	// dropped): a restarted node then hears nothing from its leader for
	// seconds, and a leader lost in that window leaves a group without a
	// quorum that can commit. A frame
	// sent twice is harmless (Raft ignores what it already has), and a
	// frame cut short on the old connection is discarded by the peer's
	// reader.
	redial func() (net.Conn, error)
}

func (c *frameConn) Close() { c.conn.Close() }

func (c *frameConn) SendMessageBatch(mb pb.MessageBatch) error {
	if onlyNotices(mb) {
		// A leader's step worker that commits an entry readies the apply
		// worker, whose answers clients wait for, and then the senders of
		// the commit notices; the latest readied runs first, so without
		// this yield the notices' writes go ahead of the apply
		// (docs/cluster.md, Performance).
		runtime.Gosched()
	}
	err := c.send(FrameMessages, &mb, mb.SizeUpperLimit())
	if err == nil && c.framesSent != nil {
		c.framesSent.Add(1)
	}
	return err
}

// onlyNotices reports whether a batch carries nothing a peer needs in
// order to commit: replicate messages without entries (a new commit
// index) and heartbeats.
func onlyNotices(mb pb.MessageBatch) bool {
	for i := range mb.Requests {
		m := &mb.Requests[i]
		if !(m.Type == pb.Replicate && len(m.Entries) == 0 || m.Type == pb.Heartbeat) {
			return false
		}
	}
	return true
}

func (c *frameConn) SendChunk(chunk pb.Chunk) error {
	return c.send(FrameChunk, &chunk, chunk.Size())
}

// send writes one frame: header and payload in a single write.
func (c *frameConn) send(kind byte, m pb.Marshaler, sizeLimit int) error {
	if need := frameHeaderLen + sizeLimit; cap(c.buf) < need {
		c.buf = make([]byte, need)
	}
	b := c.buf[:frameHeaderLen+sizeLimit]
	payload := pb.MustMarshalTo(m, b[frameHeaderLen:])
	n := len(payload)
	putFrameHeader(b, kind, payload)
	deadline := WriteTimeout + time.Duration(n)*time.Second/raftWriteMinRate
	err := WriteWithin(c.conn, b[:frameHeaderLen+n], deadline)
	var ne net.Error
	if err != nil && c.redial != nil && !(errors.As(err, &ne) && ne.Timeout()) {
		if conn, derr := c.redial(); derr == nil {
			c.conn.Close()
			c.conn = conn
			err = WriteWithin(c.conn, b[:frameHeaderLen+n], deadline)
		}
	}
	if cap(c.buf) > 1<<20 {
		c.buf = nil // do not pin a snapshot chunk's buffer
	}
	return err
}

// putFrameHeader fills the header of a frame of kind carrying payload.
func putFrameHeader(b []byte, kind byte, payload []byte) {
	binary.BigEndian.PutUint16(b, frameMagic)
	b[2] = kind
	binary.BigEndian.PutUint32(b[3:], uint32(len(payload)))
	binary.BigEndian.PutUint32(b[7:], crc32.Checksum(payload, castagnoliCRC))
}

// WriteWithin writes b to conn, giving up after d.
func WriteWithin(conn net.Conn, b []byte, d time.Duration) error {
	if err := conn.SetWriteDeadline(time.Now().Add(d)); err != nil {
		return err
	}
	_, err := conn.Write(b)
	return err
}

// WriteFrame writes one frame of kind with payload within timeout.
func WriteFrame(conn net.Conn, kind byte, payload []byte, timeout time.Duration) error {
	return WriteWithin(conn, AppendFrame(nil, kind, payload), timeout)
}

// AppendFrame appends to dst one frame of kind with payload.
func AppendFrame(dst []byte, kind byte, payload []byte) []byte {
	at := len(dst)
	dst = append(append(dst, make([]byte, frameHeaderLen)...), payload...)
	putFrameHeader(dst[at:], kind, dst[at+frameHeaderLen:])
	return dst
}

// servedSink is the accepting side of a peer's connection. Its replies
// are short, and a peer that does not read one within replyWriteTimeout
// loses the connection rather than stall the transport's reader.
type servedSink struct {
	mu   sync.Mutex
	conn net.Conn
}

const replyWriteTimeout = 200 * time.Millisecond

func (s *servedSink) reply(b []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if WriteFrame(s.conn, FrameLockd, b, replyWriteTimeout) != nil {
		s.conn.Close()
	}
}
