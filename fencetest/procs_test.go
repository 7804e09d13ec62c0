package fencetest

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

func TestMain(m *testing.M) {
	if os.Getenv(roleEnv) == "holder" {
		os.Exit(runHolder())
	}
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

// binaries builds lockd and lockctl from the tree, once per test run, and
// returns the directory holding them.
func binaries(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "fencetest-bin-")
		if buildErr != nil {
			return
		}
		out, err := exec.Command("go", "build", "-o", binDir+"/", "../cmd/lockd", "../cmd/lockctl").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binDir
}

func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports
}

// lockd is one lockd process, killed at the end of the test.
type lockd struct {
	id     int
	listen string
	admin  string
	log    string
	cmd    *exec.Cmd
	done   chan struct{}
}

func startLockd(t *testing.T, id int, listen, admin, logPath string, args ...string) *lockd {
	t.Helper()
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(binaries(t), "lockd"), append([]string{"serve", "--listen", listen, "--admin", admin, "--log-level", "warn"}, args...)...)
	cmd.Stdout, cmd.Stderr = f, f
	// Killed with the test process, even by a test timeout.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &lockd{id: id, listen: listen, admin: admin, log: logPath, cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); f.Close(); close(p.done) }()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("--- lockd %d log ---\n%s", id, b)
		}
	})
	return p
}

func (p *lockd) kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

func (p *lockd) alive() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// waitListening waits up to 20 s for addr to accept connections.
func waitListening(t *testing.T, addr string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("nothing listens on %s after 20 s: %v", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// startSingle starts lockd in single mode and returns its address.
func startSingle(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	ports := freePorts(t, 1)
	addr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	startLockd(t, 1, addr, "", filepath.Join(dir, "lockd.log"), "--data-dir", filepath.Join(dir, "data"))
	waitListening(t, addr)
	return addr
}

// startCluster starts a 3-node cluster with one Raft group and returns
// its nodes once the group has a leader.
func startCluster(t *testing.T) []*lockd {
	t.Helper()
	dir := t.TempDir()
	ports := freePorts(t, 9)
	var peers []string
	for i := range 3 {
		peers = append(peers, fmt.Sprintf("%d=127.0.0.1:%d", i+1, ports[i]))
	}
	nodes := make([]*lockd, 3)
	for i := range 3 {
		nodes[i] = startLockd(t, i+1, fmt.Sprintf("127.0.0.1:%d", ports[3+i]), fmt.Sprintf("127.0.0.1:%d", ports[6+i]),
			filepath.Join(dir, fmt.Sprintf("node%d.log", i+1)),
			"--cluster", "--node-id", strconv.Itoa(i+1), "--raft-addr", fmt.Sprintf("127.0.0.1:%d", ports[i]),
			"--peers", strings.Join(peers, ","), "--data-dir", filepath.Join(dir, fmt.Sprintf("data%d", i+1)),
			"--groups", "1")
	}
	leader(t, nodes)
	return nodes
}

// leader is the node that the running nodes see leading group 1, waiting
// up to 20 s for one that is itself running.
func leader(t *testing.T, nodes []*lockd) *lockd {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		for _, n := range nodes {
			if id := n.leaderView(); n.alive() && id >= 1 && id <= len(nodes) && nodes[id-1].alive() {
				return nodes[id-1]
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("group 1 has no running leader after 20 s")
	return nil
}

// leaderView is the node's view of group 1's leader from its /metrics,
// 0 while it knows none or does not answer.
func (p *lockd) leaderView() int {
	c := http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get("http://" + p.admin + "/metrics")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), `lockd_cluster_group_leader{group="1"} `); ok {
			id, _ := strconv.Atoi(rest)
			return id
		}
	}
	return 0
}

// holder is a lock holder process: this test binary in the holder role.
type holder struct {
	name  string
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string
	out   bytes.Buffer // everything it printed, for failure messages
	mu    sync.Mutex
}

// startHolder runs a holder of key on addrs with a lease of lease that
// writes to target (sql:DSN or http:URL), gated when gate is set.
func startHolder(t *testing.T, name string, addrs []string, key string, lease time.Duration, target string, gate bool) *holder {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	h := &holder{name: name, lines: make(chan string, 16)}
	h.cmd = exec.Command(self, "-test.run=^$")
	gateValue := "0"
	if gate {
		gateValue = "1"
	}
	h.cmd.Env = append(os.Environ(), roleEnv+"=holder", "FENCETEST_ADDRS="+strings.Join(addrs, ","),
		"FENCETEST_KEY="+key, "FENCETEST_LEASE="+lease.String(), "FENCETEST_WRITE="+target, "FENCETEST_GATE="+gateValue)
	h.cmd.Stderr = os.Stderr
	h.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := h.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if h.stdin, err = h.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := h.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			h.mu.Lock()
			h.out.WriteString(sc.Text() + "\n")
			h.mu.Unlock()
			h.lines <- sc.Text()
		}
		close(h.lines)
	}()
	t.Cleanup(func() {
		_ = h.cmd.Process.Signal(syscall.SIGCONT)
		_ = h.cmd.Process.Kill()
		_ = h.cmd.Wait()
	})
	return h
}

// next is the holder's next line, within timeout.
func (h *holder) next(t *testing.T, timeout time.Duration) string {
	t.Helper()
	select {
	case line, ok := <-h.lines:
		if !ok {
			h.mu.Lock()
			defer h.mu.Unlock()
			t.Fatalf("holder %s exited; it printed:\n%s", h.name, h.out.String())
		}
		return line
	case <-time.After(timeout):
		h.mu.Lock()
		defer h.mu.Unlock()
		t.Fatalf("holder %s printed nothing for %v; it printed:\n%s", h.name, timeout, h.out.String())
		return ""
	}
}

// token reads the holder's "token N" line.
func (h *holder) token(t *testing.T, timeout time.Duration) uint64 {
	t.Helper()
	line := h.next(t, timeout)
	rest, ok := strings.CutPrefix(line, "token ")
	token, err := strconv.ParseUint(rest, 10, 64)
	if !ok || err != nil {
		t.Fatalf("holder %s: %q; want its token", h.name, line)
	}
	return token
}

func (h *holder) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := h.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("holder %s: %v: %v", h.name, sig, err)
	}
}

// resume lets a paused, gated holder go on to its write.
func (h *holder) resume(t *testing.T) {
	t.Helper()
	if _, err := io.WriteString(h.stdin, "write\n"); err != nil {
		t.Fatal(err)
	}
	h.signal(t, syscall.SIGCONT)
}
