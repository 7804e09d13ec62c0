package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestFailoverKillFollower runs a short failover round against a 3-node
// lockd cluster the workload starts itself: kill -9 of a follower, with
// short leases and waits so that every key is granted again within the
// run whatever the build does about the dead node's grants. It checks
// that the fault hit a follower and that the node came back, that the
// report measures grants on both sides of the fault and the longest gap
// from it, and that the text and JSON reports carry the failover figures.
func TestFailoverKillFollower(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster: skipped in -short mode")
	}
	dir := t.TempDir()
	bin := buildLockd(t, dir)
	cfg := FailoverConfig{
		System: FailoverLockd, Bin: bin, Fault: FaultKill, Victim: VictimFollower,
		Duration: 8 * time.Second, FaultAt: 2 * time.Second, Down: time.Second,
		Callers: 6, Lease: 2 * time.Second, Wait: time.Second, Dir: dir,
	}
	res, err := RunFailover(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	f := res.Failover
	if f == nil {
		t.Fatal("no failover figures in the result")
	}
	if f.VictimNode == f.LeaderNode || f.VictimNode < 1 || f.VictimNode > 3 {
		t.Errorf("victim node %d, leader node %d: want a follower killed", f.VictimNode, f.LeaderNode)
	}
	if f.FaultAtS < 2 || f.BackAtS < f.FaultAtS+1 {
		t.Errorf("fault at %.2fs, node back at %.2fs: want the fault at 2 s and the node back a second later", f.FaultAtS, f.BackAtS)
	}
	if f.BeforeS < 1.9 || f.BeforeS > 2.5 || f.AfterS < 5.5 || f.AfterS > 6.1 || f.GrantsPerSBefore == 0 {
		t.Errorf("%.2fs before the fault, %.2fs after, %g grants/s before: want the 2 s before it, the 6 s after and grants before", f.BeforeS, f.AfterS, f.GrantsPerSBefore)
	}
	// With 2 s leases and 1 s waits every key is granted again well
	// before the end of the 6 s after the fault: the longest gap, a
	// lease and an election at most, ends before the run does.
	if f.LongestGapS <= 0 || f.LongestGapS >= 6 {
		t.Errorf("longest gap from the fault %.2fs: want one that ended within the run", f.LongestGapS)
	}
	if f.Acquires.Granted != res.Outcomes[Acquired.String()].Count || f.Acquires.Granted == 0 {
		t.Errorf("%d grants by kind, %d A outcomes", f.Acquires.Granted, res.Outcomes[Acquired.String()].Count)
	}
	var text bytes.Buffer
	WriteTable(&text, []*Result{res})
	for _, want := range []string{"kill -9 of node", "longest a key went without a grant", "in flight at the fault"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text report lacks %q:\n%s", want, text.String())
		}
	}
	data, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	var back struct {
		Failover *FailoverResult `json:"failover"`
	}
	if err := json.Unmarshal(data, &back); err != nil || back.Failover == nil || back.Failover.LongestGapS != f.LongestGapS {
		t.Errorf("JSON failover figures %+v (%v), want %+v", back.Failover, err, f)
	}
	t.Logf("kill -9 of follower node %d: longest gap %.2fs, grants/s %.0f → %.0f, acquires %+v", f.VictimNode, f.LongestGapS, f.GrantsPerSBefore, f.GrantsPerSAfter, f.Acquires)
}

// TestFailoverConfigRefusesBadShapes: a fault, victim or system the
// workload does not know, or a fault after the run's end, is refused
// before anything starts.
func TestFailoverConfigRefusesBadShapes(t *testing.T) {
	good := FailoverConfig{System: FailoverLockd, Bin: "lockd", Fault: FaultKill, Victim: VictimLeader}
	for name, mutate := range map[string]func(*FailoverConfig){
		"fault":    func(c *FailoverConfig) { c.Fault = "reboot" },
		"victim":   func(c *FailoverConfig) { c.Victim = "everyone" },
		"system":   func(c *FailoverConfig) { c.System = "redis" },
		"binary":   func(c *FailoverConfig) { c.Bin = "" },
		"fault at": func(c *FailoverConfig) { c.Duration, c.FaultAt = 5*time.Second, 6*time.Second },
	} {
		cfg := good
		mutate(&cfg)
		if _, err := RunFailover(context.Background(), cfg); err == nil {
			t.Errorf("%s: a bad config was accepted", name)
		}
	}
	cfg := good
	if err := cfg.applyDefaults(); err != nil || cfg.Duration != DefaultFailoverDuration || cfg.Callers != DefaultFailoverCallers || cfg.Window != DefaultFailoverWindow {
		t.Errorf("defaults: %+v, %v", cfg, err)
	}
}

// buildLockd builds lockd into dir and returns its path.
func buildLockd(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "lockd")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/lockd").CombinedOutput(); err != nil {
		t.Fatalf("build lockd: %v\n%s", err, out)
	}
	return bin
}

// TestMeasureRatesCountsEachHalfSecondAfterTheFault: the grants after the
// fault are counted in half seconds from it (a bucket for a partial last
// half second too), and their sum is the rate's count.
func TestMeasureRatesCountsEachHalfSecondAfterTheFault(t *testing.T) {
	fault := time.Unix(100, 0)
	at := func(ms int) grantEvent { return grantEvent{at: fault.Add(time.Duration(ms) * time.Millisecond)} }
	grants := []grantEvent{at(-1500), at(-10), at(0), at(499), at(500), at(1200), at(1250), at(1700), at(1800)}
	var f FailoverResult
	f.measureRates(grants, fault, 2*time.Second, 1750*time.Millisecond)
	want := []int{2, 1, 2, 1}
	if len(f.GrantsAfter) != len(want) {
		t.Fatalf("half-second counts %v, want %v", f.GrantsAfter, want)
	}
	for i := range want {
		if f.GrantsAfter[i] != want[i] {
			t.Fatalf("half-second counts %v, want %v", f.GrantsAfter, want)
		}
	}
	if f.GrantsPerSBefore != 1 || f.GrantsPerSAfter != 6/1.75 {
		t.Errorf("grants/s before %g, after %g: want 1 and %g", f.GrantsPerSBefore, f.GrantsPerSAfter, 6/1.75)
	}
}
