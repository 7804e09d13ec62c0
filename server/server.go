// Package server glues the gnet reactor to the lock engine: it owns
// sockets, the handshake, per-connection framing state, response batching,
// connection limits, graceful shutdown and the admin HTTP endpoint, a TLS
// client port beside the gnet one (crypto/tls connections served by
// goroutines of their own, through the same session code), and in
// single mode it opens the data dir whose token mark the engine reserves
// through (engine/tokenfile). It decodes and encodes frames only through
// codec and decides nothing about locks itself: every lock rule lives in
// engine, so cluster mode can put the same rules behind Raft without
// touching this package's wire logic.
package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/lockd/lockd/codec"
	"github.com/lockd/lockd/engine"
	"github.com/lockd/lockd/engine/tokenfile"
	"github.com/lockd/lockd/internal/defaults"
	"github.com/lockd/lockd/internal/netaddr"
	"github.com/panjf2000/gnet/v2"
	"github.com/rs/zerolog"
)

// Constants fixed by the design card and SPEC §2, §8.
const (
	ReadBufferCap   = 4096
	ResponseBatch   = 64
	ProgressTimeout = 5 * time.Second
)

// Operational defaults, overridable by Config; documented in docs/operations.md.
const (
	DefaultListen = "127.0.0.1:7420"
	DefaultAdmin  = "127.0.0.1:7421"
	// DefaultDataDir is lockd serve's data dir, relative to the working
	// directory like etcd's default.etcd.
	DefaultDataDir         = "lockd.data"
	DefaultMaxConns        = 65536
	DefaultMaxConnInflight = 4096
	// DefaultMaxOutbound is how many response bytes may wait for a client
	// that does not read before the server drops it.
	DefaultMaxOutbound = 1 << 20
	// DefaultMaxOpenTenants is how many tenants besides "default" clients
	// may name in HELLO while auth is off.
	DefaultMaxOpenTenants = 1024
	// DefaultDrainGrace is how long lockd serve keeps its ports open
	// after a drain began, /healthz answering 503, so that a load
	// balancer polling it sees the node leave before the ports close.
	DefaultDrainGrace = 5 * time.Second
	// DefaultAdminMaxConns bounds the admin endpoint's open connections.
	DefaultAdminMaxConns = 64
	// DefaultAdminIdleTimeout closes an idle admin keep-alive connection:
	// a scraper reconnecting costs less than one that holds a connection.
	DefaultAdminIdleTimeout = 30 * time.Second
	// progressScanInterval bounds how late a stalled frame is noticed.
	progressScanInterval = 250 * time.Millisecond
	// shutdownFlushTimeout bounds how long Close waits for the
	// shutting_down answers of queued waiters to be written.
	shutdownFlushTimeout = 2 * time.Second
)

