package cluster

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"text/tabwriter"
	"time"
)

// faultRoundsEnv sets how many rounds TestProcessFaultRounds runs; `make
// fault-test` runs 100. Without it the test runs shortFaultRounds.
const faultRoundsEnv = "LOCKD_FAULT_ROUNDS"

// shortFaultRounds is the default, `make test`'s short case: the first
// kinds of faultKinds, those the other process tests do not inflict.
const shortFaultRounds = 6

// A processFault is one kind of round of TestProcessFaultRounds.
type processFault string

const (
	faultKillLeader    processFault = "kill -9 of the leader"
	faultKillFollower  processFault = "kill -9 of a follower"
	faultTermLeader    processFault = "SIGTERM of the leader"
	faultTermFollower  processFault = "SIGTERM of a follower"
	faultStopLeader    processFault = "SIGSTOP of the leader for 3 s"
	faultStopFollower  processFault = "SIGSTOP of a follower for 3 s"
	faultPartition     processFault = "partition of the leader"
	faultRestartAll    processFault = "kill -9 of all three, restart"
	faultClockLeader   processFault = "wall clock of the leader stepped ±1 h"
	faultClockFollower processFault = "wall clock of a follower stepped ±1 h"
)

// faultFrozen is how long a SIGSTOP round keeps its node frozen, and a
// clock-step round its node's wall clock stepped: longer than the leases
// of the traffic, so that leases granted before the step end during it.
const faultFrozen = 3 * time.Second

// termGrace bounds how long a SIGTERM'd node may take to drain and exit.
const termGrace = 30 * time.Second

// faultTally is what the rounds of one kind of fault measured.
type faultTally struct {
	rounds     int
	recoveries recoveries
	exclusion  int // claims that overlapped an earlier one on their key
	fencing    int // tokens not above the one before on their key
}

// faultRound is when one round's fault hit, for attributing violations.
type faultRound struct {
	fault processFault
	at    time.Time
}

