package server

import (
	"crypto/tls"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/lockd/lockd/internal/testcerts"
)

// adminTLSServer starts a server whose admin endpoint is HTTPS with a
// certificate ca signed and, with clientCA, takes client certificates ca
// signed as authentication; routes records what reached the membership
// route.
func adminTLSServer(t *testing.T, ca *testcerts.CA, clientCA bool, configure func(*Config)) (*testServer, chan string) {
	t.Helper()
	files := ca.WriteFiles(t, t.TempDir(), "admin", "127.0.0.1")
	caFile := ""
	if clientCA {
		caFile = files.CA
	}
	tlsCfg, err := LoadAdminTLSConfig(files.Cert, files.Key, caFile)
	if err != nil {
		t.Fatal(err)
	}
	called := make(chan string, 8)
	s := startServer(t, func(cfg *Config) {
		cfg.Admin = "127.0.0.1:0"
		cfg.AdminTLS = tlsCfg
		cfg.AdminRoutes = map[string]http.Handler{"/v1/cluster/": http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			called <- r.Method + " " + r.URL.Path
		})}
		if configure != nil {
			configure(cfg)
		}
	})
	return s, called
}

// httpsClient trusts ca for the admin endpoint and presents certs.
func httpsClient(ca *testcerts.CA, certs ...tls.Certificate) *http.Client {
	return &http.Client{Timeout: ioTimeout, Transport: &http.Transport{DisableKeepAlives: true,
		TLSClientConfig: &tls.Config{RootCAs: ca.Pool(), Certificates: certs}}}
}