// Config configures a Server. The zero value serves single mode on
// DefaultListen with auth off.
type Config struct {
	Listen string
	// TLSListen is the address of the TLS client port, served beside
	// Listen with the same backend, limits and auth; empty for none. It
	// needs TLS.
	TLSListen string
	// TLS configures the TLS port: its certificate and, for mutual TLS,
	// ClientCAs with ClientAuth tls.RequireAndVerifyClientCert
	// (LoadTLSConfig builds it from files).
	TLS *tls.Config
	// Admin is the admin HTTP address; empty means no admin endpoint.
	Admin string
	// InsecureAdmin allows Admin on a non-loopback address without
	// AdminToken or client certificates.
	InsecureAdmin bool
	// AdminToken, when set, is the bearer token every admin route but
	// /healthz and /metrics requires (LoadAdminToken); it lets Admin be
	// on a non-loopback address.
	AdminToken []byte
	// AdminTLS, when set, makes the admin endpoint HTTPS
	// (LoadAdminTLSConfig). With client CAs, a client certificate they
	// signed authenticates for every route AdminToken guards (the token
	// still does too), and lets Admin be on a non-loopback address.
	AdminTLS *tls.Config
	// AdminMaxConns bounds the admin endpoint's open connections; past
	// it, new ones wait in the kernel's accept queue.
	AdminMaxConns int
	// AdminIdleTimeout closes an admin keep-alive connection idle this
	// long; 0 means DefaultAdminIdleTimeout.
	AdminIdleTimeout time.Duration
	// AdminRoutes are more admin endpoints, by mux pattern ("/v1/x/"),
	// served beside /healthz, /metrics and the lock inspection (cluster
	// mode mounts its membership endpoint here).
	AdminRoutes map[string]http.Handler
	// DrainGrace is how long Close keeps the ports open after the drain
	// began, /healthz answering 503 all along. Zero closes them as soon
	// as the queued waiters were answered.
	DrainGrace time.Duration
	NodeName   string
	// Auth maps tenant to secret. Nil turns auth off: HELLO is optional
	// and the tenant is "default" unless a HELLO names another.
	Auth map[string][]byte
	// InsecureNoAuth allows auth off on a non-loopback address.
	InsecureNoAuth bool
	// Loops is the number of event loops; 0 means DefaultLoops().
	Loops           int
	MaxConns        int
	MaxConnInflight int
	MaxOutbound     int
	// MaxHandshakes bounds, when auth is required, the connections open
	// before their WELCOME, within MaxConns; 0 means an eighth of
	// MaxConns, at most 1024 (conngates.go).
	MaxHandshakes int
	// TenantConns gives a tenant's own connection share (auth file
	// conns=N); 0, or nil, means a fair share of MaxConns less
	// MaxHandshakes. Shares apply with two or more tenants.
	TenantConns func(tenant string) int
	// MaxOpenTenants bounds the tenants HELLO may name while auth is off;
	// past it a new tenant is answered auth_failed.
	MaxOpenTenants int
	// DataDir is single mode's data directory, created if missing: it
	// keeps the token high-water mark so that tokens grow across restarts,
	// crashes included. Empty runs volatile: tokens start again at
	// Engine.FirstToken on every start. A non-zero Engine.FirstToken below
	// the recorded mark is refused. Ignored with a Backend.
	DataDir string
	Engine  engine.Config
	// Backend, when set, replaces the single-mode engine (cluster mode);
	// Engine's limits are then ignored and Engine.Clock only times frames.
	// The server calls its Shutdown and Run but does not own what it
	// wraps: the caller closes that after Server.Close.
	Backend engine.Backend
	Logger  zerolog.Logger
}

// DefaultLoops is the event-loop count when Config.Loops is 0: one fewer
// than GOMAXPROCS, at least one. A gnet loop waits in a blocking
// epoll_wait that keeps its P until the runtime's sysmon takes it back,
// which on a quiet process takes 10–20 ms; with a loop on every P, a
// timer, the engine's expiry or a Raft worker that becomes ready meanwhile
// waits that long for a P (docs/operations.md, Event loops).
func DefaultLoops() int {
	return max(1, runtime.GOMAXPROCS(0)-1)
}

func (c *Config) applyDefaults() {
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	c.Loops = defaults.Or(c.Loops, DefaultLoops())
	c.MaxConns = defaults.Or(c.MaxConns, DefaultMaxConns)
	c.MaxConnInflight = defaults.Or(c.MaxConnInflight, DefaultMaxConnInflight)
	c.MaxOutbound = defaults.Or(c.MaxOutbound, DefaultMaxOutbound)
	c.MaxHandshakes = defaults.Or(c.MaxHandshakes, defaultMaxHandshakes(c.MaxConns))
	c.MaxOpenTenants = defaults.Or(c.MaxOpenTenants, DefaultMaxOpenTenants)
	c.AdminMaxConns = defaults.Or(c.AdminMaxConns, DefaultAdminMaxConns)
	c.AdminIdleTimeout = defaults.Or(c.AdminIdleTimeout, DefaultAdminIdleTimeout)
	if c.Engine.Clock == nil {
		c.Engine.Clock = engine.RealClock()
	}
}

