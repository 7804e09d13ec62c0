package server

// This file owns what guards the admin endpoint: its connection slots,
// with room beside them for health probes, its bearer token and its
// client certificates.

import (
	"context"
	"crypto/subtle"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockd/lockd/internal/adminjson"
	"github.com/lockd/lockd/internal/privatefile"
)

const (
	// adminProbeConns bounds the connections accepted past
	// Config.AdminMaxConns. Each may ask for /healthz only and has
	// adminProbeTimeout in all, so that a liveness probe gets through
	// while clients that stall hold every slot (a probe that fails
	// restarts the node, and in single mode a restart drops every lock).
	adminProbeConns   = 256
	adminProbeTimeout = 2 * time.Second
	// MinAdminTokenLen is the shortest admin token accepted.
	MinAdminTokenLen = 16
)

// adminListener hands out Config.AdminMaxConns slots; a connection
// accepted while they are all taken is a probe connection.
type adminListener struct {
	net.Listener
	slots  chan struct{}
	probes atomic.Int64
}

func newAdminListener(ln net.Listener, slots int) *adminListener {
	return &adminListener{Listener: ln, slots: make(chan struct{}, slots)}
}

func (l *adminListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case l.slots <- struct{}{}:
			return &adminConn{Conn: c, release: func() { <-l.slots }}, nil
		default:
		}
		if l.probes.Add(1) > adminProbeConns {
			l.probes.Add(-1)
			c.Close()
			continue
		}
		probe := &adminConn{Conn: c, probe: true, end: time.Now().Add(adminProbeTimeout), release: func() { l.probes.Add(-1) }}
		_ = probe.SetDeadline(probe.end)
		return probe, nil
	}
}

// adminConn gives its slot back once, when closed. A probe connection's
// deadlines never reach past its end: the HTTP server sets its own, for
// the TLS handshake, the headers and the body, and they would give a
// probe its 5 and 10 s instead of adminProbeTimeout.
type adminConn struct {
	net.Conn
	probe   bool
	end     time.Time // a probe's
	once    sync.Once
	release func()
}

func (c *adminConn) SetDeadline(t time.Time) error { return c.Conn.SetDeadline(c.bound(t)) }

func (c *adminConn) SetReadDeadline(t time.Time) error { return c.Conn.SetReadDeadline(c.bound(t)) }

func (c *adminConn) SetWriteDeadline(t time.Time) error { return c.Conn.SetWriteDeadline(c.bound(t)) }

// bound is t, or a probe's end when t is later or none.
func (c *adminConn) bound(t time.Time) time.Time {
	if c.probe && (t.IsZero() || t.After(c.end)) {
		return c.end
	}
	return t
}

func (c *adminConn) Close() error {
	c.once.Do(c.release)
	return c.Conn.Close()
}

type probeConnKey struct{}

// markProbeConn is the admin server's ConnContext: it tells the handlers
// which requests came on a probe connection.
func markProbeConn(ctx context.Context, c net.Conn) context.Context {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	if ac, ok := c.(*adminConn); ok && ac.probe {
		return context.WithValue(ctx, probeConnKey{}, true)
	}
	return ctx
}

// onlyHealthOnProbes answers 503 to anything but /healthz on a probe
// connection, and closes the probe connection after its answer.
func onlyHealthOnProbes(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Context().Value(probeConnKey{}) == nil {
			next.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Connection", "close")
		if r.URL.Path != "/healthz" {
			adminjson.Error(w, http.StatusServiceUnavailable, "every admin connection is taken; only /healthz is answered")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// LoadAdminToken reads the admin endpoint's bearer token from a file of
// one line, refused when the group or others may access it or when the
// token is shorter than MinAdminTokenLen.
func LoadAdminToken(path string) ([]byte, error) {
	return privatefile.ReadToken(path, MinAdminTokenLen)
}

// LoadAdminTLSConfig builds the admin endpoint's TLS configuration from
// PEM files, as LoadTLSConfig does for the TLS port, but a client CA makes
// client certificates optional at the handshake: probes and scrapers
// reach /healthz and /metrics without one, and requireAuth asks for one
// (or the token) on the other routes. A certificate the CA did not sign
// still fails the handshake.
func LoadAdminTLSConfig(certFile, keyFile, clientCA string) (*tls.Config, error) {
	cfg, err := LoadTLSConfig(certFile, keyFile, clientCA)
	if err != nil {
		return nil, fmt.Errorf("admin: %w", err)
	}
	if cfg.ClientCAs != nil {
		cfg.ClientAuth = tls.VerifyClientCertIfGiven
	}
	return cfg, nil
}

// adminAuthenticates reports whether the admin endpoint checks who asks:
// a token, client certificates, or both.
func (c *Config) adminAuthenticates() bool {
	return c.AdminToken != nil || c.adminClientCerts()
}

// adminClientCerts reports whether a client certificate authenticates on
// the admin endpoint.
func (c *Config) adminClientCerts() bool {
	return c.AdminTLS != nil && c.AdminTLS.ClientCAs != nil
}

// requireAuth answers 401 to a request that shows neither the bearer
// token (when there is one) nor a client certificate the admin CA
// verified (with certs; the TLS handshake verified any certificate given
// against the CA), except
// for /healthz and /metrics, which probes and scrapers read.
func requireAuth(token []byte, certs bool, next http.Handler) http.Handler {
	var want []byte
	var needs []string
	if token != nil {
		want = append([]byte("Bearer "), token...)
		needs = append(needs, "the bearer token of lockd's --admin-token-file")
	}
	if certs {
		needs = append(needs, "a client certificate signed by lockd's --admin-tls-client-ca")
	}
	refusal := "this admin route needs " + strings.Join(needs, " or ")
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/healthz" || r.URL.Path == "/metrics":
		case certs && r.TLS != nil && len(r.TLS.VerifiedChains) > 0:
		case want != nil && subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) == 1:
		default:
			if want != nil {
				w.Header().Set("WWW-Authenticate", `Bearer realm="lockd admin"`)
			}
			adminjson.Error(w, http.StatusUnauthorized, refusal)
			return
		}
		next.ServeHTTP(w, r)
	})
}
