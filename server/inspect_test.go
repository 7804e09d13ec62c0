package server

import (
	"encoding/json"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lockd/lockd/codec"
)

// getJSON GETs url and decodes a 200 answer into v; it returns the
// status code, and the error message of a JSON error answer.
func getJSON(t *testing.T, method, url string, v any) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("%s %s: Content-Type %q", method, url, ct)
	}
	if resp.StatusCode != http.StatusOK {
		var e struct{ Error string }
		if err := json.NewDecoder(resp.Body).Decode(&e); err != nil || e.Error == "" {
			t.Fatalf("%s %s: %d without a JSON error: %v", method, url, resp.StatusCode, err)
		}
		return resp.StatusCode, e.Error
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	return resp.StatusCode, ""
}

// TestInspectOneLock: GET /v1/locks/{tenant}/{key} shows a held key's
// token, the lease left on the server's clock, its waiters, the node that
// answered and the address of the connection the grant went to (a grant
// answered at once, then one handed to a waiter); a lapsed lease shows as
// not held; a key may hold '/', "." and ".." and is matched as given.
func TestInspectOneLock(t *testing.T) {
	s := startServer(t, func(cfg *Config) { cfg.Admin = "127.0.0.1:0" })
	base := "http://" + s.AdminAddr() + "/v1/locks/default/"
	c, waiter := dial(t, s), dial(t, s)
	token := c.mustAcquire(1, "jobs/../nightly")
	waiter.acquire(2, 30, 60, "jobs/../nightly")
	waitFor(t, func() bool { return s.Engine().Stats().Waiters == 1 })
	s.advance(4 * time.Second)

	var got LockStatus
	getJSON(t, "GET", base+"jobs/../nightly", &got)
	want := LockStatus{Tenant: "default", Key: "jobs/../nightly", Held: true, Token: token, LeaseRemainingMs: 26_000, HeldForMs: 4_000, Waiters: 1, Node: "test-node", RemoteAddr: c.nc.LocalAddr().String()}
	if got != want {
		t.Errorf("held key: %+v, want %+v", got, want)
	}
	// The same key percent-encoded, as lockctl sends it.
	getJSON(t, "GET", base+url.PathEscape("jobs/../nightly"), &got)
	if got != want {
		t.Errorf("escaped key: %+v, want %+v", got, want)
	}
	getJSON(t, "GET", base+"nightly", &got)
	if want := (LockStatus{Tenant: "default", Key: "nightly", Node: "test-node"}); got != want {
		t.Errorf("absent key: %+v, want %+v", got, want)
	}
	getJSON(t, "GET", "http://"+s.AdminAddr()+"/v1/locks/nobody/jobs", &got)
	if want := (LockStatus{Tenant: "nobody", Key: "jobs", Node: "test-node"}); got != want {
		t.Errorf("unknown tenant: %+v, want %+v", got, want)
	}

	s.clock.Advance(26 * time.Second) // the lease lapses; the engine has not ticked
	getJSON(t, "GET", base+"jobs/../nightly", &got)
	if want := (LockStatus{Tenant: "default", Key: "jobs/../nightly", Waiters: 1, Node: "test-node"}); got != want {
		t.Errorf("lapsed lease: %+v, want %+v", got, want)
	}
	s.Engine().Tick()
	next := waiter.expect(codec.OpAcquired, 2).Token
	getJSON(t, "GET", base+"jobs/../nightly", &got)
	if from := waiter.nc.LocalAddr().String(); !got.Held || got.Token != next || got.Waiters != 0 || got.RemoteAddr != from {
		t.Errorf("after the hand-off: %+v, want token %d held, no waiters, remote %s", got, next, from)
	}
}