// Server is a running lockd server: the client, TLS and admin ports
// over single mode's engine, or over Config.Backend (a cluster node).
type Server struct {
	cfg    Config
	log    zerolog.Logger
	clock  engine.Clock
	engine *engine.Engine // nil when Config.Backend is set
	// tokenMark is the data dir's token mark, nil when volatile or with a
	// Backend; closed once the engine's driver has stopped.
	tokenMark *tokenfile.File
	backend   engine.Backend
	// asyncAnswers: RELEASE, KEEP and ABANDON answers come through the
	// Waiter path.
	asyncAnswers bool
	ager         acquireAger // nil when the backend cannot tell (metrics.go)
	gnetEng      gnet.Engine
	addr         string
	metrics      metrics
	admin        *adminServer
	tlsPort      *tlsPort // nil without Config.TLSListen
	// origins remembers the remote address each recent grant went to,
	// for lock inspection (origins.go).
	origins *origins

	draining atomic.Bool
	conns    atomic.Int64
	// connCap is the effective connection cap: Config.MaxConns fitted
	// under the descriptor limit. Zero until Start derived it, so a
	// connection that races the start is refused.
	connCap       atomic.Int64
	pendingCloses atomic.Int64
	budget        connBudget

	stalledMu sync.Mutex
	stalled   map[*session]struct{} // sessions holding a started frame

	batchesMu sync.Mutex
	batches   map[gnet.EventLoop]*batch

	openTenantsMu sync.Mutex
	openTenants   map[string]struct{} // tenants named with auth off

	stopDriver context.CancelFunc
	done       sync.WaitGroup
	// reactorDone is closed when gnet.Run returned, with reactorErr.
	reactorDone chan struct{}
	reactorErr  error
	// stopping is set when Close stops the reactor; a reactor that ends
	// without it failed, and failed is closed.
	stopping atomic.Bool
	// itemsPeak is the most items (heldItems) seen since memory was last
	// returned to the OS.
	itemsPeak atomic.Int64
	failed    chan struct{}
	// portStopped is set when the reactor ended without Close, just
	// before failed is closed.
	portStopped atomic.Bool
	closeOnce   sync.Once
}

