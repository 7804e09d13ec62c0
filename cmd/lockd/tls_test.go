package main

import (
	"crypto/tls"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/lockd/lockd/codec"
	"github.com/lockd/lockd/internal/testcerts"
)

// lockd serve --tls-listen serves the client protocol over mutual TLS
// with the files given, and refuses a key the group can read.
func TestServeTLSFlags(t *testing.T) {
	bin := buildLockd(t)
	ca := testcerts.NewCA(t, "lockd test CA")
	dir := t.TempDir()
	files := ca.WriteFiles(t, dir, "server", "127.0.0.1")
	p := startLockd(t, bin, t.TempDir(), "--data-dir", "", "--tls-listen", "127.0.0.1:0",
		"--tls-cert", files.Cert, "--tls-key", files.Key, "--tls-client-ca", files.CA)
	var tlsAddr string
	for _, line := range strings.Split(p.startLog, "\n") {
		var l struct {
			Message   string
			TLSListen string `json:"tls_listen"`
			MTLS      bool   `json:"mtls"`
		}
		if json.Unmarshal([]byte(line), &l) == nil && l.Message == "lockd serving" {
			if !l.MTLS {
				t.Errorf("start log does not say mutual TLS: %s", line)
			}
			tlsAddr = l.TLSListen
		}
	}
	if tlsAddr == "" {
		t.Fatalf("no tls_listen in the start log:\n%s", p.startLog)
	}
	nc, err := tls.Dial("tcp", tlsAddr, &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{ca.Issue(t, "client")}})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(5 * time.Second))
	rr := codec.NewResponseReader(nc, 4096)
	var greeting codec.Response
	if err := rr.Next(&greeting); err != nil || greeting.Op != codec.OpGreeting {
		t.Fatalf("greeting over TLS: %q %v", greeting.Op, err)
	}

	if err := os.Chmod(files.Key, 0o640); err != nil {
		t.Fatal(err)
	}
	out := refusedStart(t, bin, "--data-dir", "", "--tls-listen", "127.0.0.1:0", "--tls-cert", files.Cert, "--tls-key", files.Key)
	if !strings.Contains(out, files.Key) || !strings.Contains(out, "chmod 600") {
		t.Fatalf("a group-readable key: %s", out)
	}
}

// lockd serve --admin-tls-cert, --admin-tls-key and --admin-tls-client-ca
// serve the admin endpoint over HTTPS, taking a client certificate the CA
// signed for the lock inspection and refusing a client without one, and
// let it listen on every interface without --insecure-admin; the flags
// are refused apart or without --admin.
func TestServeAdminTLSFlags(t *testing.T) {
	bin := buildLockd(t)
	ca := testcerts.NewCA(t, "lockd admin CA")
	files := ca.WriteFiles(t, t.TempDir(), "admin", "127.0.0.1")
	p := startLockd(t, bin, t.TempDir(), "--data-dir", "", "--admin", "0.0.0.0:0",
		"--admin-tls-cert", files.Cert, "--admin-tls-key", files.Key, "--admin-tls-client-ca", files.CA)
	var admin string
	for _, line := range strings.Split(p.startLog, "\n") {
		var l struct {
			Message, Admin string
			ClientCerts    bool `json:"admin_client_certs"`
		}
		if json.Unmarshal([]byte(line), &l) == nil && l.Message == "lockd serving" && l.ClientCerts {
			admin = l.Admin
		}
	}
	_, port, err := net.SplitHostPort(admin)
	if err != nil {
		t.Fatalf("no admin address with client certificates in the start log (%v):\n%s", err, p.startLog)
	}
	get := func(certs ...tls.Certificate) (int, error) {
		c := http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true,
			TLSClientConfig: &tls.Config{RootCAs: ca.Pool(), Certificates: certs}}}
		resp, err := c.Get("https://127.0.0.1:" + port + "/v1/locks/default/k")
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	if code, err := get(ca.Issue(t, "operator")); err != nil || code != http.StatusOK {
		t.Fatalf("lock inspection with a certificate of the CA: %d %v", code, err)
	}
	if code, err := get(); err != nil || code != http.StatusUnauthorized {
		t.Fatalf("lock inspection without a certificate: %d %v, want 401", code, err)
	}

	out := refusedStart(t, bin, "--data-dir", "", "--admin", "0.0.0.0:0", "--admin-tls-cert", files.Cert, "--admin-tls-key", files.Key)
	if !strings.Contains(out, "--admin-tls-client-ca") || !strings.Contains(out, "--insecure-admin") {
		t.Fatalf("HTTPS on every interface that authenticates no one: %s", out)
	}
	none := func(string) (string, bool) { return "", false }
	for _, args := range [][]string{
		{"--admin-tls-cert", files.Cert},
		{"--admin-tls-client-ca", files.CA},
		{"--admin", "", "--admin-tls-cert", files.Cert, "--admin-tls-key", files.Key},
	} {
		if _, err := parseServeOptions(args, none); err == nil || !strings.Contains(err.Error(), "--admin-tls-") {
			t.Errorf("%q: %v, want refused", args, err)
		}
	}
}
