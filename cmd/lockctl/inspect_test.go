package main

import (
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lockd/lockd/internal/adminjson"
	"github.com/lockd/lockd/server"
)

// startInspectable starts lockd with its admin endpoint and returns the
// lock and admin addresses.
func startInspectable(t *testing.T, auth map[string][]byte) (addr, admin string) {
	t.Helper()
	srv, err := server.Start(server.Config{Listen: "127.0.0.1:0", Admin: "127.0.0.1:0", NodeName: "inspected", Auth: auth})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return srv.Addr(), srv.AdminAddr()
}

func TestInspectionDefaultsToLockdsAdminAddress(t *testing.T) {
	if defaultAdmin != server.DefaultAdmin {
		t.Fatalf("lockctl --admin defaults to %s, lockd's --admin to %s", defaultAdmin, server.DefaultAdmin)
	}
}

// lockctl status and list against a real server: a table by default, the
// server's JSON with --json, LOCKD_ADMIN for --admin, prefix and --limit.
func TestStatusAndList(t *testing.T) {
	addr, admin := startInspectable(t, nil)
	tokens := map[string]string{}
	for _, key := range []string{"jobs/b", "jobs/a", "cron/x"} {
		code, out, errs := ctl{}.run("acquire", "--addr", addr, "--lease", "1m", key)
		if code != exitOK {
			t.Fatalf("acquire %s: %d %s", key, code, errs)
		}
		tokens[key] = strings.TrimSpace(out)
	}

	before := time.Now()
	code, out, errs := ctl{}.run("status", "--admin", admin, "jobs/a")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != exitOK || len(lines) != 2 || strings.Join(strings.Fields(lines[0]), " ") != "KEY HELD TOKEN HELD SINCE HELD FOR LEASE LEFT WAITERS NODE GRANT NODE REMOTE" {
		t.Fatalf("status: %d %q %q", code, out, errs)
	}
	// lockctl acquire's connection is closed by now, but the server
	// remembers where the grant went; single mode has no grant node.
	f := strings.Fields(lines[1])
	if len(f) != 10 || f[0] != "jobs/a" || f[1] != "yes" || f[2] != tokens["jobs/a"] || f[6] != "0" || f[7] != "inspected" || f[8] != "-" || !strings.HasPrefix(f[9], "127.0.0.1:") {
		t.Fatalf("status row %q, want jobs/a held with token %s, no waiters, node inspected, no grant node, a loopback remote", lines[1], tokens["jobs/a"])
	}
	// Held since its acquire above, at most a few seconds ago; the lease
	// of a minute has the rest left.
	since, err0 := time.Parse(time.RFC3339, f[3])
	heldFor, err := time.ParseDuration(f[4])
	left, err2 := time.ParseDuration(f[5])
	if err0 != nil || err != nil || err2 != nil || heldFor <= 0 || heldFor > 10*time.Second || heldFor+left > time.Minute || heldFor+left < time.Minute-time.Second {
		t.Errorf("status row %q: held for %q and lease left %q do not add up to the minute's lease", lines[1], f[4], f[5])
	}
	if since.After(before.Add(time.Second)) || since.Before(before.Add(-10*time.Second)) {
		t.Errorf("status row %q: held since %s, want within the 10 s before %s", lines[1], f[3], before.UTC().Format(time.RFC3339))
	}

	code, out, _ = ctl{env: map[string]string{"LOCKD_ADMIN": admin}}.run("status", "--json", "nothing/here")
	var one adminjson.LockStatus
	if err := json.Unmarshal([]byte(out), &one); code != exitOK || err != nil {
		t.Fatalf("status --json: %d %q %v", code, out, err)
	}
	if one != (adminjson.LockStatus{Tenant: "default", Key: "nothing/here", Node: "inspected"}) {
		t.Errorf("status --json of a free key: %+v", one)
	}

	for _, tt := range []struct {
		args []string
		keys []string
	}{
		{[]string{"list", "--admin", admin}, []string{"cron/x", "jobs/a", "jobs/b"}},
		{[]string{"list", "--admin", admin, "jobs/"}, []string{"jobs/a", "jobs/b"}},
		{[]string{"list", "--admin", admin, "--limit", "1", "jobs/"}, []string{"jobs/a"}},
		{[]string{"list", "--admin", admin, "none/"}, nil},
	} {
		code, out, errs := ctl{}.run(tt.args...)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if code != exitOK || !strings.HasPrefix(lines[0], "KEY") {
			t.Errorf("%q: %d %q %q", tt.args, code, out, errs)
			continue
		}
		var keys []string
		for _, l := range lines[1:] {
			f := strings.Fields(l)
			if f[1] != "yes" || f[2] != tokens[f[0]] {
				t.Errorf("%q: row %q, want token %s", tt.args, l, tokens[f[0]])
			}
			keys = append(keys, f[0])
		}
		if strings.Join(keys, " ") != strings.Join(tt.keys, " ") {
			t.Errorf("%q: keys %q, want %q", tt.args, keys, tt.keys)
		}
	}
	code, out, _ = ctl{}.run("list", "--admin", admin, "--json", "jobs/")
	var list []adminjson.LockStatus
	if err := json.Unmarshal([]byte(out), &list); code != exitOK || err != nil || len(list) != 2 || list[0].Key != "jobs/a" || !list[0].Held {
		t.Errorf("list --json: %d %q %v", code, out, err)
	}
}

