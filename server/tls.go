package server

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockd/lockd/codec"
	"github.com/lockd/lockd/internal/tlsfiles"
)

// The TLS client port. gnet has no TLS, so each TLS connection is served
// by two goroutines of its own: a reader, which decrypts and runs the
// session's process over what arrived, and a writer, which encrypts what
// the session wrote and runs process when the session is woken. A lock,
// the connection's loop, lets one process run at a time, which is what
// gnet's event loop guarantees on the client port: the frame handling is
// the same session code on both ports.

const (
	// tlsBufferedMax is the largest write buffer a TLS connection keeps
	// between writes; a larger one, grown by a burst, is dropped.
	tlsBufferedMax = 64 << 10
	// tlsFinalWriteTimeout bounds the writes after a session ended. The
	// kernel takes a closing answer at once from a client that reads; one
	// that does not (dropped for it, say) is not waited for, as gnet does
	// not wait on the client port either.
	tlsFinalWriteTimeout = 100 * time.Millisecond
)

// LoadTLSConfig builds the TLS port's configuration from PEM files: the
// server's certificate and key (refused when the key's mode lets the group
// or others in) and, when clientCA is not empty, the CA bundle client
// certificates must verify against: every client must then present one
// (mutual TLS).
func LoadTLSConfig(certFile, keyFile, clientCA string) (*tls.Config, error) {
	pair, err := tlsfiles.LoadKeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("server: TLS %w", err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
	if clientCA != "" {
		pool, err := tlsfiles.LoadCAPool(clientCA)
		if err != nil {
			return nil, fmt.Errorf("server: TLS client %w", err)
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

// tlsPort is the TLS listener and the connections it accepted.
type tlsPort struct {
	srv *Server
	ln  net.Listener

	mu     sync.Mutex
	conns  map[*tlsConn]struct{}
	closed bool
	done   chan struct{} // closed by close
	// wg counts the accept loop, the stalled-write scan and every
	// connection's two goroutines.
	wg sync.WaitGroup
}

func startTLSPort(s *Server) (*tlsPort, error) {
	ln, err := net.Listen("tcp", s.cfg.TLSListen)
	if err != nil {
		return nil, fmt.Errorf("server: TLS listen on %s: %w", s.cfg.TLSListen, err)
	}
	p := &tlsPort{srv: s, ln: tls.NewListener(ln, s.cfg.TLS), conns: make(map[*tlsConn]struct{}), done: make(chan struct{})}
	p.wg.Add(2)
	go func() {
		defer p.wg.Done()
		p.accept()
	}()
	go func() {
		defer p.wg.Done()
		p.scanWrites()
	}()
	return p, nil
}

// scanWrites drops, every progressScanInterval, the connections whose
// write has made no progress for ProgressTimeout: the client takes no
// bytes, and its blocked writer would otherwise stall the session's
// wakes, the progress clock's among them, for good.
func (p *tlsPort) scanWrites() {
	s := p.srv
	tick := time.NewTicker(progressScanInterval)
	defer tick.Stop()
	for {
		select {
		case <-p.done:
			return
		case <-tick.C:
		}
		now := int64(s.clock.Now())
		p.mu.Lock()
		for tc := range p.conns {
			if tc.writing.Load() && now-tc.writeStartedAt.Load() >= int64(ProgressTimeout) && !tc.stallDropped {
				tc.stallDropped = true
				s.metrics.slowDropped.Add(1)
				s.log.Warn().Str("remote", tc.conn.RemoteAddr().String()).Msg("dropping a TLS client that takes no bytes of its responses")
				// Unblocks the write; the reader then ends the session.
				tc.closeNow()
			}
		}
		p.mu.Unlock()
	}
}

func (p *tlsPort) addr() string { return p.ln.Addr().String() }

// accept admits connections under the same rules as the client port's
// OnOpen: none while draining, and all connections of both ports count
// against one cap.
func (p *tlsPort) accept() {
	s := p.srv
	var pause time.Duration
	for {
		nc, err := p.ln.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			// Out of descriptors, say: keep serving the connections there
			// are, and accept again once some closed.
			pause = min(max(2*pause, 5*time.Millisecond), time.Second)
			s.log.Error().Err(err).Dur("retry_in", pause).Msg("TLS port: accept failed")
			time.Sleep(pause)
			continue
		}
		pause = 0
		if s.draining.Load() {
			nc.Close()
			continue
		}
		if s.conns.Add(1) > s.connCap.Load() {
			s.conns.Add(-1)
			s.metrics.connsRejected.Add(1)
			nc.Close()
			continue
		}
		tc := &tlsConn{srv: s, port: p, conn: nc.(*tls.Conn), signal: make(chan struct{}, 1)}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			s.conns.Add(-1)
			nc.Close()
			return
		}
		p.conns[tc] = struct{}{}
		p.wg.Add(2)
		p.mu.Unlock()
		go tc.readLoop()
		go tc.writeLoop()
	}
}

// close stops accepting, closes every connection and waits for their
// goroutines: each connection's session ends as when its peer left.
func (p *tlsPort) close() {
	p.mu.Lock()
	p.closed = true
	close(p.done)
	for tc := range p.conns {
		tc.closeNow()
	}
	p.mu.Unlock()
	p.ln.Close()
	p.wg.Wait()
}

func (p *tlsPort) forget(tc *tlsConn) {
	p.mu.Lock()
	delete(p.conns, tc)
	p.mu.Unlock()
}

// tlsConn is one connection of the TLS port; it is the session's
// transport.
type tlsConn struct {
	srv  *Server
	port *tlsPort
	conn *tls.Conn

	// loop is the connection's event loop: held around every process and
	// around the session's start and end.
	loop    sync.Mutex
	ss      *session // nil until the handshake completed
	batch   batch
	inbound []byte // bytes received and not yet consumed
	ended   bool   // the session was closed

	outMu    sync.Mutex
	outbound []byte // written by the session, not yet handed to the writer
	spare    []byte
	// finishing tells the writer to send what is left and close.
	finishing bool
	// unsent counts the bytes written by the session that the writer has
	// not yet sent.
	unsent atomic.Int64
	woken  atomic.Bool
	signal chan struct{} // wakes the writer
	// writing is set while the writer is inside a Write that began at
	// writeStartedAt (on the server's clock), for scanWrites.
	writing        atomic.Bool
	writeStartedAt atomic.Int64
	stallDropped   bool // under port.mu
}

func (tc *tlsConn) write(b []byte) {
	tc.outMu.Lock()
	tc.outbound = append(tc.outbound, b...)
	tc.outMu.Unlock()
	tc.unsent.Add(int64(len(b)))
	tc.notify()
}

func (tc *tlsConn) outboundBuffered() int { return int(tc.unsent.Load()) }

func (tc *tlsConn) wake() {
	tc.woken.Store(true)
	tc.notify()
}

func (tc *tlsConn) remoteAddr() net.Addr { return tc.conn.RemoteAddr() }

// closeNow closes the connection without the TLS close_notify alert,
// whose write crypto/tls would wait up to 5 s for on a client that does
// not read. The client's next read ends at a record boundary, which
// crypto/tls reports as io.EOF.
func (tc *tlsConn) closeNow() { tc.conn.NetConn().Close() }

func (tc *tlsConn) notify() {
	select {
	case tc.signal <- struct{}{}:
	default:
	}
}

// readLoop runs the handshake under the progress timeout, starts the
// session, then processes what the client sends until the connection
// ends.
func (tc *tlsConn) readLoop() {
	defer tc.port.wg.Done()
	s := tc.srv
	_ = tc.conn.SetDeadline(time.Now().Add(ProgressTimeout))
	if err := tc.conn.Handshake(); err != nil {
		s.metrics.tlsHandshakeFailures.Add(1)
		s.log.Debug().Err(err).Str("remote", tc.conn.RemoteAddr().String()).Msg("TLS port: handshake failed")
		tc.loop.Lock()
		tc.end(false)
		tc.loop.Unlock()
		return
	}
	_ = tc.conn.SetDeadline(time.Time{})
	if !tc.startSession() {
		return
	}
	buf := make([]byte, ReadBufferCap)
	for {
		n, err := tc.conn.Read(buf)
		tc.loop.Lock()
		if n > 0 && !tc.ended {
			tc.process(buf[:n])
		}
		if err != nil {
			tc.end(true)
		}
		ended := tc.ended
		tc.loop.Unlock()
		if ended {
			return
		}
	}
}

// startSession greets the client; false when the connection ended
// instead.
func (tc *tlsConn) startSession() bool {
	tc.loop.Lock()
	defer tc.loop.Unlock()
	s := tc.srv
	if tc.ended {
		return false
	}
	if s.draining.Load() {
		tc.end(false)
		return false
	}
	tc.batch.buf = make([]byte, 0, codec.MaxResponseFrame)
	ss, greeting, err := newSession(s, tc, &tc.batch)
	if err != nil {
		if err != errNoRoom {
			s.log.Error().Err(err).Msg("cannot start a session")
		}
		tc.end(false)
		return false
	}
	tc.ss = ss
	s.metrics.connsAccepted.Add(1)
	tc.write(greeting)
	return true
}

// process runs the session over data, after what an earlier pass left
// unconsumed; called with tc.loop held.
func (tc *tlsConn) process(data []byte) {
	in := data
	if len(tc.inbound) > 0 {
		tc.inbound = append(tc.inbound, data...)
		in = tc.inbound
	}
	consumed, closing := tc.ss.process(in)
	// in may be the reader's buffer, which the next read overwrites.
	tc.inbound = append(tc.inbound[:0], in[consumed:]...)
	if closing {
		tc.end(false)
	}
}

// end closes the session, once, and tells the writer to send what is left
// and close the connection; called with tc.loop held. peerEnded is as for
// session.close.
func (tc *tlsConn) end(peerEnded bool) {
	if tc.ended {
		return
	}
	tc.ended = true
	if tc.ss != nil {
		tc.ss.close(peerEnded)
	}
	tc.srv.conns.Add(-1)
	tc.outMu.Lock()
	tc.finishing = true
	tc.outMu.Unlock()
	// Bounds the write in progress, if any, and the last one.
	_ = tc.conn.SetWriteDeadline(time.Now().Add(tlsFinalWriteTimeout))
	tc.notify()
}

// writeLoop sends what the session wrote and runs process when the
// session was woken.
func (tc *tlsConn) writeLoop() {
	defer tc.port.wg.Done()
	defer tc.port.forget(tc)
	failed := false
	defer func() {
		if failed {
			tc.closeNow()
		} else {
			tc.conn.Close() // with a close_notify alert
		}
	}()
	for range tc.signal {
		if tc.woken.Swap(false) {
			tc.loop.Lock()
			if !tc.ended && tc.ss != nil {
				tc.process(nil)
			}
			tc.loop.Unlock()
		}
		tc.outMu.Lock()
		out, finishing := tc.outbound, tc.finishing
		tc.outbound = tc.spare[:0]
		tc.outMu.Unlock()
		if len(out) > 0 && !failed {
			tc.writeStartedAt.Store(int64(tc.srv.clock.Now()))
			tc.writing.Store(true)
			_, err := tc.conn.Write(out)
			tc.writing.Store(false)
			if err != nil {
				// The reader's next Read fails and ends the session.
				failed = true
				tc.closeNow()
			}
		}
		tc.unsent.Add(-int64(len(out)))
		if cap(out) > tlsBufferedMax {
			out = nil
		}
		tc.outMu.Lock()
		tc.spare = out[:0]
		tc.outMu.Unlock()
		if finishing {
			return
		}
	}
}