// TestProcessFaultRounds runs 3 lockd processes under continuous lock
// traffic and, round after round, hits them with one kind of fault after
// the other: kill -9, SIGTERM and SIGSTOP of the leader of one group and
// of a follower, a partition cutting that leader off (as root, where the
// nodes run in network namespaces of their own), kill -9 of the whole
// cluster followed by its restart, and a step of the leader's or a
// follower's wall clock by an hour, ahead or behind, for faultFrozen
// (through the clockhook build of lockd: nothing of a lease may depend
// on it). After each fault it measures how long
// until the group's hot key is acquirable again through a node that is
// up (probeRecovery, which fails the test if that takes a minute), brings
// the node back, and waits until it serves again before the next round.
// At the end the history checker proves that no two clients ever held a
// key at once and that fencing tokens never went back, and the test
// prints, per kind of fault, its rounds, the longest recovery and the
// violations in the rounds of that kind. LOCKD_FAULT_ROUNDS sets the
// number of rounds (default shortFaultRounds).
func TestProcessFaultRounds(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test skipped in -short mode")
	}
	// In turn; the first shortFaultRounds are the kinds TestProcessesKillLeader
	// and TestProcessesPartitions do not cover.
	faults := []processFault{faultTermLeader, faultKillFollower, faultRestartAll, faultTermFollower,
		faultClockLeader, faultClockFollower, faultKillLeader, faultStopLeader, faultPartition, faultStopFollower}
	dir := t.TempDir()
	bin := buildLockd(t, dir, "clockhook") // a node's wall clock steps through its data dir (cmd/lockd)
	const groups = 4
	var (
		procs   []*proc
		exe     = bin
		network *netnsNetwork
	)
	if os.Geteuid() == 0 {
		network = newNetnsNetwork(t, 3)
		procs, exe = startNetnsProcesses(t, network, bin, dir, groups)
	} else {
		t.Logf("not root: no network namespaces, so no partition rounds (run as root for them)")
		faults = slices.DeleteFunc(faults, func(f processFault) bool { return f == faultPartition })
		procs = startProcesses(t, bin, dir, groups)
	}
	rounds := shortFaultRounds
	if s := os.Getenv(faultRoundsEnv); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: want a positive number of rounds", faultRoundsEnv, s)
		}
		rounds = n
	}
	testStart := time.Now()
	const key0 = "fault/0"
	g0 := groupOf("default", []byte(key0), groups)
	groupLeader(t, procs, g0)
	traffic := startLockTraffic(procs, []string{key0, "fault/1", "fault/2", "fault/3", "fault/4", "fault/5"}, 6)

	tallies := map[processFault]*faultTally{}
	var history []faultRound
	for round := range rounds {
		fault := faults[round%len(faults)]
		traffic.awaitGrants(t, 40, fmt.Sprintf("round %d (%s), before the fault", round, fault))
		leader := groupLeader(t, procs, g0)
		victim := leader
		if strings.Contains(string(fault), "follower") {
			victim = 1 + leader%3
		}
		p := procs[victim-1]
		other := procs[victim%3] // a node the fault leaves up
		probeKey := keyInGroup(fmt.Sprintf("probe/%d", round), g0, groups)
		at := time.Now()
		var recovered time.Duration
		switch fault {
		case faultKillLeader, faultKillFollower:
			p.kill9()
			recovered = probeRecovery(t, other, key0, at)
			p.start(t, exe)
		case faultTermLeader, faultTermFollower:
			p.signal(syscall.SIGTERM)
			recovered = probeRecovery(t, other, key0, at)
			select {
			case <-p.done:
				p.cmd = nil
			case <-time.After(termGrace):
				t.Fatalf("round %d: node %d had not exited %v after SIGTERM", round, victim, termGrace)
			}
			p.start(t, exe)
		case faultStopLeader, faultStopFollower:
			p.signal(syscall.SIGSTOP)
			recovered = probeRecovery(t, other, key0, at)
			time.Sleep(time.Until(at.Add(faultFrozen))) // the fault itself: the node is frozen this long
			p.signal(syscall.SIGCONT)
		case faultPartition:
			network.isolate(victim)
			recovered = probeRecovery(t, other, key0, at)
			network.heal(victim)
		case faultClockLeader, faultClockFollower:
			step := time.Hour // ahead, or behind: in turn over the rounds of each kind
			if (round+round/len(faults))%2 == 1 {
				step = -step
			}
			stepWallClock(t, p, step)
			recovered = probeRecovery(t, other, key0, at)
			time.Sleep(time.Until(at.Add(faultFrozen))) // the fault itself: the clock stays stepped this long
			stepWallClock(t, p, 0)
		case faultRestartAll:
			for _, q := range procs {
				q.kill9()
			}
			for _, q := range procs {
				q.start(t, exe)
			}
			recovered = probeRecovery(t, procs[0], key0, at)
			victim = 0
		}
		// Every node serves again before the next round: a node still
		// catching up would make the next fault a loss of quorum.
		for _, q := range procs {
			probeRecovery(t, q, probeKey, time.Now())
		}
		tally := tallies[fault]
		if tally == nil {
			tally = &faultTally{}
			tallies[fault] = tally
		}
		tally.rounds++
		tally.recoveries = append(tally.recoveries, recovered)
		history = append(history, faultRound{fault: fault, at: at})
		t.Logf("round %d: %s (node %d; leader of group %d was node %d): %s acquirable again after %v",
			round, fault, victim, g0+1, leader, key0, recovered.Round(time.Millisecond))
	}
	traffic.awaitGrants(t, 40, "after the last round")
	traffic.finish()

	total := traffic.checkHistory(t)
	_, violations := traffic.violations()
	for _, v := range violations {
		// The round whose fault came last before the offending claim.
		i, _ := slices.BinarySearchFunc(history, v.at, func(r faultRound, at time.Time) int { return r.at.Compare(at) })
		if i == 0 {
			t.Errorf("violation before the first fault: %s", v)
			continue
		}
		if v.fencing {
			tallies[history[i-1].fault].fencing++
		} else {
			tallies[history[i-1].fault].exclusion++
		}
	}
	var table strings.Builder
	tw := tabwriter.NewWriter(&table, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "fault\trounds\tlongest recovery\tp50\texclusion violations\tfencing violations\n")
	for _, f := range faults {
		if tally := tallies[f]; tally != nil {
			sorted := slices.Sorted(slices.Values(tally.recoveries))
			fmt.Fprintf(tw, "%s\t%d\t%v\t%v\t%d\t%d\n", f, tally.rounds, sorted[len(sorted)-1].Round(time.Millisecond),
				sorted[len(sorted)/2].Round(time.Millisecond), tally.exclusion, tally.fencing)
		}
	}
	tw.Flush()
	t.Logf("%d rounds in %v; history: %d grants checked, %d violations; responses %v (E by reason %v); %d grants arrived after their validity and were released\n%s",
		rounds, time.Since(testStart).Round(time.Second), total, len(violations), fmtStats(traffic.stats), traffic.errors,
		traffic.lateGrants, table.String())
	traffic.checkAbandons(t)
	if total < 50*rounds/len(faults) {
		t.Fatalf("only %d grants in %d rounds", total, rounds)
	}
}

// stepWallClock sets p's wall clock to run offset from the host's, through
// the clockhook build's file in its data dir, and waits until p says it
// took the offset.
func stepWallClock(t *testing.T, p *proc, offset time.Duration) {
	t.Helper()
	dataDir := p.args[slices.Index(p.args, "--data-dir")+1]
	said := fmt.Sprintf("test hook: wall clock offset %v\n", offset)
	before := 0
	if log, err := os.ReadFile(p.log); err == nil {
		before = strings.Count(string(log), said)
	}
	if err := os.WriteFile(filepath.Join(dataDir, "wall-offset"), []byte(offset.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, fmt.Sprintf("node %d's wall clock offset %v", p.id, offset), func() bool {
		log, _ := os.ReadFile(p.log)
		return strings.Count(string(log), said) > before
	})
}