// --tenant chooses whose locks are shown; it needs no secret.
func TestStatusOfAnotherTenant(t *testing.T) {
	secret := []byte("a shared secret of the t1 tenant")
	addr, admin := startInspectable(t, map[string][]byte{"t1": secret})
	env := map[string]string{"LOCKD_SECRET": hex.EncodeToString(secret)}
	code, out, errs := ctl{env: env}.run("acquire", "--addr", addr, "--tenant", "t1", "k")
	if code != exitOK {
		t.Fatalf("acquire: %d %s", code, errs)
	}
	token := strings.TrimSpace(out)
	code, out, errs = ctl{env: env}.run("status", "--admin", admin, "--tenant", "t1", "--json", "k")
	var one adminjson.LockStatus
	if err := json.Unmarshal([]byte(out), &one); code != exitOK || err != nil || !one.Held || one.Tenant != "t1" {
		t.Fatalf("status --tenant t1: %d %q %q %v", code, out, errs, err)
	}
	if got := strconv.FormatUint(one.Token, 10); got != token {
		t.Errorf("token %s, acquire printed %s", got, token)
	}
	if _, out, _ := (ctl{}).run("status", "--admin", admin, "--json", "k"); !strings.Contains(out, `"held":false`) {
		t.Errorf("the default tenant's k: %s", out)
	}
}

// Usage errors exit 2, failures to get an answer 1, each naming what to fix.
func TestInspectionErrors(t *testing.T) {
	_, admin := startInspectable(t, nil)
	notLockd := httptest.NewServer(http.NotFoundHandler())
	defer notLockd.Close()
	for _, tt := range []struct {
		args []string
		code int
		says string
	}{
		{[]string{"status", "--admin", admin}, exitUsage, "needs 1 argument\n"},
		{[]string{"status", "--admin", admin, "a", "b"}, exitUsage, "unexpected arguments"},
		{[]string{"list", "--admin", admin, "a", "b"}, exitUsage, "unexpected arguments"},
		{[]string{"status", "--admin", admin, "a b"}, exitUsage, "key"},
		{[]string{"status", "--admin", admin, strings.Repeat("k", 129)}, exitUsage, "key"},
		{[]string{"list", "--admin", admin, "--limit", "0"}, exitUsage, "--limit"},
		{[]string{"list", "--admin", admin, "--limit", "1001"}, exitUsage, "--limit"},
		{[]string{"status", "--admin", "nowhere", "k"}, exitUsage, "--admin"},
		{[]string{"status", "--admin", admin, "--tenant", "a/b", "k"}, exitUsage, "--tenant"},
		{[]string{"status", "--admin", deadAddr(t), "k"}, exitFailure, "--admin"},
		{[]string{"list", "--admin", strings.TrimPrefix(notLockd.URL, "http://")}, exitFailure, "404"},
	} {
		code, _, errs := ctl{}.run(tt.args...)
		if code != tt.code || !strings.Contains(errs, tt.says) {
			t.Errorf("%q: exit %d %q, want %d saying %q", tt.args, code, errs, tt.code, tt.says)
		}
	}
}
