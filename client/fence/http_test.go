package fence_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/lockd/lockd/client/fence"
)

// failing is a store whose database is down.
type failing struct{}

func (failing) Fence(context.Context, string, uint64) error { return errors.New("connection refused") }

func TestHandler(t *testing.T) {
	var marks fence.Memory
	served := 0
	h := fence.Handler(&marks, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served++
		w.WriteHeader(http.StatusNoContent)
	}))
	request := func(headers ...string) *http.Request {
		r := httptest.NewRequest(http.MethodPost, "/invoice/42", nil)
		for i := 0; i < len(headers); i += 2 {
			r.Header.Add(headers[i], headers[i+1])
		}
		return r
	}
	for _, c := range []struct {
		name   string
		req    *http.Request
		status int
		body   string // a part of the body
	}{
		{"no headers", request(), 400, "Lockd-Key"},
		{"no token", request("Lockd-Key", "k"), 400, "Lockd-Token"},
		{"token not a number", request("Lockd-Key", "k", "Lockd-Token", "5x"), 400, "decimal"},
		{"token negative", request("Lockd-Key", "k", "Lockd-Token", "-5"), 400, "decimal"},
		{"two tokens", request("Lockd-Key", "k", "Lockd-Token", "5", "Lockd-Token", "6"), 400, "one Lockd-Token"},
		{"token 0", request("Lockd-Key", "k", "Lockd-Token", "0"), 400, "bad token"},
		{"key with a space", request("Lockd-Key", "a b", "Lockd-Token", "5"), 400, "bad key"},
		{"first token", request("Lockd-Key", "k", "Lockd-Token", "5"), 204, ""},
		{"the same holder again", request("Lockd-Key", "k", "Lockd-Token", "5"), 204, ""},
		{"an older holder", request("Lockd-Key", "k", "Lockd-Token", "4"), 409, "stale token"},
		{"another key", request("Lockd-Key", "j", "Lockd-Token", "1"), 204, ""},
		{"a newer holder", request("Lockd-Key", "k", "Lockd-Token", "6"), 204, ""},
		{"the holder before it", request("Lockd-Key", "k", "Lockd-Token", "5"), 409, "stale token"},
	} {
		before := served
		w := httptest.NewRecorder()
		h.ServeHTTP(w, c.req)
		if w.Code != c.status || !strings.Contains(w.Body.String(), c.body) {
			t.Errorf("%s: %d %q; want %d and a body with %q", c.name, w.Code, w.Body, c.status, c.body)
		}
		if called := served > before; called != (c.status == 204) {
			t.Errorf("%s: next called %v with status %d", c.name, called, w.Code)
		}
	}

	w := httptest.NewRecorder()
	fence.Handler(failing{}, h).ServeHTTP(w, request("Lockd-Key", "k", "Lockd-Token", "9"))
	if w.Code != http.StatusServiceUnavailable || strings.Contains(w.Body.String(), "refused") {
		t.Errorf("failing store: %d %q; want 503 without the store's own error", w.Code, w.Body)
	}
}

func TestSetHeaders(t *testing.T) {
	h := http.Header{}
	fence.SetHeaders(h, "invoice/42", 18446744073709551615)
	if h.Get("Lockd-Key") != "invoice/42" || h.Get("Lockd-Token") != "18446744073709551615" {
		t.Fatalf("headers %v", h)
	}
}
