package cluster

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lockd/lockd/client"
)

// upgradeStepsEnv, when set, is how many grants the rolling-upgrade test
// waits for after each step (make upgrade-test); the default keeps it
// short enough for make test.
const upgradeStepsEnv = "LOCKD_UPGRADE_GRANTS"

const (
	shortUpgradeGrants = 300
	upgradeLease       = 30 * time.Second // the failover workload's lease
	upgradeWait        = 5 * time.Second
	upgradeHold        = 5 * time.Millisecond
	upgradeMaxGap      = 2 * time.Second
	upgradeGroups      = 2
)

// TestProcessRollingUpgrade starts a 3-node cluster on the previous build
// (testdata/upgrade-from, built from this repository's history), runs
// lock traffic with 30 s leases through the client, and replaces the
// nodes one at a time with this build: SIGTERM, the new binary started on
// the same data dir, and the next only once the node answers the
// membership read that lockctl cluster list makes (a linearizable read of
// every group through it: it has caught up). It asserts no exclusion or
// fencing violation (the history checker), no indeterminate outcome, no
// key more than 2 s without a grant, the groups' log format 3 while a
// node of the previous build is a member and the newest once none is; and then
// that the previous build, started on an upgraded node's data dir,
// halts its replicas there and says why, and this build then starts on
// it again.
//
// Each change to the log or snapshot format adds its case here: the
// previous build's file names the build to upgrade from.
func TestProcessRollingUpgrade(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test skipped in -short mode")
	}
	grants := shortUpgradeGrants
	if s := os.Getenv(upgradeStepsEnv); s != "" {
		var err error
		if grants, err = strconv.Atoi(s); err != nil || grants < 1 {
			t.Fatalf("%s=%q: want a count of grants >= 1", upgradeStepsEnv, s)
		}
	}
	dir := t.TempDir()
	prev := buildPrevious(t, dir)
	cur := buildLockd(t, dir)
	procs := startProcesses(t, prev, dir, upgradeGroups)
	for g := range upgradeGroups {
		groupLeader(t, procs, g)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	lt := startUpgradeTraffic(ctx, t, procs, 8, 6)
	defer lt.shutdown()
	lt.await(t, grants, "on the previous build")

	var lastUpgrade time.Time // no group could raise its format before
	for i, p := range procs {
		if i == len(procs)-1 {
			lastUpgrade = time.Now()
			// Two nodes of this build, one of the previous: no group may
			// write what the previous build cannot read.
			for _, q := range procs[:i] {
				if f := logFormats(t, q); !slices.Equal(f, []float64{3, 3}) {
					t.Fatalf("node %d: log formats %v with node %d still on the previous build, want 3", q.id, f, p.id)
				}
			}
		}
		drain(t, p)
		p.start(t, cur)
		awaitCaughtUp(t, p)
		lt.await(t, grants, fmt.Sprintf("after node %d's upgrade", p.id))
	}
	for _, p := range procs {
		waitFor(t, 30*time.Second, fmt.Sprintf("node %d's groups at log format %d", p.id, logFormatNewest), func() bool {
			return slices.Equal(logFormats(t, p), []float64{logFormatNewest, logFormatNewest})
		})
	}

	// The downgrade: every replica snapshots once its group's format rose,
	// so the previous build meets the newest snapshot version at start.
	victim := procs[0]
	waitFor(t, 30*time.Second, "node 1's snapshots after the format rose", func() bool {
		return groupsSnapshotSince(t, victim, lastUpgrade) == upgradeGroups
	})
	// Its replicas halt there, applying nothing (the node answers their
	// groups E unavailable), and its log says what they met.
	drain(t, victim)
	victim.start(t, prev)
	refused := fmt.Sprintf("snapshot version %d (this build reads 7)", snapshotVersion)
	waitFor(t, time.Minute, "the previous build's replicas to halt on "+refused, func() bool {
		log, _ := os.ReadFile(victim.log)
		return strings.Count(string(log), refused) >= upgradeGroups
	})
	drain(t, victim)
	victim.start(t, cur)
	awaitCaughtUp(t, victim)
	lt.await(t, grants, "after the refused downgrade")

	lt.shutdown()
	checked := lt.checkHistory(t)
	gap := lt.longestGap()
	t.Logf("%d grants checked, longest gap without a grant on a key %v, other errors %v", checked, gap, lt.others)
	if lt.indeterminate > 0 {
		t.Errorf("%d indeterminate outcomes (first: %v)", lt.indeterminate, lt.firstIndeterminate)
	}
	if gap > upgradeMaxGap {
		t.Errorf("a key went %v without a grant, want at most %v", gap, upgradeMaxGap)
	}
}

