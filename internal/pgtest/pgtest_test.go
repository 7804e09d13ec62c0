package pgtest

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// ending records how a test ended through Fatal or Skip, each of which
// stops the calling goroutine, as testing's do.
type ending struct {
	testing.TB
	failed, skipped string
}

func (e *ending) Fatal(args ...any) { e.failed = fmt.Sprint(args...); runtime.Goexit() }
func (e *ending) Skip(args ...any)  { e.skipped = fmt.Sprint(args...); runtime.Goexit() }

// binDirEnding runs binDir for pattern in a goroutine of its own and
// returns how it ended: the directory, or the Fatal or Skip message.
func binDirEnding(t *testing.T, pattern string) (dir string, e *ending) {
	e = &ending{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		dir = binDir(e, pattern)
	}()
	<-done
	return dir, e
}

// Without PostgreSQL a test fails under CI, saying what to install, and
// is skipped elsewhere; never a silent pass.
func TestNotInstalled(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "*", "bin", "initdb")
	t.Setenv("CI", "true")
	if _, e := binDirEnding(t, missing); !strings.Contains(e.failed, "apt-get install postgresql") || e.skipped != "" {
		t.Errorf("CI set: failed %q, skipped %q; want a failure naming the package", e.failed, e.skipped)
	}
	t.Setenv("CI", "")
	if _, e := binDirEnding(t, missing); e.failed != "" || !strings.Contains(e.skipped, "not installed") {
		t.Errorf("CI unset: failed %q, skipped %q; want a skip saying why", e.failed, e.skipped)
	}
}

// The newest version with both initdb and postgres is chosen.
func TestNewestInstalled(t *testing.T) {
	root := t.TempDir()
	for _, v := range []string{"9", "15", "16"} {
		bin := filepath.Join(root, v, "bin")
		if err := os.MkdirAll(bin, 0o755); err != nil {
			t.Fatal(err)
		}
		files := []string{"initdb", "postgres"}
		if v == "16" {
			files = files[:1] // a half-installed version is passed over
		}
		for _, f := range files {
			if err := os.WriteFile(filepath.Join(bin, f), nil, 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	dir, e := binDirEnding(t, filepath.Join(root, "*", "bin", "initdb"))
	if want := filepath.Join(root, "15", "bin"); dir != want || e.failed != "" || e.skipped != "" {
		t.Errorf("binDir = %q (failed %q, skipped %q); want %q", dir, e.failed, e.skipped, want)
	}
}
