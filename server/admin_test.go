package server

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
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
		`lockd_gate_used{gate="keys"} 8`,
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
	if err := exposureError(Config{Listen: "127.0.0.1:0", Admin: "0.0.0.0:0", InsecureAdmin: true}); err != nil {
		t.Fatalf("with --insecure-admin: %v", err)
	}
	if err := exposureError(Config{Listen: "127.0.0.1:0", Admin: "localhost:0"}); err != nil {
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

// TestAdminSlowClientsDoNotStallHealthz: clients that declare a request
// body and never send it held every admin slot with no end, so /healthz
// stopped answering (a liveness probe then restarts the node). Past
// AdminMaxConns a connection is still answered, for /healthz only, and a
// body that does not arrive closes its connection after the read timeout.
func TestAdminSlowClientsDoNotStallHealthz(t *testing.T) {
	s := startServer(t, func(cfg *Config) { cfg.Admin = "127.0.0.1:0"; cfg.AdminMaxConns = 2 })
	var slow []net.Conn
	for range 4 {
		nc, err := net.Dial("tcp", s.AdminAddr())
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		if _, err := io.WriteString(nc, "POST /v1/locks/x HTTP/1.1\r\nHost: lockd\r\nContent-Length: 100\r\n\r\n{"); err != nil {
			t.Fatal(err)
		}
		slow = append(slow, nc)
	}
	get := func(path string) int {
		t.Helper()
		c := http.Client{Timeout: ioTimeout, Transport: &http.Transport{DisableKeepAlives: true}}
		resp, err := c.Get("http://" + s.AdminAddr() + path)
		if err != nil {
			t.Fatalf("%s while slow clients hold the admin slots: %v", path, err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := get("/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz while slow clients hold the admin slots: %d", code)
	}
	if code := get("/metrics"); code != http.StatusServiceUnavailable {
		t.Fatalf("/metrics past the admin connection cap: %d, want 503", code)
	}
	for i, nc := range slow {
		_ = nc.SetReadDeadline(time.Now().Add(adminReadTimeout + ioTimeout))
		if _, err := io.Copy(io.Discard, nc); err != nil {
			t.Fatalf("slow client %d: %v; want its connection closed after the read timeout", i, err)
		}
	}
}

// probeHeldFor opens a connection to addr, which must be past the admin
// connection cap, sends it first (half a request, or nothing), and
// reports how long the server kept the connection open.
func probeHeldFor(t *testing.T, addr, first string) time.Duration {
	t.Helper()
	probe, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer probe.Close()
	if _, err := io.WriteString(probe, first); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_ = probe.SetReadDeadline(start.Add(adminReadTimeout + ioTimeout))
	if _, err := io.Copy(io.Discard, probe); err != nil {
		t.Fatalf("a stalled probe connection: %v, want it closed by the server", err)
	}
	return time.Since(start)
}

// A connection past the admin connection cap has adminProbeTimeout for
// its whole exchange: the server's own read deadlines (5 s for the
// headers) used to replace it, so stalled probes held their room longer.
func TestAdminProbeConnectionsEndInTheirTime(t *testing.T) {
	s := startServer(t, func(cfg *Config) { cfg.Admin = "127.0.0.1:0"; cfg.AdminMaxConns = 1 })
	hold, err := net.Dial("tcp", s.AdminAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Close()
	if held := probeHeldFor(t, s.AdminAddr(), "GET /healthz HTTP/1.1\r\n"); held >= adminReadHeaderTimeout {
		t.Fatalf("a probe that stalls in its headers was held %v, past its %v", held, adminProbeTimeout)
	}
}

// A request body past adminMaxBodyBytes is refused, not read on.
func TestAdminBodyLimit(t *testing.T) {
	got := make(chan error, 1)
	s := startServer(t, func(cfg *Config) {
		cfg.Admin = "127.0.0.1:0"
		cfg.AdminRoutes = map[string]http.Handler{"/v1/x/": http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, err := io.Copy(io.Discard, r.Body)
			got <- err
		})}
	})
	resp, err := http.Post("http://"+s.AdminAddr()+"/v1/x/", "application/json", strings.NewReader(strings.Repeat("x", adminMaxBodyBytes+1)))
	if err == nil {
		resp.Body.Close()
	}
	var tooLarge *http.MaxBytesError
	if err := <-got; !errors.As(err, &tooLarge) {
		t.Fatalf("reading a %d-byte body: %v; want http.MaxBytesError", adminMaxBodyBytes+1, err)
	}
}

// Without the bearer token, the routes that change the membership or show
// lock state answer 401 and do nothing (a rogue node was added to a
// cluster with one POST); /healthz and /metrics stay open.
func TestAdminTokenGuardsRoutes(t *testing.T) {
	token := []byte("0123456789abcdef0123456789abcdef")
	called := make(chan string, 8)
	s := startServer(t, func(cfg *Config) {
		cfg.Admin = "127.0.0.1:0"
		cfg.AdminToken = token
		cfg.AdminRoutes = map[string]http.Handler{"/v1/cluster/": http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			called <- r.Method + " " + r.URL.Path
		})}
	})
	do := func(method, path, auth string) int {
		t.Helper()
		req, err := http.NewRequest(method, "http://"+s.AdminAddr()+path, strings.NewReader(`{"id": 9, "raft_addr": "10.0.0.9:7451"}`))
		if err != nil {
			t.Fatal(err)
		}
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, r := range []struct{ method, path, auth string }{
		{"POST", "/v1/cluster/members", ""},
		{"DELETE", "/v1/cluster/members/3", ""},
		{"GET", "/v1/cluster/members", "Bearer wrong-token-wrong-token-wrong"},
		{"GET", "/v1/locks/default/k", ""},
		{"GET", "/v1/locks/default", "Basic " + string(token)},
	} {
		if code := do(r.method, r.path, r.auth); code != http.StatusUnauthorized {
			t.Errorf("%s %s with %q: %d, want 401", r.method, r.path, r.auth, code)
		}
	}
	select {
	case c := <-called:
		t.Fatalf("a request without the token reached %s", c)
	default:
	}
	if code := do("POST", "/v1/cluster/members", "Bearer "+string(token)); code != http.StatusOK || <-called != "POST /v1/cluster/members" {
		t.Fatalf("with the token: %d", code)
	}
	if code := do("GET", "/v1/locks/default/k", "Bearer "+string(token)); code != http.StatusOK {
		t.Fatalf("lock inspection with the token: %d", code)
	}
	for _, path := range []string{"/healthz", "/metrics"} {
		if code := do("GET", path, ""); code != http.StatusOK {
			t.Errorf("%s without the token: %d, want 200", path, code)
		}
	}
	if err := exposureError(Config{Listen: "127.0.0.1:0", Admin: "0.0.0.0:0", AdminToken: token}); err != nil {
		t.Fatalf("a non-loopback admin endpoint with a token: %v", err)
	}
}

func TestLoadAdminToken(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		return path
	}
	if tok, err := LoadAdminToken(write("ok", "0123456789abcdef0123\n", 0o600)); err != nil || string(tok) != "0123456789abcdef0123" {
		t.Fatalf("a good token file: %q %v", tok, err)
	}
	if _, err := LoadAdminToken(write("readable", "0123456789abcdef0123\n", 0o644)); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("a token file others can read: %v", err)
	}
	if _, err := LoadAdminToken(write("short", "short\n", 0o600)); err == nil || !strings.Contains(err.Error(), "openssl rand") {
		t.Fatalf("a short token: %v", err)
	}
}
