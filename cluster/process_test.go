package cluster

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lockd/lockd/codec"
	"github.com/lockd/lockd/internal/poll"
)

// proc is one lockd process of the multi-process test.
type proc struct {
	id     uint64
	args   []string
	listen string
	admin  string
	log    string
	cmd    *exec.Cmd
	done   chan struct{}
	// dial reaches listen and admin; nil means from the test's own network
	// namespace (the partition test dials into the node's namespace).
	dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

// serveArgs is the `lockd serve --cluster` command line of p.
func (p *proc) serveArgs(raftAddr string, peers []string, dir string, groups int, proposeTimeout time.Duration) []string {
	return []string{"serve", "--cluster", "--node-id", strconv.FormatUint(p.id, 10),
		"--raft-addr", raftAddr, "--peers", strings.Join(peers, ","),
		"--data-dir", filepath.Join(dir, fmt.Sprintf("data%d", p.id)), "--groups", strconv.Itoa(groups),
		"--listen", p.listen, "--admin", p.admin, "--log-level", "warn",
		"--propose-timeout", proposeTimeout.String()}
}

func (p *proc) start(t *testing.T, bin string) {
	t.Helper()
	f, err := os.OpenFile(p.log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, p.args...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		t.Fatal(err)
	}
	p.cmd, p.done = cmd, make(chan struct{})
	go func() { _ = cmd.Wait(); f.Close(); close(p.done) }()
}

func (p *proc) kill9() {
	if p.cmd != nil {
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		<-p.done
		p.cmd = nil
	}
}

func (p *proc) alive() bool { return p.cmd != nil }

// raftAddr is the Raft address p was started with.
func (p *proc) raftAddr() string { return p.args[slices.Index(p.args, "--raft-addr")+1] }

// signal sends sig (SIGSTOP, SIGCONT) to the running process.
func (p *proc) signal(sig syscall.Signal) {
	if p.cmd != nil {
		_ = p.cmd.Process.Signal(sig)
	}
}

// connect opens a protocol connection to the process's client port.
func (p *proc) connect() (*wire, error) {
	if p.dial == nil {
		return dialWire(p.listen)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	nc, err := p.dial(ctx, "tcp", p.listen)
	if err != nil {
		return nil, err
	}
	return newWire(nc)
}

// leaderView reads the process's view of group g's leader from /metrics
// (0 while it knows none).
func (p *proc) leaderView(g int) (uint64, error) {
	return p.metric(fmt.Sprintf("lockd_cluster_group_leader{group=\"%d\"}", g+1))
}

// metric reads the value of series (a name and its labels) from the
// process's /metrics.
func (p *proc) metric(series string) (uint64, error) {
	// No keep-alive: no idle connection (and its goroutines) outlives the call.
	c := http.Client{Timeout: time.Second, Transport: &http.Transport{DialContext: p.dial, DisableKeepAlives: true}}
	resp, err := c.Get("http://" + p.admin + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			return strconv.ParseUint(rest, 10, 64)
		}
	}
	return 0, fmt.Errorf("node %d: no %s in /metrics", p.id, series)
}

// hold is a claim's work, the one of both traffics: its client holds the
// lock for d, then the claim iv is recorded as ending then, or at
// validUntil if that is earlier (the client stops trusting the lock
// there).
func (lt *lockTraffic) hold(iv interval, d time.Duration, validUntil time.Time) {
	time.Sleep(d)
	iv.end = time.Now()
	if iv.end.After(validUntil) {
		iv.end = validUntil
	}
	lt.mu.Lock()
	lt.history = append(lt.history, iv)
	lt.mu.Unlock()
}

// buildLockd builds the lockd binary into dir.
func buildLockd(t *testing.T, dir string, tags ...string) string {
	t.Helper()
	bin := filepath.Join(dir, "lockd")
	build := exec.Command("go", "build", "-tags", strings.Join(tags, ","), "-o", bin, "../cmd/lockd")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build lockd: %v\n%s", err, out)
	}
	return bin
}

// startProcesses starts 3 lockd cluster processes of bin on loopback, with
// groups Raft groups, their data and logs in dir, killed at the end of
// the test. It returns before leaders are elected.
func startProcesses(t *testing.T, bin, dir string, groups int) []*proc {
	t.Helper()
	ports := freePorts(t, 9)
	var peers []string
	for i := range 3 {
		peers = append(peers, fmt.Sprintf("%d=127.0.0.1:%d", i+1, ports[i]))
	}
	procs := make([]*proc, 3)
	for i := range 3 {
		p := &proc{
			id:     uint64(i + 1),
			listen: fmt.Sprintf("127.0.0.1:%d", ports[3+i]),
			admin:  fmt.Sprintf("127.0.0.1:%d", ports[6+i]),
			log:    filepath.Join(dir, fmt.Sprintf("node%d.log", i+1)),
		}
		p.args = p.serveArgs(fmt.Sprintf("127.0.0.1:%d", ports[i]), peers, dir, groups, 2*time.Second)
		procs[i] = p
	}
	killOnCleanup(t, procs)
	for _, p := range procs {
		p.start(t, bin)
	}
	return procs
}

