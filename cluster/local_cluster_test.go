package cluster

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// freeBase finds a port range BASE+1..BASE+23 whose ports local-cluster.sh
// uses all free now.
func freeBase(t *testing.T) int {
	t.Helper()
	for range 50 {
		base := 20000 + rand.IntN(30000)
		var ls []net.Listener
		free := true
		for _, off := range []int{1, 2, 3, 11, 12, 13, 21, 22, 23} {
			l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", base+off))
			if err != nil {
				free = false
				break
			}
			ls = append(ls, l)
		}
		for _, l := range ls {
			l.Close()
		}
		if free {
			return base
		}
	}
	t.Fatal("no free port range")
	return 0
}

// make cluster's ports move with CLUSTER_BASE_PORT, so that it can run
// beside another cluster or anything on the default ports.
func TestLocalClusterPortsAreOverridable(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test skipped in -short mode")
	}
	base := freeBase(t)
	cmd := exec.Command("bash", "local-cluster.sh")
	cmd.Env = append(cmd.Environ(), fmt.Sprintf("CLUSTER_BASE_PORT=%d", base), "LOCKD_CLUSTER_DIR="+t.TempDir(), "LOG_LEVEL=info")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	up := false
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "lockd cluster up") {
				up = true
				t.Logf("%s", sc.Text())
				for n := 1; n <= 3; n++ {
					admin := fmt.Sprintf("127.0.0.1:%d", base+10+n)
					resp, err := (&http.Client{Timeout: 10 * time.Second}).Get("http://" + admin + "/healthz")
					if err != nil {
						t.Errorf("node %d admin on %s: %v", n, admin, err)
						continue
					}
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						t.Errorf("node %d /healthz on %s: %s", n, admin, resp.Status)
					}
				}
				syscall.Kill(cmd.Process.Pid, syscall.SIGTERM) // the script's trap stops the nodes
			}
		}
		close(exited)
	}()
	select {
	case <-exited:
	case <-time.After(5 * time.Minute):
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		t.Fatal("local-cluster.sh did not come up and stop")
	}
	cmd.Wait()
	if !up {
		t.Fatal("local-cluster.sh exited without bringing the cluster up")
	}
	// The nodes are gone with the script: their ports are free again.
	for n := 1; n <= 3; n++ {
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", base+n))
		if err != nil {
			t.Errorf("node %d still holds its client port after the script stopped: %v", n, err)
			continue
		}
		l.Close()
	}
}
