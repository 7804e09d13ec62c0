package server

// This file owns what guards the admin endpoint: its connection slots,
// with room beside them for health probes, and its bearer token.

import (
	"context"
	"crypto/subtle"
	"net"
	"net/http"
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
		_ = c.SetDeadline(time.Now().Add(adminProbeTimeout))
		return &adminConn{Conn: c, probe: true, release: func() { l.probes.Add(-1) }}, nil
	}
}

// adminConn gives its slot back once, when closed.
type adminConn struct {
	net.Conn
	probe   bool
	once    sync.Once
	release func()
}

func (c *adminConn) Close() error {
	c.once.Do(c.release)
	return c.Conn.Close()
}

type probeConnKey struct{}

// markProbeConn is the admin server's ConnContext: it tells the handlers
// which requests came on a probe connection.
func markProbeConn(ctx context.Context, c net.Conn) context.Context {
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

// requireToken answers 401 to a request without the bearer token, except
// for /healthz and /metrics, which probes and scrapers read.
func requireToken(token []byte, next http.Handler) http.Handler {
	want := append([]byte("Bearer "), token...)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" || r.URL.Path == "/metrics" {
			next.ServeHTTP(w, r)
			return
		}
		if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="lockd admin"`)
			adminjson.Error(w, http.StatusUnauthorized, "this admin route needs the bearer token of lockd's --admin-token-file")
			return
		}
		next.ServeHTTP(w, r)
	})
}