// killOnCleanup kills every process at the end of the test and, if it
// failed, logs the tail of each process's log.
func killOnCleanup(t *testing.T, procs []*proc) {
	t.Cleanup(func() {
		for _, p := range procs {
			p.kill9()
		}
		if t.Failed() {
			for _, p := range procs {
				b, _ := os.ReadFile(p.log)
				t.Logf("--- node %d log (tail) ---\n%s", p.id, tail(string(b), 3000))
			}
		}
	})
}

// groupLeader returns the leader of group g as seen by a running process,
// waiting up to 20 s for one that is itself running.
func groupLeader(t *testing.T, procs []*proc, g int) uint64 {
	t.Helper()
	var lastErr error // why the last view failed, for the failure message
	var leader uint64
	found := poll.Until(20*time.Second, 50*time.Millisecond, func() bool {
		for _, p := range procs {
			if p.alive() {
				l, err := p.leaderView(g)
				if err != nil {
					lastErr = err
				} else if l != 0 && procs[l-1].alive() {
					leader = l
					return true
				}
			}
		}
		return false
	})
	if !found {
		t.Fatalf("no leader for group %d (last /metrics error: %v)", g+1, lastErr)
	}
	return leader
}

// Lock traffic of the multi-process tests: 1 s leases, and a claim ends
// this much before the client's validity bound, for clock drift.
const (
	trafficLease  = 1 // seconds
	trafficMargin = 20 * time.Millisecond
)

// lockTraffic is continuous lock traffic over the wire from worker
// goroutines, each connected to a random process, and what it recorded:
// every claim, every answer by op and every E by reason. The first key is
// the one whose recovery the fault tests measure: its claims are always
// released, so a lease it sits out after a fault is the fault's (a dead
// or frozen node's holder or waiter), not one a live client kept.
type lockTraffic struct {
	keys []string

	mu      sync.Mutex
	procs   []*proc // what the workers connect to
	history []interval
	stats   map[byte]int
	errors  map[codec.Reason]int
	// lateGrants counts grants that arrived after their validity ended,
	// which a client does not take.
	lateGrants int
	// abandons counts the answers to the ABANDONs (SPEC §6a) the workers
	// sent for their indeterminate acquires, by op; abandonsLost those
	// that got none (the lock is left to its lease).
	abandons     map[byte]int
	abandonsLost int

	stop chan struct{}
	wg   sync.WaitGroup
}

func startLockTraffic(procs []*proc, keys []string, workers int) *lockTraffic {
	lt := &lockTraffic{procs: slices.Clone(procs), keys: keys, stats: map[byte]int{},
		errors: map[codec.Reason]int{}, abandons: map[byte]int{}, stop: make(chan struct{})}
	for w := range workers {
		lt.wg.Add(1)
		go lt.worker(w)
	}
	return lt
}

// pick is a random process to connect to (a dead one fails to connect).
func (lt *lockTraffic) pick(rng *rand.Rand) *proc {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	return lt.procs[rng.IntN(len(lt.procs))]
}

// serveThrough makes the traffic connect to p too (a node added later).
func (lt *lockTraffic) serveThrough(p *proc) {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	lt.procs = append(lt.procs, p)
}

// awaitGrants waits until the traffic has recorded n more claims than
// when it was called: the cluster is given time to serve in terms of what
// it served, not of a clock. It fails the test if that takes a minute.
func (lt *lockTraffic) awaitGrants(t *testing.T, n int, while string) {
	t.Helper()
	lt.mu.Lock()
	want := len(lt.history) + n
	lt.mu.Unlock()
	var got int
	done := poll.Until(time.Minute, 10*time.Millisecond, func() bool {
		lt.mu.Lock()
		got = len(lt.history)
		lt.mu.Unlock()
		return got >= want
	})
	if !done {
		t.Fatalf("%s: the traffic recorded %d of %d more grants in a minute (responses %v)", while, n-(want-got), n, fmtStats(lt.snapshotStats()))
	}
}

func (lt *lockTraffic) snapshotStats() map[byte]int {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	return maps.Clone(lt.stats)
}

