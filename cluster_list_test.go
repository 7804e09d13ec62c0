package lockd_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

var lockctlBinary struct {
	once sync.Once
	path string
	err  error
	out  []byte
}

// buildLockctl builds cmd/lockctl once for the tests of this package.
func buildLockctl(t *testing.T) string {
	t.Helper()
	lockctlBinary.once.Do(func() {
		lockctlBinary.path = filepath.Join(filepath.Dir(buildLockd(t)), "lockctl")
		lockctlBinary.out, lockctlBinary.err = exec.Command("go", "build", "-o", lockctlBinary.path, "./cmd/lockctl").CombinedOutput()
	})
	if lockctlBinary.err != nil {
		t.Fatalf("build lockctl: %v\n%s", lockctlBinary.err, lockctlBinary.out)
	}
	return lockctlBinary.path
}

// clusterList runs lockctl cluster list against admin and returns each
// node's REACHABLE column by id, and what lockctl wrote.
func clusterList(t *testing.T, lockctl, admin string) (map[string]string, string, error) {
	t.Helper()
	cmd := exec.Command(lockctl, "--admin", admin, "cluster", "list")
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	out, err := cmd.CombinedOutput()
	reachable := map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^(\d+)\s+\S+\s+\S+\s+(?:[\d,]+\s+)?(self|yes|down|no|unknown)\s`).FindAllStringSubmatch(string(out), -1) {
		reachable[m[1]] = m[2]
	}
	return reachable, string(out), err
}

// TestClusterListLiveness: lockctl cluster list asked of any node shows
// every peer reachable, whether or not the two lead a group together;
// a killed node reads down from every node left within 2 s. A
// single-mode server says it is single mode.
func TestClusterListLiveness(t *testing.T) {
	f := startFleet(t)
	lockctl := buildLockctl(t)
	for i, p := range f.nodes {
		reachable, out, err := clusterList(t, lockctl, p.admin)
		self := string(rune('1' + i))
		for _, id := range []string{"1", "2", "3"} {
			want := "yes"
			if id == self {
				want = "self"
			}
			if err != nil || reachable[id] != want {
				t.Fatalf("cluster list from node %s: node %s reads %q, want %q (%v)\n%s", self, id, reachable[id], want, err, out)
			}
		}
	}

	f.nodes[2].kill()
	killed := time.Now()
	for _, p := range f.nodes[:2] {
		for {
			reachable, out, err := clusterList(t, lockctl, p.admin)
			if reachable["3"] == "down" {
				break
			}
			if time.Since(killed) > 2*time.Second {
				t.Fatalf("cluster list from %s 2 s after node 3 was killed: node 3 reads %q (%v)\n%s", p.name, reachable["3"], err, out)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}

	_, out, err := clusterList(t, lockctl, f.single.admin)
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 || !strings.Contains(out, "this lockd runs in single mode") || strings.Contains(out, "404") {
		t.Fatalf("cluster list of a single-mode server: %v\n%s", err, out)
	}
}
