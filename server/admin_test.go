package server

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lockd/lockd/codec"
	"github.com/rs/zerolog"
)

func scrape(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(body)
}

func TestAdminEndpoints(t *testing.T) {
	s := startServer(t, func(cfg *Config) { cfg.Admin = "127.0.0.1:0"; cfg.Engine.MaxKeys = 10 })
	base := "http://" + s.AdminAddr()
	if code, body := scrape(t, base+"/healthz"); code != http.StatusOK || body != "ok\n" {
		t.Fatalf("/healthz: %d %q", code, body)
	}

	c := dial(t, s)
	var tokens []uint64
	for i := range 9 {
		tokens = append(tokens, c.mustAcquire(uint64(i+1), keyN(i)))
	}
	c.acquire(50, 30, 0, keyN(20))
	c.expect(codec.OpBusy, 50)
	c.send(codec.AppendRelease(nil, 51, tokens[0], keyN(0)))
	c.expect(codec.OpReleased, 51)
	c.send(codec.AppendAcquire(nil, 52, 0, 0, "k"))
	c.expectError(52, codec.BadLease)

	_, metrics := scrape(t, base+"/metrics")
	for _, want := range []string{
		`lockd_requests_total{op="acquire"} 11`,
		`lockd_responses_total{op="acquire",result="acquired"} 9`,
		`lockd_responses_total{op="acquire",result="busy"} 1`,
		`lockd_responses_total{op="release",result="released"} 1`,
		`lockd_errors_total{reason="bad_lease"} 1`,
		`lockd_gate_open{gate="keys"} 0`,
		`lockd_gate_refused_total{gate="keys"} 1`,
		`lockd_gate_count{gate="keys"} 8`,
		`lockd_gate_limit{gate="keys"} 10`,
		"lockd_keys 8\n",
		"lockd_connections 1\n",
		fmt.Sprintf("lockd_token_highest_issued %d\n", slices.Max(tokens)),
		"lockd_tokens_issued_total 9\n",
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if t.Failed() {
		t.Log(metrics)
	}
}

// TestHealthzAnswers503ThroughTheDrainGrace: from the first moment of a
// drain /healthz answers 503, and keeps answering it until the grace has
// passed, so that a load balancer polling it sees the node leave before
// the ports close.
func TestHealthzAnswers503ThroughTheDrainGrace(t *testing.T) {
	const grace = 2 * time.Second
	s := startServer(t, func(cfg *Config) { cfg.Admin = "127.0.0.1:0"; cfg.DrainGrace = grace })
	url := "http://" + s.AdminAddr() + "/healthz"
	c := dial(t, s)

	began := time.Now()
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	// The first request that was not answered ok must be a 503, and so
	// must every later one until the port closes.
	answered503 := 0
	for {
		resp, err := http.Get(url)
		if err != nil {
			break // the admin port closed
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		switch {
		case resp.StatusCode == http.StatusOK && answered503 == 0:
		case resp.StatusCode == http.StatusServiceUnavailable && string(body) == "draining\n":
			answered503++
		default:
			t.Fatalf("/healthz during the drain: %d %q after %d answers 503", resp.StatusCode, body, answered503)
		}
		if answered503 == 1 {
			// Meanwhile the lock port refuses new work.
			c.send(codec.AppendPing(nil, 7))
			c.expectError(7, codec.ShuttingDown)
		}
	}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	if answered503 == 0 {
		t.Fatal("the admin port closed before /healthz answered 503")
	}
	if took := time.Since(began); took < grace {
		t.Fatalf("the ports closed %v after the drain began, before the %v grace", took, grace)
	}
}

func TestAdminRefusesNonLoopbackWithoutTheFlag(t *testing.T) {
	_, err := Start(Config{Listen: "127.0.0.1:0", Admin: "0.0.0.0:0", Logger: zerolog.Nop()})
	if err == nil || !strings.Contains(err.Error(), "0.0.0.0:0") || !strings.Contains(err.Error(), "--insecure-admin") {
		t.Fatalf("admin on every interface: %v; want a refusal naming the address and --insecure-admin", err)
	}
	if err := checkExposure(Config{Listen: "127.0.0.1:0", Admin: "0.0.0.0:0", InsecureAdmin: true}); err != nil {
		t.Fatalf("with --insecure-admin: %v", err)
	}
	if err := checkExposure(Config{Listen: "127.0.0.1:0", Admin: "localhost:0"}); err != nil {
		t.Fatalf("loopback: %v", err)
	}
}

// TestAdminClosesIdleConnections: a keep-alive connection left idle is
// closed by the server, so idle clients cannot pile up descriptors.
func TestAdminClosesIdleConnections(t *testing.T) {
	s := startServer(t, func(cfg *Config) { cfg.Admin = "127.0.0.1:0"; cfg.AdminIdleTimeout = 100 * time.Millisecond })
	nc, err := net.Dial("tcp", s.AdminAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(ioTimeout))
	if _, err := io.WriteString(nc, "GET /healthz HTTP/1.1\r\nHost: lockd\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(nc), nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("/healthz: %v %v", resp, err)
	}
	if _, err := io.ReadAll(resp.Body); err != nil {
		t.Fatal(err)
	}
	if n, err := nc.Read(make([]byte, 1)); n != 0 || !errors.Is(err, io.EOF) {
		t.Fatalf("idle keep-alive connection: read %d, %v; want the server to close it", n, err)
	}
}

// TestAdminConnectionCap: past AdminMaxConns, a new connection is not
// served until an open one closes.
func TestAdminConnectionCap(t *testing.T) {
	s := startServer(t, func(cfg *Config) { cfg.Admin = "127.0.0.1:0"; cfg.AdminMaxConns = 2 })
	var held []net.Conn
	for range 2 {
		nc, err := net.Dial("tcp", s.AdminAddr())
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		held = append(held, nc)
	}
	third, err := net.Dial("tcp", s.AdminAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer third.Close()
	if _, err := io.WriteString(third, "GET /healthz HTTP/1.1\r\nHost: lockd\r\nConnection: close\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	// Nothing can answer it while two connections are open. (A wrong
	// server answers within this bound; a right one never does.)
	_ = third.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if n, err := third.Read(make([]byte, 1)); n != 0 || !isTimeout(err) {
		t.Fatalf("a connection past the cap was served: %d %v", n, err)
	}
	held[0].Close()
	_ = third.SetReadDeadline(time.Now().Add(ioTimeout))
	resp, err := http.ReadResponse(bufio.NewReader(third), nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("once a connection closed, the waiting one must be served: %v %v", resp, err)
	}
	resp.Body.Close()
}