// finish stops the workers and waits for them.
func (lt *lockTraffic) finish() {
	close(lt.stop)
	lt.wg.Wait()
}

// lostAcquire is an acquire a worker sent on a session and never got
// the answer of: its ABANDON is due (SPEC §6a).
type lostAcquire struct {
	owner uint64
	key   string
	at    time.Time
}

// abandonWithin is how long after the loss a worker still sends its
// ABANDON, as the official clients' compensation queue does (5 s).
const abandonWithin = 5 * time.Second

func (lt *lockTraffic) worker(w int) {
	defer lt.wg.Done()
	rng := rand.New(rand.NewPCG(uint64(w), 7))
	var clientID [codec.ClientIDLen]byte
	binary.BigEndian.PutUint64(clientID[:], rng.Uint64())
	binary.BigEndian.PutUint64(clientID[8:], rng.Uint64())
	var c *wire
	session := false // c sent SESSION
	var lost []lostAcquire
	owner := uint64(0)
	defer func() {
		if c != nil {
			c.close()
		}
	}()
	for {
		select {
		case <-lt.stop:
			return
		default:
		}
		if c == nil {
			poll.Until(time.Minute, 20*time.Millisecond, func() bool {
				select {
				case <-lt.stop:
					return true
				default:
				}
				var err error
				if c, err = lt.pick(rng).connect(); err != nil {
					c = nil
				}
				return c != nil
			})
			if c == nil {
				continue // stopped, or no node took it for a minute
			}
			session = false
			if c.flags&codec.GreetingAbandon != 0 {
				owner++
				if c.send(codec.AppendSession(nil, owner, clientID)) != nil {
					c.close()
					c = nil
					continue
				}
				if r, err := c.read(5 * time.Second); err != nil || r.Op != codec.OpPong {
					c.close()
					c = nil
					continue
				}
				session = true
			}
		}
		if session && len(lost) > 0 {
			var ok bool
			if lost, ok = lt.abandon(c, &owner, lost); !ok {
				c.close()
				c = nil
			}
			continue
		}
		key := lt.keys[rng.IntN(len(lt.keys))]
		owner++
		sent := time.Now()
		if c.send(codec.AppendAcquire(nil, owner, trafficLease, 2, key)) != nil {
			c.close()
			c = nil
			continue
		}
		r, err := c.read(5 * time.Second)
		if err != nil {
			// Indeterminate: the session is closed, and the ABANDON goes
			// on the next one (to any node); without a session the server
			// side releases or the lease ends.
			if session {
				lost = append(lost, lostAcquire{owner: owner, key: key, at: time.Now()})
			}
			c.close()
			c = nil
			continue
		}
		got := time.Now()
		lt.mu.Lock()
		lt.stats[r.Op]++
		if r.Op == codec.OpError {
			lt.errors[r.Reason]++
		}
		lt.mu.Unlock()
		if r.Op != codec.OpAcquired {
			continue
		}
		validUntil := sent.Add(time.Duration(r.WaitedMs)*time.Millisecond + trafficLease*time.Second - trafficMargin)
		if !got.Before(validUntil) {
			// The grant arrived after its validity ended (its node was
			// frozen with the answer in hand): the client's delivery gate
			// (SPEC §6) does not hand it out, and releases it instead.
			lt.mu.Lock()
			lt.lateGrants++
			lt.mu.Unlock()
			owner++
			if !c.release(owner, r.Token, key) {
				c = nil
			}
			continue
		}
		iv := interval{key: key, token: r.Token, start: got}
		if key != lt.keys[0] && rng.IntN(8) == 0 {
			// Keep it to its lease, never released: the claim lasts until
			// the client's validity bound.
			iv.end, iv.kept = validUntil, true
			lt.mu.Lock()
			lt.history = append(lt.history, iv)
			lt.mu.Unlock()
			continue
		}
		lt.hold(iv, time.Duration(2+rng.IntN(10))*time.Millisecond, validUntil)
		owner++
		if !c.release(owner, r.Token, key) {
			c = nil
		}
	}
}

// abandon sends the ABANDON of the first lost acquire on c, a session
// of the same client, and records its answer; it returns the lost
// acquires left, and false when c failed (the ABANDON is sent again on
// the next session). One past abandonWithin is given up: its lock is
// left to its lease.
func (lt *lockTraffic) abandon(c *wire, owner *uint64, lost []lostAcquire) ([]lostAcquire, bool) {
	a := lost[0]
	if time.Since(a.at) > abandonWithin {
		lt.mu.Lock()
		lt.abandonsLost++
		lt.mu.Unlock()
		return lost[1:], true
	}
	*owner++
	if c.send(codec.AppendAbandon(nil, *owner, a.owner, a.key)) != nil {
		return lost, false
	}
	r, err := c.read(5 * time.Second)
	if err != nil {
		return lost, false
	}
	lt.mu.Lock()
	lt.abandons[r.Op]++
	lt.mu.Unlock()
	if r.Op == codec.OpError && r.Reason == codec.Unavailable {
		return lost, true // asked again, within abandonWithin
	}
	return lost[1:], true
}

