package fencetest

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/lockd/lockd/internal/pgtest"
)

// python is the first python3 >= 3.11 with psycopg (a pyenv python3 on
// PATH may not see Debian's python3-psycopg; /usr/bin/python3 does). None
// fails the test under CI and skips it elsewhere.
func python(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"python3", "/usr/bin/python3"} {
		if exec.Command(p, "-c", "import sys, psycopg; assert sys.version_info >= (3, 11)").Run() == nil {
			return p
		}
	}
	const msg = "no python3 >= 3.11 with psycopg: apt-get install python3-psycopg"
	if os.Getenv("CI") != "" {
		t.Fatal(msg + " — CI is set, so this test fails instead of skipping")
	}
	t.Skip(msg)
	return ""
}

// startPythonBackend runs testdata/wsgi_backend.py on pg and returns its URL.
func startPythonBackend(t *testing.T, pg *pgtest.Server) string {
	t.Helper()
	pythonDir, err := filepath.Abs("../python")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(python(t), "testdata/wsgi_backend.py", pythonDir, pg.DSN())
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	port := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		if sc.Scan() {
			port <- sc.Text()
		}
		close(port)
	}()
	select {
	case p := <-port:
		if _, err := strconv.Atoi(p); err != nil {
			t.Fatalf("the Python backend printed %q, not its port", p)
		}
		return "http://127.0.0.1:" + p
	case <-time.After(20 * time.Second):
		t.Fatal("the Python backend did not start within 20 s")
		return ""
	}
}
