package bench

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"testing"
	"time"
)

// These tests run the peer targets against real servers, and skip when
// redis-server or etcd is not installed (`make bench-peers` installs both).

// freePort returns a loopback port that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// startPeer runs a server binary for the test and waits until addr
// accepts connections.
func startPeer(t *testing.T, binary, addr string, args ...string) {
	t.Helper()
	path, err := exec.LookPath(binary)
	if err != nil {
		t.Skipf("%s is not installed", binary)
	}
	cmd := exec.Command(path, args...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return
		}
	}
	t.Fatalf("%s did not listen on %s", binary, addr)
}

func runPeerWorkloads(t *testing.T, spec TargetSpec) {
	for _, cfg := range []Config{
		{Workload: Uncontended, Callers: 8, Duration: time.Second},
		{Workload: Contended, Callers: 8, Keys: 1, Duration: time.Second},
	} {
		t.Run(cfg.Workload, func(t *testing.T) {
			res, err := Run(context.Background(), spec, testTargetOptions, cfg)
			if err != nil {
				t.Fatal(err)
			}
			checkSane(t, res)
			if res.Kind != spec.Scheme {
				t.Fatalf("kind %q", res.Kind)
			}
		})
	}
}

func TestRedisTargetAgainstRedisServer(t *testing.T) {
	port := freePort(t)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	startPeer(t, "redis-server", addr,
		"--port", fmt.Sprint(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--loglevel", "warning")
	runPeerWorkloads(t, TargetSpec{Scheme: SchemeRedis, Addr: addr})
}

func TestEtcdTargetAgainstEtcdServer(t *testing.T) {
	client := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	peer := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	startPeer(t, "etcd", client,
		"--name", "lockbench", "--data-dir", t.TempDir(),
		"--listen-client-urls", "http://"+client, "--advertise-client-urls", "http://"+client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "lockbench="+peer, "--log-level", "error")
	runPeerWorkloads(t, TargetSpec{Scheme: SchemeEtcd, Addr: client})
}