// Start listens on cfg.Listen and serves until Close.
func Start(cfg Config) (*Server, error) {
	cfg.applyDefaults()
	if err := errors.Join(CheckExposure(cfg)...); err != nil {
		return nil, err
	}
	if (cfg.TLSListen == "") != (cfg.TLS == nil) {
		return nil, errors.New("server: a TLS port needs both an address (--tls-listen) and a certificate (--tls-cert, --tls-key)")
	}
	s := &Server{
		cfg:     cfg,
		log:     cfg.Logger,
		clock:   cfg.Engine.Clock,
		stalled: make(map[*session]struct{}),
		batches: make(map[gnet.EventLoop]*batch),

		openTenants: make(map[string]struct{}),
		reactorDone: make(chan struct{}),
		failed:      make(chan struct{}),
		origins:     newOrigins(),
	}
	s.budget.init(cfg)
	if cfg.Backend != nil {
		s.backend = cfg.Backend
	} else {
		if err := s.startEngine(); err != nil {
			return nil, err
		}
		s.backend = engine.NewLocal(s.engine)
	}
	s.asyncAnswers = s.backend.AsyncAnswers()
	s.ager, _ = s.backend.(acquireAger)
	booted := make(chan struct{})
	h := &handler{srv: s, booted: booted}
	driverCtx, stop := context.WithCancel(context.Background())
	s.stopDriver = stop
	s.done.Add(2)
	go func() { defer s.done.Done(); s.backend.Run(driverCtx) }()
	go func() { defer s.done.Done(); s.returnMemory(driverCtx) }()

	go func() {
		defer close(s.reactorDone)
		s.reactorErr = gnet.Run(h, "tcp://"+cfg.Listen,
			gnet.WithMulticore(true),
			gnet.WithNumEventLoop(cfg.Loops),
			gnet.WithReadBufferCap(ReadBufferCap),
			gnet.WithTicker(true),
			gnet.WithTCPNoDelay(gnet.TCPNoDelay),
			gnet.WithReuseAddr(true),
			gnet.WithLogger(gnetLogger{cfg.Logger}),
		)
	}()
	select {
	case <-booted:
		if h.bootErr != nil {
			<-s.reactorDone
			s.stopBackground()
			return nil, fmt.Errorf("server: listen on %s: %w", cfg.Listen, h.bootErr)
		}
	case <-s.reactorDone:
		s.stopBackground()
		return nil, fmt.Errorf("server: listen on %s: %w", cfg.Listen, s.reactorErr)
	}
	go s.watchReactor()
	// A start that fails has served nobody: nothing to drain for.
	abort := func() { s.cfg.DrainGrace = 0; s.Close() }
	if cfg.TLSListen != "" {
		p, err := startTLSPort(s)
		if err != nil {
			abort()
			return nil, err
		}
		s.tlsPort = p
	}
	if cfg.Admin != "" {
		admin, err := startAdmin(s)
		if err != nil {
			abort()
			return nil, err
		}
		s.admin = admin
	}
	d, err := s.deriveConnCap()
	if err != nil {
		abort()
		return nil, err
	}
	s.connCap.Store(int64(d.cap))
	event := s.log.Info()
	// Below the default --max-conns is routine (the descriptor limit);
	// below one the operator chose is worth a warning.
	if d.cap < d.configured && d.configured != DefaultMaxConns {
		event = s.log.Warn()
	}
	event.Uint64("nofile_limit", d.limit).Uint64("nofile_before", d.before).Int("fds_open", d.open).
		Int("admin_max_conns", d.admin).Int("fd_headroom", d.headroom).Int("max_conns", d.configured).
		Int("conn_cap", d.cap).Msg("connection cap: the descriptor limit less the descriptors open, the admin connections and the headroom, at most --max-conns")
	s.log.Info().Str("listen", s.addr).Str("tls_listen", s.TLSAddr()).Bool("mtls", cfg.TLS != nil && cfg.TLS.ClientAuth == tls.RequireAndVerifyClientCert).
		Str("admin", s.AdminAddr()).Bool("admin_https", cfg.AdminTLS != nil).Bool("admin_client_certs", cfg.adminClientCerts()).
		Bool("auth", cfg.Auth != nil).Int("loops", cfg.Loops).Int("gomaxprocs", runtime.GOMAXPROCS(0)).Msg("lockd serving")
	return s, nil
}

// startEngine starts the single-mode engine on the data dir's token mark
// and reserves its first block of tokens, so that a mark that cannot be
// read or recorded stops the start before any client is served.
func (s *Server) startEngine() error {
	ec := s.cfg.Engine
	var logged *loggedMark
	newDataDir := false // the data dir records no mark: a first start
	if s.cfg.DataDir == "" {
		s.log.Warn().Uint64("first_token", max(ec.FirstToken, 1)).
			Msg("no data dir: running volatile, fencing tokens start again at the first token on every start")
	} else {
		mark, err := tokenfile.Open(s.cfg.DataDir)
		if err != nil {
			return fmt.Errorf("server: %w", err)
		}
		if ec.FirstToken != 0 && ec.FirstToken < mark.Reserved() {
			mark.Close()
			return fmt.Errorf("server: --first-token %d is below the token mark %d recorded in %s: tokens up to %d may have been issued already; start without --first-token to continue above the mark",
				ec.FirstToken, mark.Reserved(), mark.Path(), mark.Reserved()-1)
		}
		s.tokenMark = mark
		newDataDir = mark.Reserved() == 0
		logged = &loggedMark{File: mark, log: s.log}
		ec.HighWater = logged
	}
	s.engine = engine.New(ec)
	if err := s.engine.ReserveTokens(); err != nil {
		s.closeTokenMark()
		return fmt.Errorf("server: %w", err)
	}
	if logged != nil {
		// Before the engine's Run, which makes every later reservation.
		logged.serving = true
		msg := "fencing tokens continue above the data dir's mark"
		if newDataDir {
			msg = "fencing tokens start in a new data dir"
		}
		s.log.Info().Str("data_dir", s.cfg.DataDir).Uint64("first_token", s.engine.Stats().LastToken+1).
			Uint64("token_mark", s.tokenMark.Reserved()).Msg(msg)
	}
	return nil
}

