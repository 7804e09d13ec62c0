package main

import (
	"strings"
	"testing"

	"github.com/lockd/lockd/engine"
	"github.com/lockd/lockd/internal/testcerts"
	"github.com/lockd/lockd/server"
)

// startMutualTLSServer serves a TLS port whose certificate, for
// 127.0.0.1, and required client certificates are signed by ca.
func startMutualTLSServer(t *testing.T, ca *testcerts.CA) *server.Server {
	t.Helper()
	files := ca.WriteFiles(t, t.TempDir(), "server", "127.0.0.1")
	tlsCfg, err := server.LoadTLSConfig(files.Cert, files.Key, files.CA)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.Start(server.Config{Listen: "127.0.0.1:0", TLSListen: "127.0.0.1:0", TLS: tlsCfg, Engine: engine.Config{}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return srv
}

// lockctl's --tls flags (or their LOCKD_TLS_ variables) reach a server
// over mutual TLS; a refused handshake says which flags to check.
func TestTLSFlags(t *testing.T) {
	ca := testcerts.NewCA(t, "lockd test CA")
	srv := startMutualTLSServer(t, ca)
	f := ca.WriteFiles(t, t.TempDir(), "client", "client")
	addr := srv.TLSAddr()
	tlsArgs := []string{"--addr", addr, "--tls-ca", f.CA, "--tls-cert", f.Cert, "--tls-key", f.Key}

	code, out, errs := ctl{}.run(append(append([]string{"acquire"}, tlsArgs...), "jobs/tls")...)
	token := strings.TrimSpace(out)
	if code != exitOK || token == "" {
		t.Fatalf("acquire over mutual TLS: %d %q %q", code, out, errs)
	}
	env := map[string]string{"LOCKD_TLS_CA": f.CA, "LOCKD_TLS_CERT": f.Cert, "LOCKD_TLS_KEY": f.Key}
	if code, _, errs := (ctl{env: env}).run("release", "--addr", addr, "jobs/tls", token); code != exitOK {
		t.Fatalf("release with the LOCKD_TLS_ variables: %d %s", code, errs)
	}

	for _, tc := range []struct {
		name string
		args []string
		code int
		says []string
	}{
		{"no client certificate", []string{"--addr", addr, "--tls-ca", f.CA}, exitFailure, []string{"TLS", "--tls-cert"}},
		{"another server name", append(tlsArgs, "--tls-server-name", "locks.example"), exitFailure, []string{"TLS", "--tls-server-name", "locks.example"}},
		{"certificate without key", []string{"--addr", addr, "--tls-ca", f.CA, "--tls-cert", f.Cert}, exitFailure, []string{"--tls-cert", "--tls-key"}},
	} {
		code, _, errs := ctl{}.run(append(append([]string{"acquire"}, tc.args...), "jobs/other")...)
		if code != tc.code {
			t.Errorf("%s: exit %d, want %d (%s)", tc.name, code, tc.code, errs)
		}
		for _, s := range tc.says {
			if !strings.Contains(errs, s) {
				t.Errorf("%s: %q does not say %q", tc.name, errs, s)
			}
		}
	}
}

// lockctl's --admin-ca, --admin-cert and --admin-key (or their LOCKD_ADMIN_
// variables) speak HTTPS to an admin endpoint that takes client
// certificates of its CA: with one the CA signed, status answers; with
// none, or one another CA signed, it is refused and says so.
func TestAdminCertificateFlags(t *testing.T) {
	ca, rogue := testcerts.NewCA(t, "lockd admin CA"), testcerts.NewCA(t, "rogue CA")
	files := ca.WriteFiles(t, t.TempDir(), "admin", "127.0.0.1")
	adminTLS, err := server.LoadAdminTLSConfig(files.Cert, files.Key, files.CA)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.Start(server.Config{Listen: "127.0.0.1:0", Admin: "127.0.0.1:0", AdminTLS: adminTLS})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	operator := ca.WriteFiles(t, t.TempDir(), "operator", "operator")
	intruder := rogue.WriteFiles(t, t.TempDir(), "intruder", "intruder")
	admin := []string{"status", "--admin", srv.AdminAddr(), "--admin-ca", files.CA}

	if code, out, errs := (ctl{}).run(append(admin, "--admin-cert", operator.Cert, "--admin-key", operator.Key, "some/key")...); code != exitOK || !strings.Contains(out, "some/key") {
		t.Fatalf("status with a certificate of the admin CA: exit %d\n%s%s", code, out, errs)
	}
	env := map[string]string{"LOCKD_ADMIN": srv.AdminAddr(), "LOCKD_ADMIN_CA": files.CA, "LOCKD_ADMIN_CERT": operator.Cert, "LOCKD_ADMIN_KEY": operator.Key}
	if code, out, errs := (ctl{env: env}).run("status", "some/key"); code != exitOK || !strings.Contains(out, "some/key") {
		t.Fatalf("status with LOCKD_ADMIN_CA, _CERT and _KEY: exit %d\n%s%s", code, out, errs)
	}
	if code, out, errs := (ctl{}).run(append(admin, "some/key")...); code != exitFailure || !strings.Contains(errs, "client certificate") {
		t.Fatalf("status without a certificate: exit %d\n%s%s", code, out, errs)
	}
	if code, out, errs := (ctl{}).run(append(admin, "--admin-cert", intruder.Cert, "--admin-key", intruder.Key, "some/key")...); code != exitFailure {
		t.Fatalf("status with a certificate of another CA: exit %d\n%s%s", code, out, errs)
	}
	if code, _, errs := (ctl{}).run(append(admin, "--admin-cert", operator.Cert, "some/key")...); code != exitUsage || !strings.Contains(errs, "--admin-key") {
		t.Fatalf("--admin-cert without --admin-key: exit %d %s", code, errs)
	}
}