// TestListLocks: GET /v1/locks/{tenant}?prefix=&limit= lists the held keys
// in key order, at most limit, only the tenant's.
func TestListLocks(t *testing.T) {
	auth, err := ParseAuth(strings.NewReader("acme:" + strings.Repeat("ab", MinSecretLen) + "\nother:" + strings.Repeat("cd", MinSecretLen) + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	s := startServer(t, func(cfg *Config) { cfg.Admin = "127.0.0.1:0"; cfg.Auth = auth.Secrets })
	acme, other := dial(t, s), dial(t, s)
	acme.hello("acme", auth.Secrets["acme"])
	other.hello("other", auth.Secrets["other"])
	for i, key := range []string{"job/c", "job/a", "cron/x", "job/b"} {
		acme.mustAcquire(uint64(i+1), key)
	}
	other.mustAcquire(1, "job/z")
	base := "http://" + s.AdminAddr() + "/v1/locks/"

	keys := func(list []LockStatus) []string {
		var out []string
		for _, l := range list {
			if !l.Held || l.Tenant != "acme" || l.Node != "test-node" || l.LeaseRemainingMs != 30_000 {
				t.Errorf("listed %+v", l)
			}
			out = append(out, l.Key)
		}
		return out
	}
	for _, tt := range []struct {
		query string
		want  []string
	}{
		{"", []string{"cron/x", "job/a", "job/b", "job/c"}},
		{"?prefix=job/", []string{"job/a", "job/b", "job/c"}},
		{"?prefix=job/&limit=2", []string{"job/a", "job/b"}},
		{"?limit=1000", []string{"cron/x", "job/a", "job/b", "job/c"}},
		{"?prefix=nothing", nil},
	} {
		var list []LockStatus
		getJSON(t, "GET", base+"acme"+tt.query, &list)
		if got := keys(list); !slices.Equal(got, tt.want) {
			t.Errorf("%s: %v, want %v", tt.query, got, tt.want)
		}
	}
	var list []LockStatus
	getJSON(t, "GET", base+"nobody", &list)
	if list == nil || len(list) != 0 {
		t.Errorf("unknown tenant: %#v, want an empty list", list)
	}
}

// TestInspectionRefusesBadInput: a tenant or key that breaks SPEC §3/§4,
// a prefix with a space, a limit out of 1..1000, or a method other than
// GET is answered with a JSON error, never a panic or a redirect.
func TestInspectionRefusesBadInput(t *testing.T) {
	s := startServer(t, func(cfg *Config) { cfg.Admin = "127.0.0.1:0" })
	base := "http://" + s.AdminAddr() + "/v1/locks/"
	for _, tt := range []struct {
		method, path string
		code         int
		mentions     string
	}{
		{"GET", "bad!tenant/k", http.StatusBadRequest, "tenant"},
		{"GET", strings.Repeat("t", 33), http.StatusBadRequest, "tenant"},
		{"GET", "/k", http.StatusBadRequest, "tenant"},
		{"GET", "default/", http.StatusBadRequest, "key"},
		{"GET", "default/" + strings.Repeat("k", 129), http.StatusBadRequest, "key"},
		{"GET", "default/a%20b", http.StatusBadRequest, "key"},
		{"GET", "default/%ff", http.StatusBadRequest, "key"},
		{"GET", "default?prefix=a%20b", http.StatusBadRequest, "prefix"},
		{"GET", "default?limit=0", http.StatusBadRequest, "limit"},
		{"GET", "default?limit=1001", http.StatusBadRequest, "limit"},
		{"GET", "default?limit=ten", http.StatusBadRequest, "limit"},
		{"POST", "default/k", http.StatusMethodNotAllowed, "GET"},
		{"DELETE", "default/k", http.StatusMethodNotAllowed, "GET"},
	} {
		code, msg := getJSON(t, tt.method, base+tt.path, nil)
		if code != tt.code || !strings.Contains(msg, tt.mentions) {
			t.Errorf("%s %s: %d %q, want %d naming %s", tt.method, tt.path, code, msg, tt.code, tt.mentions)
		}
	}
	// /healthz and /metrics are still the mux's.
	if code, body := scrape(t, "http://"+s.AdminAddr()+"/healthz"); code != http.StatusOK || body != "ok\n" {
		t.Errorf("/healthz: %d %q", code, body)
	}
}

// A backend that cannot show its locks answers 501 with a JSON error.
func TestInspectionNeedsAnInspectingBackend(t *testing.T) {
	s := startServer(t, func(cfg *Config) { cfg.Admin = "127.0.0.1:0"; cfg.Backend = new(grantingBackend) })
	for _, path := range []string{"default/k", "default"} {
		code, msg := getJSON(t, "GET", "http://"+s.AdminAddr()+"/v1/locks/"+path, nil)
		if code != http.StatusNotImplemented || !strings.Contains(msg, "cannot show its locks") {
			t.Errorf("%s: %d %q, want 501", path, code, msg)
		}
	}
}
