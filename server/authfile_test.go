package server

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
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
	} {
		if _, err := ParseAuth(strings.NewReader(text)); err == nil {
			t.Errorf("%s: accepted", name)
		}
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
	if len(auth) != 2 || len(auth["alpha"]) != 16 || auth["beta"][31] != 0xff {
		t.Fatalf("parsed %v", auth)
	}
	if _, err := LoadAuthFile(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Fatal("a missing file must be an error")
	}
}