func (s *Server) closeTokenMark() {
	if s.tokenMark == nil {
		return
	}
	if err := s.tokenMark.Close(); err != nil {
		s.log.Error().Err(err).Msg("cannot close the data dir")
	}
}

// loggedMark logs every mark the data dir could not record while the
// server serves (at start, the error stops the start instead). The engine
// retries, and grants go on from the tokens already reserved; once those
// run out, acquires are answered B.
type loggedMark struct {
	*tokenfile.File
	log     zerolog.Logger
	serving bool
}

func (m *loggedMark) Reserve(mark uint64) error {
	err := m.File.Reserve(mark)
	if err != nil && m.serving {
		m.log.Error().Err(err).Msg("cannot reserve fencing tokens; acquires are answered B once the reserved ones run out")
	}
	return err
}

// CheckExposure applies the rule New refuses a configuration by: auth
// off on an address other machines can reach (the TLS port's included),
// and the admin endpoint without authentication (a token or client
// certificates) on one. It returns one error per problem, so that
// `lockd serve --check-config` can list them all.
func CheckExposure(cfg Config) []error {
	var problems []error
	for _, listen := range []string{cfg.Listen, cfg.TLSListen} {
		if listen == "" || cfg.Auth != nil || cfg.InsecureNoAuth {
			continue
		}
		loopback, err := netaddr.IsLoopback(listen)
		switch {
		case err != nil:
			problems = append(problems, fmt.Errorf("server: listen address %q: %w", listen, err))
		case !loopback:
			problems = append(problems, fmt.Errorf("server: refusing to listen on non-loopback %q with auth off: give --auth-file, or --insecure-no-auth to accept the risk", listen))
		}
	}
	if cfg.Admin != "" && !cfg.InsecureAdmin && !cfg.adminAuthenticates() {
		loopback, err := netaddr.IsLoopback(cfg.Admin)
		switch {
		case err != nil:
			problems = append(problems, fmt.Errorf("server: admin address %q: %w", cfg.Admin, err))
		case !loopback:
			problems = append(problems, fmt.Errorf("server: refusing the admin endpoint on non-loopback %q without authentication: give --admin-token-file or --admin-tls-client-ca, keep it on 127.0.0.1, or give --insecure-admin to accept the risk", cfg.Admin))
		}
	}
	return problems
}

// Addr is the address the server listens on (with the real port when
// Listen asked for port 0).
func (s *Server) Addr() string { return s.addr }

// TLSAddr is the TLS port's address, or "" when there is none.
func (s *Server) TLSAddr() string {
	if s.tlsPort == nil {
		return ""
	}
	return s.tlsPort.addr()
}

// AdminAddr is the admin HTTP address, or "" when there is none.
func (s *Server) AdminAddr() string {
	if s.admin == nil {
		return ""
	}
	return s.admin.addr
}

// Engine exposes the lock engine, for tests that drive a fake clock; nil
// when the server runs on another Backend.
func (s *Server) Engine() *engine.Engine { return s.engine }

