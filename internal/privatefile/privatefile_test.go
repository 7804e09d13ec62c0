package privatefile

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReadFileRefusesGroupAndWorldAccess(t *testing.T) {
	path := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(path, []byte("0011"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []os.FileMode{0o644, 0o640, 0o604, 0o620, 0o660, 0o606} {
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
		_, err := ReadFile(path)
		if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "chmod 600 "+path) {
			t.Errorf("mode %04o: %v; want a refusal naming the file and chmod 600", mode, err)
		}
	}
	for _, mode := range []os.FileMode{0o600, 0o400} {
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
		if data, err := ReadFile(path); err != nil || string(data) != "0011" {
			t.Errorf("mode %04o: %q %v; want the contents", mode, data, err)
		}
	}
}
