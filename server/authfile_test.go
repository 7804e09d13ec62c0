package server

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lockd/lockd/engine"
)

func TestParseAuthRejects(t *testing.T) {
	secret := strings.Repeat("ab", MinSecretLen)
	for name, text := range map[string]string{
		"no colon":        "alpha" + secret + "\n",
		"bad tenant":      "a/b:" + secret + "\n",
		"tenant too long": strings.Repeat("t", 33) + ":" + secret + "\n",
		"not hex":         "alpha:" + strings.Repeat("zz", MinSecretLen) + "\n",
		"twice":           "alpha:" + secret + "\nalpha:" + secret + "\n",
		"no tenants":      "# nobody\n",
		"no secret":       "alpha: keys=5\n",
		"unknown limit":   "alpha:" + secret + " sockets=5\n",
		"zero conns":      "alpha:" + secret + " conns=0\n",
		"zero limit":      "alpha:" + secret + " keys=0\n",
		"bad limit":       "alpha:" + secret + " waiters=many\n",
	} {
		if _, err := ParseAuth(strings.NewReader(text)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestParseAuthSaysHowToMakeASecret: every refusal that a good secret
// would cure says how to make one.
func TestParseAuthSaysHowToMakeASecret(t *testing.T) {
	for name, text := range map[string]string{
		"not hex":    "alpha:" + strings.Repeat("zz", MinSecretLen) + "\n",
		"too short":  "alpha:" + strings.Repeat("ab", MinSecretLen-1) + "\n",
		"no colon":   "alpha\n",
		"no tenants": "\n",
	} {
		_, err := ParseAuth(strings.NewReader(text))
		if err == nil || !strings.Contains(err.Error(), "openssl rand -hex 32") {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestParseAuthAllowsSpacesAroundTheColon(t *testing.T) {
	secret := strings.Repeat("ab", MinSecretLen)
	auth, err := ParseAuth(strings.NewReader("alpha : " + secret + "\nbeta\t:" + secret + "\n  gamma:  " + secret + "  \n"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tenant := range []string{"alpha", "beta", "gamma"} {
		if len(auth.Secrets[tenant]) != MinSecretLen || auth.Secrets[tenant][0] != 0xab {
			t.Errorf("tenant %q: secret %x", tenant, auth.Secrets[tenant])
		}
	}
	if len(auth.Secrets) != 3 {
		t.Fatalf("parsed %d tenants: %v", len(auth.Secrets), auth.Secrets)
	}
}

func TestLoadAuthFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "auth")
	content := "# tenants\nalpha:" + strings.Repeat("01", 16) + "\n  beta:" + strings.Repeat("ff", 32) + "  \n"
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	auth, err := LoadAuthFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(auth.Secrets) != 2 || len(auth.Secrets["alpha"]) != 16 || auth.Secrets["beta"][31] != 0xff {
		t.Fatalf("parsed %v", auth.Secrets)
	}
	missing := filepath.Join(t.TempDir(), "missing")
	if _, err := LoadAuthFile(missing); err == nil || !strings.Contains(err.Error(), missing) {
		t.Fatalf("a missing file must be an error naming it: %v", err)
	}
	if err := os.WriteFile(path, []byte("alpha:00\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadAuthFile(path); err == nil || !strings.Contains(err.Error(), path+": line 1:") {
		t.Fatalf("a bad line must be an error naming the file and the line: %v", err)
	}
}

// TestLoadAuthFileRefusesReadableByOthers: secrets anyone on the machine
// can read authenticate anyone, so such a file is refused, as ssh refuses
// a private key, with the fix in the message.
func TestLoadAuthFileRefusesReadableByOthers(t *testing.T) {
	path := filepath.Join(t.TempDir(), "auth")
	if err := os.WriteFile(path, []byte("alpha:"+strings.Repeat("01", 16)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []os.FileMode{0o644, 0o640} {
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadAuthFile(path); err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "chmod 600") {
			t.Errorf("mode %04o: %v; want a refusal naming the file and chmod 600", mode, err)
		}
	}
}

// A tenant's line may set its own limits; the rest are fair shares of
// the global limits, none with a single tenant.
func TestAuthFileTenantLimits(t *testing.T) {
	secret := strings.Repeat("ab", MinSecretLen)
	auth, err := ParseAuth(strings.NewReader("big:" + secret + " keys=500 inflight=40\nsmall:" + secret + "\nthird : " + secret + " waiters=7\n"))
	if err != nil {
		t.Fatal(err)
	}
	limits := auth.TenantLimits(1000, 100, 10)
	for tenant, want := range map[string]engine.TenantLimits{
		"big":     {Keys: 500, Waiters: 34, Inflight: 40},
		"small":   {Keys: 334, Waiters: 34, Inflight: 4},
		"third":   {Keys: 334, Waiters: 7, Inflight: 4},
		"unknown": {},
	} {
		if got := limits(tenant); got != want {
			t.Errorf("%s: %+v, want %+v", tenant, got, want)
		}
	}
	alone, err := ParseAuth(strings.NewReader("only:" + secret + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := alone.TenantLimits(1000, 100, 10)("only"); got != (engine.TenantLimits{}) {
		t.Fatalf("a single tenant got shares %+v, want none", got)
	}
}