// checkAbandons fails the test for an ABANDON answered other than R, N or
// E unavailable (SPEC §6a), and reports what they were answered.
func (lt *lockTraffic) checkAbandons(t *testing.T) {
	t.Helper()
	for op, n := range lt.abandons {
		if op != codec.OpReleased && op != codec.OpNotHeld && op != codec.OpError {
			t.Errorf("%d ABANDONs answered %q", n, op)
		}
	}
	t.Logf("ABANDONs of indeterminate acquires: answered %v, %d given up after %v", fmtStats(lt.abandons), lt.abandonsLost, abandonWithin)
}

// TestProcessesKillLeader runs 3 lockd processes under continuous lock
// traffic, kills -9 the leader of one group and restarts it, three times,
// then kills -9 a follower twice and stops (SIGSTOP) a node for 3 s twice,
// then checks the recorded history: no two clients held a key at once
// (judged by grant and valid-until instants) and tokens never went back.
// It prints, by kind of fault, how long after each one the group's hot
// key was acquirable again through a node that is up (probeRecovery).
func TestProcessesKillLeader(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test skipped in -short mode")
	}
	dir := t.TempDir()
	bin := buildLockd(t, dir)
	const groups = 4
	procs := startProcesses(t, bin, dir, groups)
	const key0 = "proc/0"
	g0 := groupOf("default", []byte(key0), groups)
	groupLeader(t, procs, g0)

	traffic := startLockTraffic(procs, []string{key0, "proc/1", "proc/2", "proc/3", "proc/4", "proc/5"}, 6)
	var kills recoveries
	for round := range 3 {
		traffic.awaitGrants(t, 60, fmt.Sprintf("round %d, before the kill", round))
		l := groupLeader(t, procs, g0)
		t.Logf("round %d: kill -9 node %d, leader of group %d", round, l, g0+1)
		killedAt := time.Now()
		procs[l-1].kill9()
		kills = append(kills, probeRecovery(t, procs[l%3], key0, killedAt))
		// The two left elect a leader and serve without the killed node.
		groupLeader(t, procs, g0)
		traffic.awaitGrants(t, 40, fmt.Sprintf("round %d, node %d down", round, l))
		procs[l-1].start(t, bin)
	}
	var followerKills, stops recoveries
	for round := range 2 {
		traffic.awaitGrants(t, 60, fmt.Sprintf("follower round %d, before the kill", round))
		f := 1 + groupLeader(t, procs, g0)%3
		t.Logf("follower round %d: kill -9 node %d", round, f)
		killedAt := time.Now()
		procs[f-1].kill9()
		followerKills = append(followerKills, probeRecovery(t, procs[f%3], key0, killedAt))
		traffic.awaitGrants(t, 40, fmt.Sprintf("follower round %d, node %d down", round, f))
		procs[f-1].start(t, bin)
	}
	for round := range 2 {
		traffic.awaitGrants(t, 60, fmt.Sprintf("stop round %d, before the stop", round))
		s := groupLeader(t, procs, g0) // the leader, then a follower
		if round == 1 {
			s = 1 + s%3
		}
		t.Logf("stop round %d: SIGSTOP node %d for 3 s", round, s)
		stoppedAt := time.Now()
		procs[s-1].signal(syscall.SIGSTOP)
		stops = append(stops, probeRecovery(t, procs[s%3], key0, stoppedAt))
		time.Sleep(time.Until(stoppedAt.Add(3 * time.Second))) // the fault itself: the node is frozen this long
		procs[s-1].signal(syscall.SIGCONT)
		groupLeader(t, procs, g0)
	}
	traffic.awaitGrants(t, 60, "after the last restart")
	traffic.finish()

	total := traffic.checkHistory(t)
	traffic.checkAbandons(t)
	t.Logf("history: %d grants checked; responses %v; %d grants arrived after their validity and were released", total, fmtStats(traffic.stats), traffic.lateGrants)
	if total < 50 {
		t.Fatalf("only %d grants in the whole run", total)
	}
	t.Logf("kill -9 of the leader: %s was acquirable again after %s", key0, kills)
	t.Logf("kill -9 of a follower: %s was acquirable again after %s", key0, followerKills)
	t.Logf("SIGSTOP of a node for 3 s: %s was acquirable again after %s", key0, stops)
}

