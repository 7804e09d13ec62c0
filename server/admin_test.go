package server

import (
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/lockd/lockd/codec"
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
		"lockd_held_locks 8\n",
		"lockd_connections 1\n",
		fmt.Sprintf("lockd_token_counter %d\n", slices.Max(tokens)),
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