// buildPrevious builds lockd at the commit testdata/upgrade-from names,
// from this repository's history (git archive: it leaves nothing in the
// clone), into dir.
func buildPrevious(t *testing.T, dir string) string {
	t.Helper()
	b, err := os.ReadFile("testdata/upgrade-from")
	if err != nil {
		t.Fatal(err)
	}
	var commit string
	for line := range strings.Lines(string(b)) {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			commit = line
			break
		}
	}
	if out, err := exec.Command("git", "rev-parse", "--is-inside-work-tree").CombinedOutput(); err != nil {
		t.Skipf("not in a git checkout, so the previous build %s cannot be built: %v %s", commit, err, out)
	}
	if out, err := exec.Command("git", "cat-file", "-e", commit+"^{commit}").CombinedOutput(); err != nil {
		t.Fatalf("the previous build %s (testdata/upgrade-from) is not in this clone's history (a shallow clone? git fetch --unshallow): %v %s", commit, err, out)
	}
	src := filepath.Join(dir, "previous-src")
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	top, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Fatal(err)
	}
	archive := exec.Command("sh", "-c", `git -C "$1" archive --format=tar "$2" | tar -x -C "$3"`, "sh", strings.TrimSpace(string(top)), commit, src)
	if out, err := archive.CombinedOutput(); err != nil {
		t.Fatalf("git archive %s: %v\n%s", commit, err, out)
	}
	bin := filepath.Join(dir, "lockd-previous")
	// -trimpath: the build cache then knows the sources from an earlier
	// run, extracted to another temporary dir.
	build := exec.Command("go", "build", "-trimpath", "-o", bin, "./cmd/lockd")
	build.Dir = src
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build lockd at %s: %v\n%s", commit, err, out)
	}
	return bin
}

// drain stops p with SIGTERM and waits for it to exit.
func drain(t *testing.T, p *proc) {
	t.Helper()
	p.signal(syscall.SIGTERM)
	select {
	case <-p.done:
		p.cmd = nil
	case <-time.After(termGrace):
		t.Fatalf("node %d did not exit within %v of SIGTERM", p.id, termGrace)
	}
}

