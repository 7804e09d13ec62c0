package server

import (
	"net"
	"strings"
	"testing"

	"github.com/lockd/lockd/codec"
)

// With two tenants, one tenant holding --max-conns connections locked the
// other out (EOF before the greeting). Each tenant now holds at most its
// share: a fair one, or its auth file's conns=N.
func TestTenantConnectionShares(t *testing.T) {
	alpha, beta := []byte("alpha-secret-0123456789"), []byte("beta-secret-0123456789")
	const maxConns, handshakes = 12, 2
	s := startServer(t, func(cfg *Config) {
		cfg.Admin = "127.0.0.1:0"
		cfg.MaxConns, cfg.MaxHandshakes = maxConns, handshakes
		cfg.Auth = map[string][]byte{"alpha": alpha, "beta": beta}
		cfg.TenantConns = func(tenant string) int {
			if tenant == "beta" {
				return 3
			}
			return 0
		}
	})
	// alpha's fair share: (12 - 2) / 2 = 5.
	for i := range 5 {
		if r := dial(t, s).hello("alpha", alpha); r.Op != codec.OpWelcome {
			t.Fatalf("alpha connection %d: %q %v", i+1, r.Op, r.Reason)
		}
	}
	over := dial(t, s)
	var nonce [codec.NonceLen]byte
	over.send(codec.AppendHello(nil, nonce, codec.ClientMAC(alpha, over.greeting.ServerNonce, nonce, []byte("alpha")), "alpha"))
	over.expectClosed()
	for i := range 3 {
		if r := dial(t, s).hello("beta", beta); r.Op != codec.OpWelcome {
			t.Fatalf("beta connection %d while alpha holds its share: %q %v", i+1, r.Op, r.Reason)
		}
	}
	beyond := dial(t, s)
	beyond.send(codec.AppendHello(nil, nonce, codec.ClientMAC(beta, beyond.greeting.ServerNonce, nonce, []byte("beta")), "beta"))
	beyond.expectClosed()
	_, metrics := scrape(t, "http://"+s.AdminAddr()+"/metrics")
	for _, want := range []string{`lockd_tenant_connections{tenant="alpha"} 5`, `lockd_tenant_connections_limit{tenant="beta"} 3`,
		`lockd_tenant_connections_refused_total{tenant="alpha"} 1`, `lockd_tenant_connections_refused_total{tenant="beta"} 1`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// Connections that never authenticate take the handshake budget only:
// past it they are closed before the greeting, and the tenants' own
// connections still get in. Each must send HELLO within HandshakeTimeout.
func TestHandshakeBudget(t *testing.T) {
	alpha := []byte("alpha-secret-0123456789")
	s := startServer(t, func(cfg *Config) {
		cfg.Admin = "127.0.0.1:0"
		cfg.MaxConns, cfg.MaxHandshakes = 10, 2
		cfg.Auth = map[string][]byte{"alpha": alpha}
	})
	idle := []*testConn{dial(t, s), dial(t, s)}
	nc, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if err := expectRefused(nc); err != nil {
		t.Fatalf("a third connection before HELLO: %v", err)
	}
	s.clock.Advance(HandshakeTimeout)
	for _, c := range idle {
		c.expectError(0, codec.AuthRequired)
		c.expectClosed()
	}
	waitFor(t, func() bool { return s.conns.Load() == 0 })
	for i := range 8 {
		if r := dial(t, s).hello("alpha", alpha); r.Op != codec.OpWelcome {
			t.Fatalf("connection %d: %q %v", i+1, r.Op, r.Reason)
		}
	}
	_, metrics := scrape(t, "http://"+s.AdminAddr()+"/metrics")
	for _, want := range []string{"lockd_handshakes_refused_total 1", "lockd_handshakes_limit 2", "lockd_handshakes_open 0"} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}
