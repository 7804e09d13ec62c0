// Package lockdtest runs scripted lockd peers on 127.0.0.1 for tests of
// code that uses the client: a Script plays the server side of each
// connection — well-behaved, silent, late, or broken — and Locks is a
// ready-made script with an in-memory lock table. It is a test double
// built on the codec only; it is not the lockd server.
package lockdtest

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"

	"github.com/lockd/lockd/codec"
)

// Script plays the server side of one accepted connection. The connection
// is closed when it returns.
type Script func(*Conn)

// Server accepts connections on 127.0.0.1 and runs its Script on each.
type Server struct {
	ln     net.Listener
	script Script
	wg     sync.WaitGroup

	mu     sync.Mutex
	closed bool
	conns  map[*Conn]struct{}
}

// Start listens on a free port of 127.0.0.1.
func Start(script Script) (*Server, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("lockdtest: listen: %w", err)
	}
	s := &Server{ln: ln, script: script, conns: make(map[*Conn]struct{})}
	s.wg.Go(s.acceptLoop)
	return s, nil
}

// Addr is the listening address.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Close stops accepting, closes every connection and waits for the
// scripts to return.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	err := s.ln.Close()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return err
}

func (s *Server) acceptLoop() {
	for {
		nc, err := s.ln.Accept()
		if err != nil {
			return
		}
		c := &Conn{nc: nc, rbuf: make([]byte, 4096)}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			nc.Close()
			return
		}
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Go(func() {
			defer func() {
				c.Close()
				s.mu.Lock()
				delete(s.conns, c)
				s.mu.Unlock()
			}()
			s.script(c)
		})
	}
}

// Conn is the server side of one connection.
type Conn struct {
	nc         net.Conn
	rbuf       []byte
	start, end int
	out        []byte
	// Tenant is the tenant a HELLO named, if any.
	Tenant string
}

// Close closes the connection.
func (c *Conn) Close() error { return c.nc.Close() }

// Write sends raw bytes, such as half a frame.
func (c *Conn) Write(p []byte) (int, error) { return c.nc.Write(p) }

// Greet sends a GREETING with a fresh nonce and returns the nonce.
func (c *Conn) Greet(authRequired bool) ([codec.NonceLen]byte, error) {
	var flags uint8
	if authRequired {
		flags = codec.GreetingAuthRequired
	}
	return c.GreetFlags(flags)
}

// GreetFlags sends a GREETING with these flags (codec.GreetingAuthRequired,
// codec.GreetingAbandon, or bits no client knows yet) and a fresh nonce,
// and returns the nonce.
func (c *Conn) GreetFlags(flags uint8) ([codec.NonceLen]byte, error) {
	var nonce [codec.NonceLen]byte
	rand.Read(nonce[:])
	_, err := c.nc.Write(codec.AppendGreeting(nil, flags, nonce, "lockdtest"))
	return nonce, err
}

// Handshake plays SPEC §7: with secrets (tenant → secret) it requires a
// valid HELLO and answers WELCOME with the server MAC; a bad one is
// answered E auth_failed and returns an error. With nil secrets auth is
// off and Handshake returns after the GREETING: a HELLO, if the client
// sends one, comes out of ReadRequest.
func (c *Conn) Handshake(secrets map[string][]byte) error {
	return c.HandshakeWith(secrets, 0)
}

// HandshakeWith is Handshake with further GREETING flags, such as
// codec.GreetingAbandon; the auth bit follows secrets.
func (c *Conn) HandshakeWith(secrets map[string][]byte, flags uint8) error {
	if secrets != nil {
		flags |= codec.GreetingAuthRequired
	}
	nonce, err := c.GreetFlags(flags)
	if err != nil || secrets == nil {
		return err
	}
	var req codec.Request
	if err := c.ReadRequest(&req); err != nil {
		return err
	}
	secret, known := secrets[string(req.Tenant)]
	if req.Op != codec.OpHello || !known ||
		!codec.EqualMAC(req.MAC, codec.ClientMAC(secret, nonce, req.ClientNonce, req.Tenant)) {
		c.Error(0, codec.AuthFailed)
		return errors.New("lockdtest: authentication failed")
	}
	c.Tenant = string(req.Tenant)
	return c.Welcome(codec.ServerMAC(secret, req.ClientNonce, nonce, req.Tenant))
}

// ReadRequest reads the next client frame into req; Key and Tenant alias
// the read buffer until the next call. Answers buffered with the Queue
// methods are flushed before it blocks.
func (c *Conn) ReadRequest(req *codec.Request) error {
	for {
		n, err := codec.DecodeRequest(c.rbuf[c.start:c.end], req)
		if err != codec.ErrIncomplete {
			if n == 0 && err != nil {
				return fmt.Errorf("lockdtest: bad frame: %w", err)
			}
			c.start += n
			return err
		}
		if err := c.Flush(); err != nil {
			return err
		}
		c.end = copy(c.rbuf, c.rbuf[c.start:c.end])
		c.start = 0
		m, err := c.nc.Read(c.rbuf[c.end:])
		c.end += m
		if err != nil && m == 0 {
			return err
		}
	}
}

// Welcome sends WELCOME with mac.
func (c *Conn) Welcome(mac [codec.MACLen]byte) error {
	_, err := c.nc.Write(codec.AppendWelcome(nil, mac))
	return err
}

// Acquired sends ACQUIRED at once.
func (c *Conn) Acquired(owner, token uint64, waitedMs uint32) error {
	_, err := c.nc.Write(codec.AppendAcquired(nil, owner, token, waitedMs))
	return err
}

// Reply sends one of the owner-only answers (T, B, R, N, P) at once.
func (c *Conn) Reply(op byte, owner uint64) error {
	_, err := c.nc.Write(codec.AppendOwnerOnly(nil, op, owner))
	return err
}

// Error sends E with reason at once; owner 0 is not attributable.
func (c *Conn) Error(owner uint64, reason codec.Reason) error {
	_, err := c.nc.Write(codec.AppendError(nil, owner, reason))
	return err
}

// QueueAcquired buffers ACQUIRED until the next Flush.
func (c *Conn) QueueAcquired(owner, token uint64, waitedMs uint32) {
	c.out = codec.AppendAcquired(c.out, owner, token, waitedMs)
}

// QueueReply buffers an owner-only answer until the next Flush.
func (c *Conn) QueueReply(op byte, owner uint64) {
	c.out = codec.AppendOwnerOnly(c.out, op, owner)
}

// Flush writes the buffered answers in one write.
func (c *Conn) Flush() error {
	if len(c.out) == 0 {
		return nil
	}
	_, err := c.nc.Write(c.out)
	c.out = c.out[:0]
	return err
}

// Serve reads requests until the connection ends and hands each to
// answer; a HELLO with auth off is welcomed with zero MAC. It returns nil
// at a clean EOF.
func (c *Conn) Serve(answer func(c *Conn, req *codec.Request)) error {
	var req codec.Request
	for {
		err := c.ReadRequest(&req)
		switch {
		case errors.Is(err, io.EOF), errors.Is(err, net.ErrClosed):
			return nil
		case err != nil:
			return err
		case req.Op == codec.OpHello:
			c.Tenant = string(req.Tenant)
			if err := c.Welcome([codec.MACLen]byte{}); err != nil {
				return err
			}
		default:
			answer(c, &req)
		}
	}
}