func adminDo(c *http.Client, method, url, auth string) (int, error) {
	req, err := http.NewRequest(method, url, strings.NewReader(`{"id": 9, "raft_addr": "10.0.0.9:7451"}`))
	if err != nil {
		return 0, err
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// With --admin-tls-client-ca, the membership and lock routes answer a
// client certificate the CA signed, 401 to a client without one, and no
// HTTP at all to one another CA signed (its handshake fails); /healthz
// and /metrics stay open to clients without a certificate. A non-loopback
// admin address then needs no --insecure-admin.
func TestAdminClientCertificatesGuardRoutes(t *testing.T) {
	ca, rogue := testcerts.NewCA(t, "lockd admin CA"), testcerts.NewCA(t, "rogue CA")
	s, called := adminTLSServer(t, ca, true, nil)
	base := "https://" + s.AdminAddr()
	anonymous := httpsClient(ca)
	for _, r := range []struct{ method, path string }{
		{"POST", "/v1/cluster/members"},
		{"DELETE", "/v1/cluster/members/3"},
		{"GET", "/v1/locks/default/k"},
	} {
		if code, err := adminDo(anonymous, r.method, base+r.path, ""); err != nil || code != http.StatusUnauthorized {
			t.Errorf("%s %s without a certificate: %d %v, want 401", r.method, r.path, code, err)
		}
	}
	// Go's client leaves out a certificate the server's CA list does not
	// name; an intruder sends it anyway.
	intruderCert := rogue.Issue(t, "intruder")
	intruder := httpsClient(ca)
	intruder.Transport.(*http.Transport).TLSClientConfig.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
		return &intruderCert, nil
	}
	if code, err := adminDo(intruder, "POST", base+"/v1/cluster/members", ""); err == nil {
		t.Errorf("a certificate of another CA: answered %d, want the handshake refused", code)
	}
	if code, err := adminDo(httpsClient(ca, intruderCert), "POST", base+"/v1/cluster/members", ""); err != nil || code != http.StatusUnauthorized {
		t.Errorf("a client holding only a certificate of another CA: %d %v, want 401", code, err)
	}
	select {
	case c := <-called:
		t.Fatalf("a request without a good certificate reached %s", c)
	default:
	}

	operator := httpsClient(ca, ca.Issue(t, "operator"))
	if code, err := adminDo(operator, "POST", base+"/v1/cluster/members", ""); err != nil || code != http.StatusOK || <-called != "POST /v1/cluster/members" {
		t.Fatalf("with a certificate of the CA: %d %v", code, err)
	}
	if code, err := adminDo(operator, "GET", base+"/v1/locks/default/k", ""); err != nil || code != http.StatusOK {
		t.Fatalf("lock inspection with a certificate of the CA: %d %v", code, err)
	}
	for _, path := range []string{"/healthz", "/metrics"} {
		if code, err := adminDo(anonymous, "GET", base+path, ""); err != nil || code != http.StatusOK {
			t.Errorf("%s without a certificate: %d %v, want 200", path, code, err)
		}
	}

	if err := exposureError(Config{Listen: "127.0.0.1:0", Admin: "0.0.0.0:0", AdminTLS: s.cfg.AdminTLS}); err != nil {
		t.Fatalf("a non-loopback admin endpoint taking client certificates: %v", err)
	}
	noClientCA := &tls.Config{Certificates: s.cfg.AdminTLS.Certificates}
	if err := exposureError(Config{Listen: "127.0.0.1:0", Admin: "0.0.0.0:0", AdminTLS: noClientCA}); err == nil || !strings.Contains(err.Error(), "--admin-tls-client-ca") {
		t.Fatalf("a non-loopback HTTPS admin endpoint that authenticates no one: %v, want refused", err)
	}
}

// With a token and client certificates both, either one authenticates.
func TestAdminTokenStillWorksBesideClientCertificates(t *testing.T) {
	ca := testcerts.NewCA(t, "lockd admin CA")
	token := []byte("0123456789abcdef0123456789abcdef")
	s, called := adminTLSServer(t, ca, true, func(cfg *Config) { cfg.AdminToken = token })
	url := "https://" + s.AdminAddr() + "/v1/cluster/members"
	if code, err := adminDo(httpsClient(ca), "POST", url, "Bearer "+string(token)); err != nil || code != http.StatusOK || <-called != "POST /v1/cluster/members" {
		t.Fatalf("the token without a certificate: %d %v", code, err)
	}
	if code, err := adminDo(httpsClient(ca, ca.Issue(t, "operator")), "POST", url, ""); err != nil || code != http.StatusOK || <-called != "POST /v1/cluster/members" {
		t.Fatalf("a certificate without the token: %d %v", code, err)
	}
	if code, err := adminDo(httpsClient(ca), "POST", url, "Bearer wrong-token-wrong-token-wrong"); err != nil || code != http.StatusUnauthorized {
		t.Fatalf("a wrong token and no certificate: %d %v, want 401", code, err)
	}
}

// Over HTTPS too, a connection accepted past the admin connection cap is
// for /healthz alone, and has adminProbeTimeout, its TLS handshake
// included.
func TestAdminTLSProbeConnectionsServeHealthzOnly(t *testing.T) {
	ca := testcerts.NewCA(t, "lockd admin CA")
	s, _ := adminTLSServer(t, ca, false, func(cfg *Config) { cfg.AdminMaxConns = 1 })
	hold, err := net.Dial("tcp", s.AdminAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Close()
	// The held connection, accepted first, takes the one slot.
	anonymous := httpsClient(ca)
	base := "https://" + s.AdminAddr()
	if code, err := adminDo(anonymous, "GET", base+"/healthz", ""); err != nil || code != http.StatusOK {
		t.Fatalf("/healthz past the cap: %d %v", code, err)
	}
	if code, err := adminDo(anonymous, "GET", base+"/metrics", ""); err != nil || code != http.StatusServiceUnavailable {
		t.Fatalf("/metrics past the admin connection cap: %d %v, want 503", code, err)
	}
	if held := probeHeldFor(t, s.AdminAddr(), ""); held >= adminReadHeaderTimeout {
		t.Fatalf("a probe that never starts its TLS handshake was held %v, past its %v", held, adminProbeTimeout)
	}
}
