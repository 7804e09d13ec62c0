package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/lockd/lockd/codec"
)

// connect dials addr and authenticates within DialTimeout; capacity sizes
// the session's tables for the requests it may carry at once, and pool is
// the wait pool the session is for, nil for a shared session.
func (c *Client) connect(ctx context.Context, addr string, capacity int, pool *waitPool) (*session, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.DialTimeout)
	defer cancel()
	conn, err := c.cfg.Dialer(ctx, "tcp", addr)
	if err != nil {
		return nil, dialError(addr, err)
	}
	// A server that says nothing for the silence timeout is as silent in
	// the handshake as later (a stopped node's kernel still accepts):
	// the handshake has that long, within DialTimeout.
	silentAt := time.Now().Add(c.cfg.SilenceTimeout)
	deadline := silentAt
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	conn.SetDeadline(deadline)
	if c.cfg.TLS != nil {
		conn = tls.Client(conn, tlsConfigFor(c.cfg.TLS, addr))
	}
	// A cancelled Dial or Close must not wait for a silent server.
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	rr, flags, err := c.handshake(conn, addr)
	servesAbandon := err == nil && flags&codec.GreetingAbandon != 0
	if servesAbandon {
		err = c.declareSession(conn, rr, addr)
	}
	if !stop() && err == nil {
		err = fmt.Errorf("handshake with %s: %w", addr, context.Cause(ctx))
	}
	var netErr net.Error
	if err != nil && ctx.Err() == nil && !deadline.Before(silentAt) && errors.As(err, &netErr) && netErr.Timeout() {
		c.quietAddrs.mark(addr, c.clock.Now())
		err = fmt.Errorf("%w (heard nothing for the silence timeout, %v)", err, c.cfg.SilenceTimeout)
	}
	if err == nil {
		err = conn.SetDeadline(time.Time{})
	}
	if err != nil {
		conn.Close()
		return nil, err
	}
	return c.startSession(conn, addr, rr, servesAbandon, capacity, pool), nil
}

// dialError names addr unless the dialer's error already does, as the
// net package's do ("dial tcp 127.0.0.1:7420: connect: …").
func dialError(addr string, err error) error {
	var opErr *net.OpError
	if errors.As(err, &opErr) && opErr.Op == "dial" {
		return err
	}
	return fmt.Errorf("dial %s: %w", addr, err)
}

// declareSession sends SESSION with the client's client_id, once, before
// anything else on the connection (SPEC §6a), and waits for its PONG.
func (c *Client) declareSession(conn net.Conn, rr *codec.ResponseReader, addr string) error {
	owner, err := c.nextOwner()
	if err != nil {
		return err
	}
	if _, err := conn.Write(codec.AppendSession(nil, owner, *c.clientID)); err != nil {
		return fmt.Errorf("session with %s: %w", addr, err)
	}
	var resp codec.Response
	if err := nextFrame(rr, &resp); err != nil {
		return fmt.Errorf("session with %s: %w", addr, err)
	}
	switch {
	case resp.Op == codec.OpPong && resp.Owner == owner:
		return nil
	case resp.Op == codec.OpError:
		return fmt.Errorf("session with %s: %w", addr, reasonError(resp.Reason))
	}
	return fmt.Errorf("%w: SESSION answered with op %q for owner %d on %s", ErrProtocol, resp.Op, resp.Owner, addr)
}

// handshake runs SPEC §7 and returns the reader, which may already hold
// bytes past the handshake's last frame, and the GREETING's flags.
func (c *Client) handshake(conn net.Conn, addr string) (*codec.ResponseReader, uint8, error) {
	if tc, ok := conn.(*tls.Conn); ok {
		if err := tc.Handshake(); err != nil {
			var netErr net.Error
			if errors.As(err, &netErr) && netErr.Timeout() {
				// A slow or silent server, not a refusal.
				return nil, 0, fmt.Errorf("TLS handshake with %s: %w", addr, err)
			}
			return nil, 0, fmt.Errorf("%w with %s: %w", ErrTLS, addr, err)
		}
	}
	rr := codec.NewResponseReader(conn, readBufferSize)
	flags, err := codec.ClientHandshake(conn, rr, codec.Credentials{Tenant: c.cfg.Tenant, Secret: c.cfg.Secret})
	var refusal codec.Reason
	switch {
	case err == nil:
		return rr, flags, nil
	case tlsAlert(err):
		// In TLS 1.3 a server refuses the client's certificate after the
		// client's side of the handshake has finished: the alert comes
		// with the greeting's read.
		return nil, 0, fmt.Errorf("%w: %s refused this client: %w", ErrTLS, addr, err)
	case errors.Is(err, codec.ErrHandshakeRefused) && errors.As(err, &refusal):
		return nil, 0, fmt.Errorf("handshake with %s: %w", addr, reasonError(refusal))
	case errors.Is(err, codec.ErrHandshakeAuth):
		return nil, 0, fmt.Errorf("%w: handshake with %s: %w", ErrAuth, addr, err)
	case errors.Is(err, codec.ErrHandshakeProtocol):
		return nil, 0, fmt.Errorf("%w: handshake with %s: %w", ErrProtocol, addr, err)
	}
	return nil, 0, fmt.Errorf("handshake with %s: %w", addr, err)
}

// tlsConfigFor is cfg naming the server to verify after addr's host
// unless cfg names one itself.
func tlsConfigFor(cfg *tls.Config, addr string) *tls.Config {
	if cfg.ServerName != "" {
		return cfg
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return cfg
	}
	named := cfg.Clone()
	named.ServerName = host
	return named
}

// tlsAlert reports whether err is a TLS alert the other end sent.
func tlsAlert(err error) bool {
	var opErr *net.OpError
	return errors.As(err, &opErr) && opErr.Op == "remote error"
}