// awaitCaughtUp waits until p answers the membership read lockctl
// cluster list makes: it reads every group through Raft, which succeeds
// once p's replica applied all its leader had committed when asked.
func awaitCaughtUp(t *testing.T, p *proc) {
	t.Helper()
	c := http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	waitFor(t, time.Minute, fmt.Sprintf("node %d to answer cluster list", p.id), func() bool {
		resp, err := c.Get("http://" + p.admin + MembersPath)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// logFormats is p's lockd_cluster_log_format by group, nil when it has
// none (the previous build).
func logFormats(t *testing.T, p *proc) []float64 {
	t.Helper()
	c := http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get("http://" + p.admin + "/metrics")
	if err != nil {
		t.Fatalf("node %d /metrics: %v", p.id, err)
	}
	defer resp.Body.Close()
	out := make([]float64, upgradeGroups)
	found := false
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		for g := range upgradeGroups {
			if rest, ok := strings.CutPrefix(sc.Text(), fmt.Sprintf("lockd_cluster_log_format{group=\"%d\"} ", g+1)); ok {
				out[g], _ = strconv.ParseFloat(rest, 64)
				found = true
			}
		}
	}
	if !found {
		return nil
	}
	return out
}

var snapshotDirName = regexp.MustCompile(`^snapshot-[0-9A-F]+$`)

// groupsSnapshotSince counts the groups of which p's data dir holds a
// snapshot written since the instant given.
func groupsSnapshotSince(t *testing.T, p *proc, since time.Time) int {
	t.Helper()
	groups := map[string]bool{} // a group's replica's snapshot dir
	root := filepath.Join(filepath.Dir(p.log), fmt.Sprintf("data%d", p.id))
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() || !snapshotDirName.MatchString(d.Name()) {
			return nil // an error: a snapshot dir renamed under the walk
		}
		if info, err := d.Info(); err == nil && info.ModTime().After(since) {
			groups[filepath.Dir(path)] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return len(groups)
}

// upgradeTraffic is the failover workload's load through the client:
// callers cycling over keys, each cycle an acquire with a 30 s lease,
// a short hold and a release. It records the claims for the history
// checker, every grant's instant, and the outcomes that are neither a
// grant, a release, nor a wait that elapsed on a held key.
type upgradeTraffic struct {
	lockTraffic
	grantsAt           map[string][]time.Time
	indeterminate      int
	firstIndeterminate error
	others             map[string]int
	start              time.Time
	end                time.Time
	cancel             context.CancelFunc
	done               sync.WaitGroup
	stopped            bool
}

func startUpgradeTraffic(ctx context.Context, t *testing.T, procs []*proc, callers, keys int) *upgradeTraffic {
	t.Helper()
	lt := &upgradeTraffic{grantsAt: map[string][]time.Time{}, others: map[string]int{}, start: time.Now()}
	ctx, lt.cancel = context.WithCancel(ctx)
	var addrs []string
	for _, p := range procs {
		addrs = append(addrs, p.listen)
	}
	for i := range callers {
		rotated := append(slices.Clone(addrs[i%len(addrs):]), addrs[:i%len(addrs)]...)
		c, err := client.Dial(ctx, client.Config{Addrs: rotated})
		if err != nil {
			t.Fatal(err)
		}
		lt.done.Add(1)
		go func() {
			defer lt.done.Done()
			defer c.Close()
			lt.caller(ctx, c, i, keys)
		}()
	}
	return lt
}

func (lt *upgradeTraffic) caller(ctx context.Context, c *client.Client, i, keys int) {
	for n := i; ctx.Err() == nil; n++ {
		key := fmt.Sprintf("upgrade/%d", n%keys)
		ticket, err := c.Acquire(ctx, key, client.AcquireOptions{Lease: upgradeLease, Wait: upgradeWait, MinWorkBudget: client.Budget(0)})
		if err != nil {
			lt.note(ctx, err)
			continue
		}
		start := time.Now()
		lt.mu.Lock()
		lt.grantsAt[key] = append(lt.grantsAt[key], start)
		lt.mu.Unlock()
		lt.hold(interval{key: key, token: ticket.Token(), start: start}, upgradeHold, ticket.ValidUntil())
		if err := c.Release(context.WithoutCancel(ctx), ticket); err != nil {
			lt.note(ctx, err)
		}
	}
}

// note records an outcome that was not a grant or release.
func (lt *upgradeTraffic) note(ctx context.Context, err error) {
	if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		return // the traffic stopping
	}
	lt.mu.Lock()
	defer lt.mu.Unlock()
	switch {
	case errors.Is(err, client.ErrIndeterminate):
		lt.indeterminate++
		if lt.firstIndeterminate == nil {
			lt.firstIndeterminate = err
		}
	case errors.Is(err, client.ErrTimeout):
		// the key stayed held by others for the whole wait
	default:
		lt.others[err.Error()]++
	}
}

// await waits until the traffic recorded n more grants, failing the test
// if that takes a minute.
func (lt *upgradeTraffic) await(t *testing.T, n int, while string) {
	t.Helper()
	lt.mu.Lock()
	want := len(lt.history) + n
	lt.mu.Unlock()
	waitFor(t, time.Minute, fmt.Sprintf("%d grants %s", n, while), func() bool {
		lt.mu.Lock()
		defer lt.mu.Unlock()
		return len(lt.history) >= want
	})
}

// shutdown ends the traffic and waits for its callers; the releases in
// flight finish.
func (lt *upgradeTraffic) shutdown() {
	if lt.stopped {
		return
	}
	lt.stopped = true
	lt.end = time.Now()
	lt.cancel()
	lt.done.Wait()
}

// longestGap is the longest time a key went without a grant, from the
// traffic's start to its end.
func (lt *upgradeTraffic) longestGap() time.Duration {
	var longest time.Duration
	for _, at := range lt.grantsAt {
		slices.SortFunc(at, func(a, b time.Time) int { return a.Compare(b) })
		prev := lt.start
		for _, g := range append(at, lt.end) {
			longest = max(longest, g.Sub(prev))
			prev = g
		}
	}
	return longest
}
