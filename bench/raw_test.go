package bench

import (
	"context"
	"strings"
	"testing"

	"github.com/lockd/lockd/client/lockdtest"
	"github.com/lockd/lockd/codec"
	"github.com/lockd/lockd/engine"
	"github.com/lockd/lockd/server"
	"github.com/rs/zerolog"
)

// The bare-frame target authenticates as the client does (SPEC §7): the
// right tenant and secret get a connection that takes locks, and anything
// else is refused before the run starts.
func TestRawTargetAuthenticates(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	srv, err := server.Start(server.Config{
		Listen: "127.0.0.1:0",
		Logger: zerolog.Nop(),
		Auth:   map[string][]byte{"alpha": secret},
		Engine: engine.Config{},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	spec := TargetSpec{Scheme: SchemeLockd, Addr: srv.Addr()}
	ctx := context.Background()

	opts := testTargetOptions
	opts.Raw, opts.Conns, opts.Tenant, opts.Secret = true, 1, "alpha", secret
	target, err := Open(ctx, spec, opts)
	if err != nil {
		t.Fatalf("the tenant's own secret: %v", err)
	}
	defer target.Close()
	caller, err := target.NewCaller(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := caller.Acquire(ctx, "k", 0); out != Acquired || err != nil {
		t.Fatalf("acquire after the handshake: %v %v", out, err)
	}

	for name, tc := range map[string]struct {
		tenant string
		secret []byte
		says   string
	}{
		"no secret":    {"alpha", nil, "requires authentication"},
		"wrong secret": {"alpha", []byte("fedcba9876543210fedcba9876543210"), codec.AuthFailed.String()},
		"other tenant": {"beta", secret, codec.AuthFailed.String()},
	} {
		opts.Tenant, opts.Secret = tc.tenant, tc.secret
		if target, err := Open(ctx, spec, opts); err == nil {
			target.Close()
			t.Errorf("%s: the handshake passed", name)
		} else if !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: %v does not say %q", name, err, tc.says)
		}
	}
}

// A server that asks for authentication but cannot prove it knows the
// tenant's secret is refused: the WELCOME's MAC is checked, not trusted.
func TestRawTargetRefusesAServerThatCannotProveTheSecret(t *testing.T) {
	impostor, err := lockdtest.Start(func(c *lockdtest.Conn) {
		if _, err := c.Greet(true); err != nil {
			return
		}
		var req codec.Request
		if c.ReadRequest(&req) == nil && req.Op == codec.OpHello {
			_ = c.Welcome([codec.MACLen]byte{})
		}
		for c.ReadRequest(&req) == nil {
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { impostor.Close() })
	opts := testTargetOptions
	opts.Raw, opts.Conns, opts.Tenant, opts.Secret = true, 1, "alpha", []byte("0123456789abcdef0123456789abcdef")
	target, err := Open(context.Background(), TargetSpec{Scheme: SchemeLockd, Addr: impostor.Addr()}, opts)
	if err == nil {
		target.Close()
		t.Fatal("connected to a server whose MAC does not verify")
	}
	if !strings.Contains(err.Error(), "server MAC does not verify") {
		t.Fatalf("refused for another reason: %v", err)
	}
}