// probeRecovery measures how long after fault key is acquirable again:
// acquires through via (a node that is up), each waiting up to a second
// in the key's queue, from then on until one is granted (and released at
// once). A wait-0 probe could starve behind the traffic's queued waiters
// on a hot key; a waiting one takes its turn, so what it waits beyond
// the traffic's short claims is a lease the fault left behind or the
// election. It fails the test if nothing is granted within a minute.
func probeRecovery(t *testing.T, via *proc, key string, fault time.Time) time.Duration {
	t.Helper()
	var r codec.Response
	var err error
	var recovered time.Duration
	granted := poll.Until(time.Until(fault.Add(time.Minute)), 20*time.Millisecond, func() bool {
		r, _, err = probeAcquire(via, key, 1)
		recovered = time.Since(fault)
		return err == nil && r.Op == codec.OpAcquired
	})
	if !granted {
		t.Fatalf("%s: not granted through node %d within a minute of the fault: %q %v %v", key, via.id, r.Op, r.Reason.String(), err)
	}
	return recovered
}

// recoveries are the probeRecovery times of one kind of fault.
type recoveries []time.Duration

func (r recoveries) String() string {
	if len(r) == 0 {
		return "none measured"
	}
	sorted := slices.Clone(r)
	slices.Sort(sorted)
	rounded := make([]time.Duration, len(r))
	for i, d := range r {
		rounded[i] = d.Round(time.Millisecond)
	}
	return fmt.Sprintf("%v (p50 %v, max %v)", rounded, sorted[len(sorted)/2].Round(time.Millisecond), sorted[len(sorted)-1].Round(time.Millisecond))
}

func fmtStats(m map[byte]int) string {
	var parts []string
	for op, n := range m {
		parts = append(parts, fmt.Sprintf("%c=%d", op, n))
	}
	sort.Strings(parts)
	return strings.Join(parts, " ")
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// release sends a RELEASE and reads its answer; on a failure it closes
// the connection and reports false (the lease bounds the lock).
func (w *wire) release(owner, token uint64, key string) bool {
	if w.send(codec.AppendRelease(nil, owner, token, key)) != nil {
		w.close()
		return false
	}
	if _, err := w.read(5 * time.Second); err != nil {
		w.close()
		return false
	}
	return true
}

// TestProcessesKillAllKeepsAcknowledgedGrants: every grant a client was
// answered survives kill -9 of all three nodes at once, right after the
// last answer, when some replicas have not written the commit index that
// covers it (commitLazyLogDB holds that back): after the restart each
// lock is still held by its token, so its release is answered R, not N.
func TestProcessesKillAllKeepsAcknowledgedGrants(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test skipped in -short mode")
	}
	dir := t.TempDir()
	bin := buildLockd(t, dir)
	const groups = 3
	procs := startProcesses(t, bin, dir, groups)
	for g := range groups {
		groupLeader(t, procs, g)
	}
	wires := make([]*wire, 3)
	for i, p := range procs {
		w, err := p.connect()
		if err != nil {
			t.Fatal(err)
		}
		defer w.close()
		wires[i] = w
	}
	// One grant after the other, through every node in turn (a follower
	// forwards to the leader), each a commit of its own.
	const keys = 30
	tokens := make(map[string]uint64, keys)
	for k := range keys {
		key := fmt.Sprintf("durable/%d", k)
		w := wires[k%3]
		if err := w.send(codec.AppendAcquire(nil, uint64(k+1), 600, 0, key)); err != nil {
			t.Fatal(err)
		}
		tokens[key] = expectResp(t, w, codec.OpAcquired, uint64(k+1)).Token
	}
	for _, p := range procs {
		p.kill9()
	}
	for _, p := range procs {
		p.start(t, bin)
	}
	for g := range groups {
		groupLeader(t, procs, g)
	}
	w, err := procs[0].connect()
	if err != nil {
		t.Fatal(err)
	}
	defer w.close()
	for k := range keys {
		key := fmt.Sprintf("durable/%d", k)
		if err := w.send(codec.AppendRelease(nil, uint64(k+1), tokens[key], key)); err != nil {
			t.Fatal(err)
		}
		r, err := w.read(15 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if r.Op != codec.OpReleased {
			t.Errorf("%s: release of token %d after the restart answered %q (reason %v), want R: the grant was lost", key, tokens[key], r.Op, r.Reason)
		}
	}
}
