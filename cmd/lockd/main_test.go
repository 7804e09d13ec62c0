package main

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lockd/lockd/codec"
)

func TestFlagsFromEnvironment(t *testing.T) {
	env := map[string]string{"LOCKD_MAX_KEYS": "77", "LOCKD_LISTEN": "127.0.0.1:9000", "LOCKD_INSECURE_NO_AUTH": "true"}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	o, err := parseServeOptions([]string{"--listen", "127.0.0.1:9001", "--log-level", "warn"}, lookup)
	if err != nil {
		t.Fatal(err)
	}
	cfg, level := o.server, o.logLevel
	if cfg.Engine.MaxKeys != 77 || !cfg.InsecureNoAuth {
		t.Fatalf("environment not applied: %+v", cfg)
	}
	if cfg.Listen != "127.0.0.1:9001" || level != "warn" {
		t.Fatalf("a command-line flag must win over the environment: %q %q", cfg.Listen, level)
	}
	if _, err := parseServeOptions(nil, func(k string) (string, bool) {
		return "lots", k == "LOCKD_MAX_CONNS"
	}); err == nil || !strings.Contains(err.Error(), "LOCKD_MAX_CONNS") {
		t.Fatalf("a bad environment value must name its variable: %v", err)
	}
	defaults, err := parseServeOptions(nil, func(string) (string, bool) { return "", false })
	if err != nil || defaults.server.Listen != "127.0.0.1:7420" || defaults.server.Admin != "127.0.0.1:7421" {
		t.Fatalf("defaults: %+v %v", defaults, err)
	}
}

// TestServeAndSIGTERM runs the real binary: it serves, answers on the
// admin port, answers /healthz 503 from SIGTERM on, and exits 0.
func TestServeAndSIGTERM(t *testing.T) {
	bin := buildLockd(t)
	cmd := exec.Command(bin, "serve", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--drain-grace", "1s")
	cmd.Dir = t.TempDir() // for the default data dir
	cmd.Env = append(os.Environ(), "LOCKD_LOG_LEVEL=info")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()

	var started struct{ Listen, Admin, Message string }
	lines := bufio.NewScanner(stderr)
	for lines.Scan() {
		if json.Unmarshal(lines.Bytes(), &started) == nil && started.Message == "lockd serving" {
			break
		}
	}
	if started.Listen == "" {
		t.Fatal("no start-up line in the log")
	}
	go io.Copy(io.Discard, stderr)

	nc, err := net.Dial("tcp", started.Listen)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(5 * time.Second))
	var resp codec.Response
	buf := make([]byte, 256)
	n, _ := io.ReadAtLeast(nc, buf, 20)
	if _, err := codec.DecodeResponse(buf[:n], &resp); err != nil || resp.Op != codec.OpGreeting {
		t.Fatalf("greeting: %v %q", err, resp.Op)
	}

	health, err := http.Get("http://" + started.Admin + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	health.Body.Close()
	if health.StatusCode != http.StatusOK {
		t.Fatalf("/healthz: %s", health.Status)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// Within the grace /healthz turns 503 before the admin port closes.
	for {
		health, err := http.Get("http://" + started.Admin + "/healthz")
		if err != nil {
			t.Fatalf("the admin port closed before /healthz answered 503: %v", err)
		}
		health.Body.Close()
		if health.StatusCode == http.StatusServiceUnavailable {
			break
		}
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("lockd must exit 0 on SIGTERM: %v", err)
	}
}

// Single mode on the plain port runs as many Go processors as event loops,
// so that a loop's Gosched finds no idle P to wake; whatever needs its own
// goroutines keeps every P, and so does an operator's GOMAXPROCS. A cluster
// node adds a P for its monitor anchor, unless GOMAXPROCS is given.
func TestProcessorsFollowTheLoops(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	clusterArgs := []string{"--cluster", "--node-id", "1", "--peers", "1=127.0.0.1:1,2=127.0.0.1:2,3=127.0.0.1:3", "--data-dir", "d"}
	for _, tc := range []struct {
		name          string
		args          []string
		procs         int
		gomaxprocsSet bool
		loops, want   int
		anchor        bool
	}{
		{"two cores", nil, 2, false, 1, 1, false},
		{"sixteen cores", nil, 16, false, 15, 15, false},
		{"one core", nil, 1, false, 1, 1, false},
		{"loops given", []string{"--loops", "2"}, 4, false, 2, 2, false},
		{"more loops than processors", []string{"--loops", "6"}, 4, false, 6, 4, false},
		{"GOMAXPROCS given", nil, 2, true, 1, 2, false},
		{"TLS port", []string{"--tls-listen", "127.0.0.1:0", "--tls-cert", "c", "--tls-key", "k"}, 2, false, 1, 2, false},
		{"cluster node", clusterArgs, 2, false, 1, 3, true},
		{"cluster node, GOMAXPROCS given", clusterArgs, 2, true, 1, 2, false},
	} {
		o, err := parseServeOptions(tc.args, func(string) (string, bool) { return "", false })
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		runtime.GOMAXPROCS(tc.procs)
		loops, procs, anchor := processorsFor(o, tc.gomaxprocsSet)
		if loops != tc.loops || procs != tc.want || anchor != tc.anchor {
			t.Errorf("%s: %d loops on %d processors, anchor %v; want %d on %d, anchor %v", tc.name, loops, procs, anchor, tc.loops, tc.want, tc.anchor)
		}
	}
}
