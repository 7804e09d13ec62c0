package client

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"time"

	"github.com/lockd/lockd/codec"
	"github.com/lockd/lockd/internal/defaults"
)

const (
	defaultMaxInFlight       = 4096
	defaultWaitSessions      = 64
	defaultWaitSpares        = 2
	defaultDialTimeout       = 5 * time.Second
	defaultCompensationQueue = 256
	defaultSilenceTimeout    = 2 * time.Second
	// minSilenceTimeout keeps a session from being closed by a scheduling
	// hiccup, and its PINGs few.
	minSilenceTimeout = 100 * time.Millisecond
)

// Config configures Dial.
type Config struct {
	// Addrs are the servers, "host:port"; at least one. Sessions are
	// spread over them and move on to the next address when one fails.
	Addrs []string
	// Tenant is the tenant's name; required with Secret. Empty with no
	// Secret means the server's default tenant, without HELLO.
	Tenant string
	// Secret is the tenant's shared secret. With a secret the client
	// authenticates and insists that the server proves the secret too.
	Secret []byte
	// Sessions is the number of shared, pipelined sessions, which carry
	// releases and acquires with Wait 0; default one per address in Addrs.
	Sessions int
	// MaxInFlight caps the acquires queued or in flight per shared
	// session; default 4096, the server's default per connection.
	// Releases have a reserve of a quarter more, so that a pool full of
	// acquires can still release.
	MaxInFlight int
	// WaitSessions caps the wait sessions, each carrying one acquire with
	// a Wait at a time; default 64.
	WaitSessions int
	// WaitSpares is how many idle wait sessions the client keeps
	// connected ahead of need; default 2, negative for none (the first
	// waiting acquire then waits for a dial).
	WaitSpares int
	// DialTimeout bounds a connect plus handshake; default 5 s.
	DialTimeout time.Duration
	// CompensationQueue bounds the compensating releases waiting to be
	// sent; default 256. When it is full, a lock the client could not hand
	// over is left to its lease, and Stats counts it.
	CompensationQueue int
	// SilenceTimeout closes a session that hears nothing from its server
	// for this long with a request in flight on it, as if that request's
	// deadline had come (SPEC §6a): an acquire in flight ends
	// ErrIndeterminate and is abandoned, a release or renewal moves to
	// another session. Every session, idle or not, sends a PING when it
	// has heard nothing for a third of it, so a live server, even one
	// holding a waiting acquire for minutes, always breaks the silence,
	// and a stopped one is found out within the timeout of its stop: an
	// idle session costs a PING every two thirds of it. A session whose
	// PING went unanswered for a third is passed over while another is
	// ready; one is closed after at least SilenceTimeout of silence and
	// at most about a third more, and the client then dials other
	// addresses for five timeouts. A handshake, too, has at most this
	// long (within DialTimeout). Default 2 s; at least 100 ms.
	SilenceTimeout time.Duration
	// Dialer opens connections; default a net.Dialer.
	Dialer func(ctx context.Context, network, addr string) (net.Conn, error)
	// TLS, when set, runs every session over TLS with this configuration
	// (the server's TLS port, lockd serve --tls-listen), the handshake
	// within DialTimeout. An empty ServerName is taken from each address's
	// host. LoadTLSConfig builds one from PEM files.
	TLS *tls.Config
}

func (cfg Config) normalize() (Config, error) {
	if len(cfg.Addrs) == 0 {
		return cfg, fmt.Errorf("%w: no server address", ErrConfig)
	}
	for _, a := range cfg.Addrs {
		if a == "" {
			return cfg, fmt.Errorf("%w: empty server address", ErrConfig)
		}
	}
	if cfg.Tenant != "" && !codec.ValidTenant([]byte(cfg.Tenant)) {
		return cfg, fmt.Errorf("%w: tenant %q is not 1..32 bytes of [A-Za-z0-9._-]", ErrConfig, cfg.Tenant)
	}
	if len(cfg.Secret) != 0 && cfg.Tenant == "" {
		return cfg, fmt.Errorf("%w: a secret needs a tenant", ErrConfig)
	}
	if cfg.Sessions < 0 || cfg.MaxInFlight < 0 || cfg.WaitSessions < 0 || cfg.DialTimeout < 0 || cfg.CompensationQueue < 0 || cfg.SilenceTimeout < 0 {
		return cfg, fmt.Errorf("%w: negative Sessions, MaxInFlight, WaitSessions, DialTimeout, CompensationQueue or SilenceTimeout", ErrConfig)
	}
	cfg.Addrs = append([]string(nil), cfg.Addrs...)
	cfg.Secret = append([]byte(nil), cfg.Secret...)
	cfg.Sessions = defaults.Or(cfg.Sessions, len(cfg.Addrs))
	cfg.MaxInFlight = defaults.Or(cfg.MaxInFlight, defaultMaxInFlight)
	cfg.WaitSessions = defaults.Or(cfg.WaitSessions, defaultWaitSessions)
	switch {
	case cfg.WaitSpares == 0:
		cfg.WaitSpares = min(defaultWaitSpares, cfg.WaitSessions)
	case cfg.WaitSpares > cfg.WaitSessions:
		return cfg, fmt.Errorf("%w: WaitSpares %d exceeds WaitSessions %d", ErrConfig, cfg.WaitSpares, cfg.WaitSessions)
	}
	cfg.DialTimeout = defaults.Or(cfg.DialTimeout, defaultDialTimeout)
	cfg.CompensationQueue = defaults.Or(cfg.CompensationQueue, defaultCompensationQueue)
	cfg.SilenceTimeout = defaults.Or(cfg.SilenceTimeout, defaultSilenceTimeout)
	if cfg.SilenceTimeout < minSilenceTimeout {
		return cfg, fmt.Errorf("%w: SilenceTimeout %v is below %v", ErrConfig, cfg.SilenceTimeout, minSilenceTimeout)
	}
	if cfg.Dialer == nil {
		cfg.Dialer = (&net.Dialer{}).DialContext
	}
	return cfg, nil
}
