package client_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/lockd/lockd/client"
	"github.com/lockd/lockd/engine"
	"github.com/lockd/lockd/internal/testcerts"
	"github.com/lockd/lockd/server"
)

// startTLSServer runs a server whose TLS port has a certificate ca signed
// for 127.0.0.1; with clientCA, it requires client certificates that
// clientCA signed.
func startTLSServer(t *testing.T, ca, clientCA *testcerts.CA) *server.Server {
	t.Helper()
	dir := t.TempDir()
	files := ca.WriteFiles(t, dir, "server", "127.0.0.1")
	clientCAFile := ""
	if clientCA != nil {
		clientCAFile = clientCA.WriteFiles(t, dir, "unused", "127.0.0.1").CA
	}
	tlsCfg, err := server.LoadTLSConfig(files.Cert, files.Key, clientCAFile)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.Start(server.Config{Listen: "127.0.0.1:0", TLSListen: "127.0.0.1:0", TLS: tlsCfg,
		Engine: engine.Config{Clock: engine.NewFakeClock()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return srv
}

// clientTLS writes a client certificate signed by issuer and returns the
// Config.TLS that trusts ca and presents it; nil issuer presents none.
func clientTLS(t *testing.T, ca, issuer *testcerts.CA) *client.Config {
	t.Helper()
	dir := t.TempDir()
	caFile := ca.WriteFiles(t, dir, "trust", "127.0.0.1").CA
	certFile, keyFile := "", ""
	if issuer != nil {
		f := issuer.WriteFiles(t, dir, "client", "client")
		certFile, keyFile = f.Cert, f.Key
	}
	tlsCfg, err := client.LoadTLSConfig(caFile, certFile, keyFile, "")
	if err != nil {
		t.Fatal(err)
	}
	return &client.Config{TLS: tlsCfg, Sessions: 1, WaitSpares: -1, DialTimeout: 2 * time.Second}
}

func dialWith(cfg *client.Config, addr string) (*client.Client, error) {
	cfg.Addrs = []string{addr}
	return client.Dial(context.Background(), *cfg)
}

// A client with Config.TLS acquires and releases through the TLS port,
// with and without mutual TLS.
func TestTLSClientAcquiresAndReleases(t *testing.T) {
	ca := testcerts.NewCA(t, "lockd test CA")
	for name, srv := range map[string]*server.Server{"tls": startTLSServer(t, ca, nil), "mtls": startTLSServer(t, ca, ca)} {
		c, err := dialWith(clientTLS(t, ca, ca), srv.TLSAddr())
		if err != nil {
			t.Fatalf("%s: dial: %v", name, err)
		}
		ticket, err := c.Acquire(context.Background(), "k", client.WaitFor(0))
		if err != nil {
			t.Fatalf("%s: acquire: %v", name, err)
		}
		if err := c.Release(context.Background(), ticket); err != nil {
			t.Fatalf("%s: release: %v", name, err)
		}
		c.Close()
	}
}

// Every failed TLS handshake is ErrTLS: a missing client certificate, one
// from another CA, a server certificate this client does not trust, and a
// server port without TLS.
func TestTLSRefusalsAreErrTLS(t *testing.T) {
	ca := testcerts.NewCA(t, "lockd test CA")
	other := testcerts.NewCA(t, "another CA")
	mtls := startTLSServer(t, ca, ca)
	for _, tc := range []struct {
		name string
		cfg  *client.Config
		addr string
	}{
		{"no client certificate", clientTLS(t, ca, nil), mtls.TLSAddr()},
		{"client certificate of another CA", clientTLS(t, ca, other), mtls.TLSAddr()},
		{"server certificate of an untrusted CA", clientTLS(t, other, ca), mtls.TLSAddr()},
		{"plain port", clientTLS(t, ca, ca), mtls.Addr()},
	} {
		c, err := dialWith(tc.cfg, tc.addr)
		if err == nil {
			c.Close()
			t.Fatalf("%s: dial succeeded", tc.name)
		}
		if !errors.Is(err, client.ErrTLS) {
			t.Errorf("%s: %v, want ErrTLS", tc.name, err)
		}
	}
}

// A client without TLS on the TLS port waits for a greeting that never
// comes: its dial ends at DialTimeout, not later, and not as ErrTLS.
func TestPlainClientOnTheTLSPortFailsWithinDialTimeout(t *testing.T) {
	ca := testcerts.NewCA(t, "lockd test CA")
	srv := startTLSServer(t, ca, nil)
	c, err := client.Dial(context.Background(), client.Config{Addrs: []string{srv.TLSAddr()}, Sessions: 1,
		WaitSpares: -1, DialTimeout: 300 * time.Millisecond})
	if err == nil {
		c.Close()
		t.Fatal("a plain client connected to the TLS port")
	}
	if !errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, client.ErrTLS) {
		t.Fatalf("dial: %v, want the dial deadline", err)
	}
}

func TestLoadTLSConfigRefusals(t *testing.T) {
	ca := testcerts.NewCA(t, "lockd test CA")
	f := ca.WriteFiles(t, t.TempDir(), "client", "client")
	if _, err := client.LoadTLSConfig(f.CA, f.Cert, "", ""); !errors.Is(err, client.ErrConfig) {
		t.Errorf("certificate without key: %v", err)
	}
	if _, err := client.LoadTLSConfig(f.Key, "", "", ""); !errors.Is(err, client.ErrConfig) {
		t.Errorf("a key as the CA file: %v", err)
	}
	if err := os.Chmod(f.Key, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := client.LoadTLSConfig(f.CA, f.Cert, f.Key, ""); !errors.Is(err, client.ErrConfig) ||
		!strings.Contains(err.Error(), f.Key) || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("a key others can read: %v", err)
	}
	cfg, err := client.LoadTLSConfig("", "", "", "locks.example")
	if err != nil || cfg.ServerName != "locks.example" || cfg.RootCAs != nil {
		t.Errorf("server name only: %+v %v", cfg, err)
	}
}
