package server

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"
)

// Admin HTTP limits: a scrape, a health check or a membership change is
// one small request, so a connection that sends its headers or its body
// slowly is closed soon, and cannot hold one of the few admin connections
// (Config.AdminIdleTimeout does the same for an idle one).
const (
	adminReadHeaderTimeout = 5 * time.Second
	adminReadTimeout       = 10 * time.Second
	adminWriteTimeout      = 10 * time.Second
	adminMaxHeaderBytes    = 16 << 10
	adminMaxBodyBytes      = 64 << 10
)

// adminServer serves /healthz, /metrics and the lock inspection
// (inspect.go) over HTTP.
type adminServer struct {
	addr string
	http *http.Server
	done chan struct{}
}

// startAdmin serves at most Config.AdminMaxConns connections at once;
// past that, a few more are accepted for /healthz alone (admin_gates.go).
// With Config.AdminToken or client CAs in Config.AdminTLS every route but
// /healthz and /metrics needs the token or a client certificate.
func startAdmin(s *Server) (*adminServer, error) {
	ln, err := net.Listen("tcp", s.cfg.Admin)
	if err != nil {
		return nil, fmt.Errorf("server: admin listen on %s: %w", s.cfg.Admin, err)
	}
	reg, err := newRegistry(s)
	if err != nil {
		ln.Close()
		return nil, err
	}
	limited := newAdminListener(ln, s.cfg.AdminMaxConns)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		switch {
		case s.reactorFailed():
			http.Error(w, "client port stopped", http.StatusServiceUnavailable)
			return
		case s.draining.Load():
			http.Error(w, "draining", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	// A family that fails to gather is logged and left out; the rest is
	// still served.
	for pattern, h := range s.cfg.AdminRoutes {
		mux.Handle(pattern, h)
	}
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorLog: metricsLogger{s.log}, ErrorHandling: promhttp.ContinueOnError}))
	handler := s.withLocks(mux)
	if s.cfg.adminAuthenticates() {
		handler = requireAuth(s.cfg.AdminToken, s.cfg.adminClientCerts(), handler)
	}
	a := &adminServer{
		addr: ln.Addr().String(),
		http: &http.Server{
			Handler:           onlyHealthOnProbes(http.MaxBytesHandler(handler, adminMaxBodyBytes)),
			ReadHeaderTimeout: adminReadHeaderTimeout,
			ReadTimeout:       adminReadTimeout,
			WriteTimeout:      adminWriteTimeout,
			IdleTimeout:       s.cfg.AdminIdleTimeout,
			MaxHeaderBytes:    adminMaxHeaderBytes,
			ConnContext:       markProbeConn,
		},
		done: make(chan struct{}),
	}
	// The TLS handshake happens in the connection's goroutine, under the
	// server's read deadlines, once the connection holds a slot. Without
	// NextProtos the endpoint speaks HTTP/1.1 only, as in plain HTTP.
	var served net.Listener = limited
	if s.cfg.AdminTLS != nil {
		served = tls.NewListener(limited, s.cfg.AdminTLS)
	}
	go func() {
		defer close(a.done)
		_ = a.http.Serve(served)
	}()
	return a, nil
}

func (a *adminServer) close() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = a.http.Shutdown(ctx)
	<-a.done
}

// metricsLogger is promhttp's error log on the server's logger.
type metricsLogger struct{ l zerolog.Logger }

func (m metricsLogger) Println(v ...any) { m.l.Warn().Msg(fmt.Sprint(v...)) }