// Close drains the server: /healthz turns 503, new connections and
// requests are refused, queued waiters are answered E shutting_down, the
// ports stay open until Config.DrainGrace has passed since the drain
// began, then every connection is closed. Held locks die with the process
// (single mode keeps no state but its token mark).
func (s *Server) Close() error {
	var err error
	s.closeOnce.Do(func() {
		s.draining.Store(true)
		graceEnds := time.After(s.cfg.DrainGrace)
		s.backend.Shutdown()
		deadline := time.Now().Add(shutdownFlushTimeout)
		for s.pendingCloses.Load() > 0 && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		<-graceEnds
		if s.admin != nil {
			s.admin.close()
		}
		if s.tlsPort != nil {
			s.tlsPort.close()
		}
		if s.reactorFailed() {
			err = errReactorStopped
		} else {
			s.stopping.Store(true)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			err = s.gnetEng.Stop(ctx)
			<-s.reactorDone
			if err == nil && s.reactorErr != nil && !errors.Is(s.reactorErr, context.Canceled) {
				err = s.reactorErr
			}
		}
		s.stopBackground()
		s.log.Info().Msg("lockd stopped")
	})
	return err
}

// errReactorStopped is Close's answer once the client port had stopped on
// its own.
var errReactorStopped = errors.New("server: the client port had stopped (the event loops ended); restart the process")

// Failed is closed when the client port stops without Close: gnet's
// reactor ended (it does on an accept error it cannot handle), so no
// client can connect and the established ones were dropped. /healthz
// then answers 503; the owner should Close and exit non-zero, for a
// supervisor to restart the process.
func (s *Server) Failed() <-chan struct{} { return s.failed }

func (s *Server) reactorFailed() bool { return s.portStopped.Load() }

// watchReactor turns a reactor that ended without Close into Failed.
func (s *Server) watchReactor() {
	<-s.reactorDone
	if s.stopping.Load() {
		return
	}
	s.portStopped.Store(true) // before the log line, which says /healthz answers 503
	s.log.Error().AnErr("reactor_error", s.reactorErr).Msg("the client port stopped: the event loops ended; /healthz answers 503 and the process must restart")
	close(s.failed) // after it: the owner exits on it
}

func (s *Server) stopBackground() {
	s.stopDriver()
	s.done.Wait()
	s.closeTokenMark()
}

// admitOpenTenant bounds the tenants HELLO may name while auth is off:
// nothing else limits them, and each one stays interned for the process's
// life. The tenant "default" is always admitted.
func (s *Server) admitOpenTenant(tenant []byte) bool {
	if string(tenant) == defaultTenant {
		return true
	}
	s.openTenantsMu.Lock()
	defer s.openTenantsMu.Unlock()
	if _, ok := s.openTenants[string(tenant)]; ok {
		return true
	}
	if len(s.openTenants) >= s.cfg.MaxOpenTenants {
		return false
	}
	s.openTenants[string(tenant)] = struct{}{}
	return true
}

// batchFor returns the response batch of an event loop.
func (s *Server) batchFor(loop gnet.EventLoop) *batch {
	s.batchesMu.Lock()
	defer s.batchesMu.Unlock()
	b, ok := s.batches[loop]
	if !ok {
		b = &batch{buf: make([]byte, 0, ResponseBatch*codec.MaxResponseFrame)}
		s.batches[loop] = b
	}
	return b
}

func (s *Server) markStalled(ss *session, stalled bool) {
	s.stalledMu.Lock()
	if stalled {
		s.stalled[ss] = struct{}{}
	} else {
		delete(s.stalled, ss)
	}
	s.stalledMu.Unlock()
}

// wakeOverdue wakes every connection whose started frame has outlived the
// progress timeout; its own loop then answers bad_request and closes it.
func (s *Server) wakeOverdue() {
	now := int64(s.clock.Now())
	s.stalledMu.Lock()
	defer s.stalledMu.Unlock()
	for ss := range s.stalled {
		// The shorter of the two clocks; the session judges its own.
		if now-ss.frameStartedAt.Load() >= int64(HandshakeTimeout) {
			ss.wake()
		}
	}
}

