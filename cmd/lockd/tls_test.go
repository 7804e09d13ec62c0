package main

import (
	"crypto/tls"
	"encoding/json"
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
