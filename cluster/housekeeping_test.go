package cluster

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestHousekeepingScenarios runs testdata/housekeeping.txt: node 1's
// housekeeping step of one group on a fake clock, the group's members
// being nodes 1, 2 and 3. A scenario is a title line "scenario: NAME"
// followed by one step per line; "#" starts a comment:
//
//	advance 1.5s                          the fake clock moves on
//	apply acquire NODE ID KEY [wait=D]    one entry applied on node 1's replica (30 s lease)
//	apply release KEY                     the release of KEY's current token
//	apply forget-run                      this run's forget of its earlier runs' waiters
//	heard NODE...                         a message from each node, now
//	load NODE COMMANDS                    commands NODE proposed since the last window
//	placement on                          leader placement runs (FixedLeaders off)
//	restarted                             this run's forget of its earlier runs has not applied
//	orphan KEY                            KEY's current grant has nobody to take it, proposed now
//	step leader=NODE [gather=NODE] -> OUTBOX
//
// OUTBOX lists, comma-separated and in this order, the commands ("forget
// NODE", "forget-run", "leaseend KEY"), then "stamp", "resend", "hold",
// "move NODE", "given-up", "orphan KEY", and last "wake D".
func TestHousekeepingScenarios(t *testing.T) {
	f, err := os.Open("testdata/housekeeping.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var r *replica
	var name string
	failed, scenarios := false, 0 // failed: the rest of the scenario is skipped
	sc := bufio.NewScanner(f)
	for line := 1; sc.Scan(); line++ {
		text, _, _ := strings.Cut(sc.Text(), "#")
		text = strings.TrimSpace(text)
		switch {
		case text == "":
			continue
		case strings.HasPrefix(text, "scenario: "):
			name, r, failed = strings.TrimPrefix(text, "scenario: "), newReplica(t, 1), false
			scenarios++
			continue
		case r == nil:
			t.Fatalf("line %d: a step before the first scenario", line)
		case failed:
			continue
		}
		if err := runHousekeepingStep(r, text); err != nil {
			t.Errorf("%s, line %d: %s: %v", name, line, text, err)
			failed = true
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if scenarios == 0 {
		t.Fatal("no scenario in testdata/housekeeping.txt")
	}
}

func runHousekeepingStep(r *replica, text string) error {
	g := r.f.g
	words := strings.Fields(text)
	arg := func(i int) uint64 {
		if i >= len(words) {
			return 0
		}
		v, _ := strconv.ParseUint(words[i], 10, 64)
		return v
	}
	switch words[0] {
	case "advance":
		d, err := time.ParseDuration(words[1])
		if err != nil {
			return err
		}
		r.clock += d
	case "apply":
		return r.applyScripted(words[1:])
	case "heard":
		for i := 1; i < len(words); i++ {
			r.n().liveness.heard(arg(i), r.clock)
		}
	case "load":
		r.f.mu.Lock()
		r.f.load[arg(1)] += arg(2)
		r.f.mu.Unlock()
	case "placement":
		r.n().cfg.FixedLeaders = words[1] != "on"
	case "restarted":
		g.house.pastRunsForgotten.Store(false)
	case "orphan":
		key := lockKey([]byte("t"), []byte(words[1]))
		g.orphan(key, r.f.tokenOf(key))
		g.releaseOrphans()
		g.mu.Lock()
		g.buf, g.count = g.buf[:datedHeaderLen], 0
		g.mu.Unlock()
	case "step":
		step, want, ok := strings.Cut(text, " -> ")
		if !ok {
			return fmt.Errorf("want step ... -> OUTBOX")
		}
		obs := observed{heard: r.n().liveness.heardAt()}
		for _, w := range strings.Fields(step)[1:] {
			k, v, _ := strings.Cut(w, "=")
			id, err := strconv.ParseUint(v, 10, 64)
			switch {
			case err != nil:
				return fmt.Errorf("%s: %w", w, err)
			case k == "leader":
				obs.leader = id
			case k == "gather":
				obs.gatherOn = id
			default:
				return fmt.Errorf("unknown %s", w)
			}
		}
		got, err := formatOutbox(r, g.step(r.clock, obs))
		if err != nil {
			return err
		}
		if got != strings.TrimSpace(want) {
			return fmt.Errorf("outbox %q, want %q", got, strings.TrimSpace(want))
		}
	default:
		return fmt.Errorf("unknown step %q", words[0])
	}
	return nil
}

// applyScripted applies one entry holding the command words say, dated
// by the fake clock (the wall-clock form of the formats before 5).
func (r *replica) applyScripted(words []string) error {
	var cmd func([]byte) []byte
	switch {
	case words[0] == "acquire" && len(words) >= 4:
		node, _ := strconv.ParseUint(words[1], 10, 64)
		id, _ := strconv.ParseUint(words[2], 10, 64)
		var wait time.Duration
		if len(words) > 4 {
			d, err := time.ParseDuration(strings.TrimPrefix(words[4], "wait="))
			if err != nil {
				return err
			}
			wait = d
		}
		cmd = acquireBy(node, id, words[3], wait)
	case words[0] == "forget-run":
		n := r.n()
		cmd = func(b []byte) []byte { return append(b, n.pastRunsForget()...) }
	case words[0] == "release" && len(words) == 2:
		cmd = releaseOf(r.f.tokenOf(lockKey([]byte("t"), []byte(words[1]))), words[1])
	default:
		return fmt.Errorf("unknown command %q", strings.Join(words, " "))
	}
	r.applyEntry(logBatch(int64(r.clock), cmd))
	return nil
}

// formatOutbox writes out as the scripts spell it.
func formatOutbox(r *replica, out outbox) (string, error) {
	var items []string
	for _, b := range out.commands {
		var c command
		if _, err := readCommand(b, &c); err != nil {
			return "", err
		}
		switch {
		case c.kind == cmdForget && c.node == r.n().cfg.NodeID && c.keepFirst == r.n().idFirst:
			items = append(items, "forget-run")
		case c.kind == cmdForget && c.keepFirst == 1 && c.keepLast == 0:
			items = append(items, fmt.Sprintf("forget %d", c.node))
		case c.kind == cmdLeaseEnd:
			items = append(items, "leaseend "+string(c.key))
		default:
			return "", fmt.Errorf("unexpected command %+v", c)
		}
	}
	flags := []struct {
		set  bool
		item string
	}{
		{out.stamp, "stamp"}, {out.resend, "resend"}, {out.holdProposals, "hold"}, {out.moveLeaderTo != 0, fmt.Sprintf("move %d", out.moveLeaderTo)},
		{out.handOverGivenUp, "given-up"},
	}
	for _, f := range flags {
		if f.set {
			items = append(items, f.item)
		}
	}
	for _, o := range out.orphans {
		_, key := splitLockKey(o.key)
		items = append(items, "orphan "+string(key))
	}
	return strings.Join(append(items, "wake "+out.wake.String()), ", "), nil
}

// The loop carries an outbox out on the group: its commands go into the
// next batch, its orphans back to the orphan releases, and the proposer
// is woken, asked for a dated batch when the step wants one.
func TestCarryOutQueuesTheOutbox(t *testing.T) {
	r := newReplica(t, 1)
	g := r.f.g
	out := outbox{
		commands: [][]byte{appendLeaseEnd(nil, "t", []byte("a")), appendForget(nil, 2, 1, 0)},
		orphans:  []leaseRef{{key: lockKey([]byte("t"), []byte("b")), token: 7}},
		stamp:    true, leaseEnds: 1,
	}
	r.n().carryOut(g, &out)
	if g.waitingCommands() != 2 || !g.dirty.Load() {
		t.Fatalf("%d commands queued (dirty %v), want the outbox's 2", g.waitingCommands(), g.dirty.Load())
	}
	if orphans := g.orphans.take(); len(orphans) != 1 || orphans[0] != out.orphans[0] {
		t.Fatalf("orphan releases %+v, want %+v", orphans, out.orphans)
	}
	if !g.needStamp.Load() || len(g.kick) != 1 || r.n().stats.expires.Load() != 1 {
		t.Fatalf("stamp asked %v, proposer woken %v, lease ends counted %d", g.needStamp.Load(), len(g.kick) == 1, r.n().stats.expires.Load())
	}
}
