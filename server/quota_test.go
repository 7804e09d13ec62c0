package server

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/lockd/lockd/codec"
)

// A tenant that fills its share of the keys gets B from its own gate,
// while another tenant's acquires are admitted; /metrics shows the
// tenant's gate. The shares come from the auth file: "noisy" sets keys=10,
// "quiet" gets a fair half of the global 1000.
func TestTenantQuotaIsolatesTenants(t *testing.T) {
	noisySecret, quietSecret := strings.Repeat("ab", MinSecretLen), strings.Repeat("cd", MinSecretLen)
	auth, err := ParseAuth(strings.NewReader("noisy:" + noisySecret + " keys=10\nquiet:" + quietSecret + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	s := startServer(t, func(cfg *Config) {
		cfg.Admin = "127.0.0.1:0"
		cfg.Auth = auth.Secrets
		cfg.Engine.MaxKeys = 1000
		cfg.Engine.TenantLimits = auth.TenantLimits(1000, 1000, 1000)
	})
	noisy := dial(t, s)
	noisy.hello("noisy", auth.Secrets["noisy"])
	quiet := dial(t, s)
	quiet.hello("quiet", auth.Secrets["quiet"])

	for i := range 9 {
		noisy.mustAcquire(uint64(i+1), fmt.Sprint("n", i))
	}
	noisy.acquire(20, 30, 0, "n9")
	noisy.expect(codec.OpBusy, 20)
	for i := range 50 {
		quiet.mustAcquire(uint64(100+i), fmt.Sprint("q", i))
	}
	// Keys noisy holds already are not new keys: a wait on one queues.
	noisy.acquire(21, 30, 5, "n0")
	noisy.expectOpen()

	_, body := scrape(t, "http://"+s.AdminAddr()+"/metrics")
	metrics := parseMetrics(t, body)
	for _, want := range []struct {
		name   string
		labels []string
		value  float64
	}{
		{"lockd_tenant_gate_open", []string{"tenant", "noisy", "gate", "keys"}, 0},
		{"lockd_tenant_gate_refused_total", []string{"tenant", "noisy", "gate", "keys"}, 1},
		{"lockd_tenant_gate_used", []string{"tenant", "noisy", "gate", "keys"}, 9},
		{"lockd_tenant_gate_limit", []string{"tenant", "noisy", "gate", "keys"}, 10},
		{"lockd_tenant_gate_limit", []string{"tenant", "quiet", "gate", "keys"}, 500},
		{"lockd_tenant_gate_used", []string{"tenant", "quiet", "gate", "keys"}, 50},
		{"lockd_tenant_gate_open", []string{"tenant", "quiet", "gate", "keys"}, 1},
		{"lockd_gate_open", []string{"gate", "keys"}, 1},
	} {
		if got, ok := sampleValue(metrics, want.name, want.labels...); !ok || got != want.value {
			t.Errorf("%s%v = %v (present %v), want %v", want.name, want.labels, got, ok, want.value)
		}
	}
	if strings.Count(body, "# TYPE lockd_tenant_gate_open ") != 1 {
		t.Error("the tenant gate family is not written once")
	}
	if t.Failed() {
		t.Log(body)
	}
	s.advance(5 * time.Second)
	noisy.expect(codec.OpTimeout, 21)
}
