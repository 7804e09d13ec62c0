package cluster

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// The membership endpoint answers bad requests 400 and refused changes
// 409, each with a JSON error, and the membership itself as JSON.
func TestMembersEndpoint(t *testing.T) {
	tc := newTestCluster(t, 1, nil)
	srv := httptest.NewServer(tc.node(1).MembersHandler())
	defer srv.Close()
	do := func(method, path, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	code, body := do(http.MethodGet, MembersPath, "")
	var m Membership
	if code != http.StatusOK || json.Unmarshal([]byte(body), &m) != nil || len(m.Members) != 1 || m.Members[0].ID != 1 || m.Members[0].Groups != 4 {
		t.Fatalf("GET: %d %s", code, body)
	}
	for _, tt := range []struct {
		method, path, body string
		code               int
		says               string
	}{
		{http.MethodPost, MembersPath, `{"id": 2}`, http.StatusBadRequest, "raft_addr"},
		{http.MethodPost, MembersPath, `{"id": 0, "raft_addr": "127.0.0.1:1"}`, http.StatusBadRequest, "id"},
		{http.MethodPost, MembersPath, `{"id": 2, "raft_addr": "127.0.0.1:1", "voting": false}`, http.StatusBadRequest, "raft_addr"},
		{http.MethodPost, MembersPath, `not json`, http.StatusBadRequest, "raft_addr"},
		{http.MethodPost, MembersPath, `{"id": 1, "raft_addr": "127.0.0.1:1"}`, http.StatusConflict, "already a member"},
		{http.MethodDelete, MembersPath + "/x", "", http.StatusBadRequest, "node id"},
		{http.MethodDelete, MembersPath + "/0", "", http.StatusBadRequest, "node id"},
		{http.MethodDelete, MembersPath + "/1", "", http.StatusConflict, "cannot remove itself"},
		{http.MethodPut, MembersPath, "", http.StatusMethodNotAllowed, ""},
	} {
		code, body := do(tt.method, tt.path, tt.body)
		var e struct{ Error string }
		if code != tt.code || (tt.says != "" && (json.Unmarshal([]byte(body), &e) != nil || !strings.Contains(e.Error, tt.says))) {
			t.Errorf("%s %s %s: %d %s, want %d saying %q", tt.method, tt.path, tt.body, code, body, tt.code, tt.says)
		}
	}
	if got := memberIDs(members(t, tc.node(1))); len(got) != 1 || got[0] != 1 {
		t.Fatalf("members after the refused changes: %v", got)
	}
}