// prepareListener bounds the client port's accept queue to acceptBacklog
// and returns its address (with the real port when Listen asked for 0).
func prepareListener(eng gnet.Engine) (string, error) {
	fd, err := eng.Dup()
	if err != nil {
		return "", err
	}
	if err := setAcceptBacklog(fd, acceptBacklog); err != nil {
		_ = syscall.Close(fd)
		return "", fmt.Errorf("bound the accept queue: %w", err)
	}
	f := os.NewFile(uintptr(fd), "listener")
	defer f.Close()
	ln, err := net.FileListener(f)
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// handler implements gnet.EventHandler.
type handler struct {
	gnet.BuiltinEventEngine
	srv     *Server
	booted  chan struct{}
	bootErr error // set before booted is closed
}

func (h *handler) OnBoot(eng gnet.Engine) gnet.Action {
	s := h.srv
	s.gnetEng = eng
	addr, err := prepareListener(eng)
	if err != nil {
		h.bootErr = err
		close(h.booted)
		return gnet.Shutdown
	}
	s.addr = addr
	close(h.booted)
	return gnet.None
}

func (h *handler) OnOpen(c gnet.Conn) ([]byte, gnet.Action) {
	s := h.srv
	if s.draining.Load() {
		return nil, gnet.Close
	}
	if s.conns.Add(1) > s.connCap.Load() {
		s.conns.Add(-1)
		s.metrics.connsRejected.Add(1)
		return nil, gnet.Close
	}
	ss, greeting, err := newSession(s, gnetTransport{c}, s.batchFor(c.EventLoop()))
	if err != nil {
		s.conns.Add(-1)
		if err != errNoRoom {
			s.log.Error().Err(err).Msg("cannot start a session")
		}
		return nil, gnet.Close
	}
	c.SetContext(ss)
	s.metrics.connsAccepted.Add(1)
	return greeting, gnet.None
}

func (h *handler) OnClose(c gnet.Conn, err error) gnet.Action {
	ss, ok := c.Context().(*session)
	if !ok {
		return gnet.None
	}
	h.srv.conns.Add(-1)
	ss.close(err != nil)
	return gnet.None
}

func (h *handler) OnTraffic(c gnet.Conn) gnet.Action {
	ss := c.Context().(*session)
	buf, _ := c.Peek(-1)
	ss.batch.beginPass()
	consumed, closing := ss.process(buf)
	ss.batch.endPass()
	if ss.gone {
		// A write failed and gnet closed the connection under us.
		return gnet.None
	}
	if consumed > 0 { // gnet's Discard(0) would discard everything
		_, _ = c.Discard(consumed)
	}
	if closing {
		return gnet.Close
	}
	return gnet.None
}

// gnetTransport is a session's connection on the client port.
type gnetTransport struct{ c gnet.Conn }

func (t gnetTransport) write(b []byte) { _, _ = t.c.Write(b) }

func (t gnetTransport) outboundBuffered() int { return t.c.OutboundBuffered() }

func (t gnetTransport) wake() { _ = t.c.Wake(nil) }

func (t gnetTransport) remoteAddr() net.Addr { return t.c.RemoteAddr() }

func (h *handler) OnTick() (time.Duration, gnet.Action) {
	h.srv.wakeOverdue()
	return progressScanInterval, gnet.None
}

// gnetLogger routes gnet's own logging into zerolog.
type gnetLogger struct{ l zerolog.Logger }

func (g gnetLogger) Debugf(f string, a ...any) { g.l.Debug().Msgf(f, a...) }
func (g gnetLogger) Infof(f string, a ...any)  { g.l.Debug().Msgf(f, a...) }
func (g gnetLogger) Warnf(f string, a ...any)  { g.l.Warn().Msgf(f, a...) }
func (g gnetLogger) Errorf(f string, a ...any) { g.l.Error().Msgf(f, a...) }
func (g gnetLogger) Fatalf(f string, a ...any) { g.l.Fatal().Msgf(f, a...) }
