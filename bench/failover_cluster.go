package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/lockd/lockd/client"
	"github.com/lockd/lockd/codec"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
)

// serverProc is one server process of a cluster the failover workload
// starts: the same command line every time it is started, its output
// appended to one log file.
type serverProc struct {
	bin  string
	args []string
	log  string
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

func (p *serverProc) start() error {
	f, err := os.OpenFile(p.log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(p.bin, p.args...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("start %s: %w", p.bin, err)
	}
	done := make(chan struct{})
	p.cmd, p.done = cmd, done
	go func() { _ = cmd.Wait(); f.Close(); close(done) }()
	return nil
}

func (p *serverProc) running() bool {
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

func (p *serverProc) signal(sig syscall.Signal) error {
	if p.cmd == nil {
		return errors.New("not started")
	}
	return p.cmd.Process.Signal(sig)
}

// awaitExit waits up to d for the process to exit; past that it kills it
// and reports false.
func (p *serverProc) awaitExit(d time.Duration) bool {
	if p.cmd == nil {
		return true
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-p.done:
		return true
	case <-timer.C:
		p.kill()
		return false
	}
}

// kill ends the process for good (SIGCONT first, in case it is stopped).
func (p *serverProc) kill() {
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// logTail is the end of the process's log, for an error message.
func (p *serverProc) logTail() string {
	b, _ := os.ReadFile(p.log)
	if len(b) > 1500 {
		b = b[len(b)-1500:]
	}
	return string(b)
}

// failoverCluster is a 3-node cluster of one system started on loopback
// for the failover workload.
type failoverCluster interface {
	nodes() []*serverProc
	// relays are the delayRelays in front of the nodes' peer ports (none
	// without FailoverConfig.PeerDelay), closed after the nodes stop.
	relays() []*delayRelay
	// leader is the index of the node leading the cluster (lockd: its
	// only group) now, in the view of a running node.
	leader(ctx context.Context) (int, error)
	// newCaller returns caller id's own client, given the three nodes'
	// addresses with node id%3's first, and the Caller that drives it.
	newCaller(ctx context.Context, id int, lease time.Duration) (Caller, func(), error)
	describe() string
}

// loopbackPorts picks n free loopback ports from port-0 listeners, all
// open at once so that no two are the same.
func loopbackPorts(n int) ([]int, error) {
	var ports []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// rotated is addrs starting at index first.
func rotated(addrs []string, first int) []string {
	first %= len(addrs)
	return append(addrs[first:len(addrs):len(addrs)], addrs[:first]...)
}

// peerLink is the delay of every peer link: FailoverConfig.PeerDelay and
// PeerJitter.
type peerLink struct{ delay, jitter time.Duration }

func (l peerLink) String() string {
	return fmt.Sprintf("peer links delayed %v ± %v each way", l.delay, l.jitter)
}

// relayPeers puts a delayRelay in front of each of the nodes' peer ports
// when link delays. It returns the addresses the nodes reach each other
// at: the relays', or the ports themselves without a delay.
func relayPeers(ports []string, link peerLink) ([]string, []*delayRelay, error) {
	if link.delay == 0 {
		return ports, nil, nil
	}
	var reach []string
	var relays []*delayRelay
	for i, port := range ports {
		r, err := startDelayRelay("127.0.0.1:0", port, link.delay, link.jitter, uint64(i+1))
		if err != nil {
			for _, r := range relays {
				r.close()
			}
			return nil, nil, err
		}
		relays = append(relays, r)
		reach = append(reach, r.ln.Addr().String())
	}
	return reach, relays, nil
}

// awaitReady polls ready every 100 ms until it succeeds, for at most 30 s.
func awaitReady(ctx context.Context, c failoverCluster, what string, ready func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		err := ready(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			var logs strings.Builder
			for i, p := range c.nodes() {
				fmt.Fprintf(&logs, "\n--- node %d log (tail) ---\n%s", i+1, p.logTail())
			}
			return fmt.Errorf("%s not ready in 30 s: %w%s", what, err, logs.String())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// lockdCluster is three `lockd serve --cluster` processes with one Raft
// group, lockd's default flags otherwise.
type lockdCluster struct {
	procs  []*serverProc
	listen []string
	admin  []string
	link   peerLink
	peers  []*delayRelay
	// noAbandon says why the nodes did not offer SPEC §6a before the
	// callers connected; empty when they did.
	noAbandon string
}

func startLockdCluster(ctx context.Context, bin, dir string, link peerLink, flags []string) (*lockdCluster, error) {
	ports, err := loopbackPorts(9)
	if err != nil {
		return nil, err
	}
	raftPorts := make([]string, 3)
	for i := range raftPorts {
		raftPorts[i] = fmt.Sprintf("127.0.0.1:%d", ports[i])
	}
	reach, relays, err := relayPeers(raftPorts, link)
	if err != nil {
		return nil, err
	}
	c := &lockdCluster{link: link, peers: relays}
	var peers []string
	for i := range 3 {
		peers = append(peers, fmt.Sprintf("%d=%s", i+1, reach[i]))
	}
	for i := range 3 {
		c.listen = append(c.listen, fmt.Sprintf("127.0.0.1:%d", ports[3+i]))
		c.admin = append(c.admin, fmt.Sprintf("127.0.0.1:%d", ports[6+i]))
		args := []string{"serve", "--cluster", "--node-id", strconv.Itoa(i + 1),
			"--raft-addr", reach[i], "--peers", strings.Join(peers, ","),
			"--data-dir", filepath.Join(dir, fmt.Sprintf("lockd%d", i+1)), "--groups", "1",
			"--listen", c.listen[i], "--admin", c.admin[i], "--log-level", "warn"}
		if link.delay > 0 {
			args = append(args, "--raft-listen", raftPorts[i])
		}
		args = append(args, flags...)
		c.procs = append(c.procs, &serverProc{bin: bin, log: filepath.Join(dir, fmt.Sprintf("lockd%d.log", i+1)), args: args})
	}
	for _, p := range c.procs {
		if err := p.start(); err != nil {
			stopAll(c)
			return nil, err
		}
	}
	err = awaitReady(ctx, c, "lockd cluster", func(ctx context.Context) error {
		for i := range c.procs {
			if l, err := c.leaderView(ctx, i); err != nil || l < 0 {
				return fmt.Errorf("node %d knows no leader (%v)", i+1, err)
			}
		}
		return nil
	})
	if err != nil {
		stopAll(c)
		return nil, err
	}
	// The callers' connections live through the run, and one greeted
	// before its node serves SPEC §6a (the groups' log format raised, a
	// moment after the election) never abandons what a fault cuts off:
	// wait for it, a bounded time, and say so when it did not come.
	wait, cancel := context.WithTimeout(ctx, abandonWait)
	defer cancel()
	for i := range c.procs {
		for {
			err := c.servesAbandon(wait, i)
			if err == nil {
				break
			}
			if wait.Err() != nil {
				c.noAbandon = err.Error()
				return c, nil
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return c, nil
}

// abandonWait bounds the wait for the nodes to offer SPEC §6a.
const abandonWait = 10 * time.Second

func (c *lockdCluster) nodes() []*serverProc  { return c.procs }
func (c *lockdCluster) relays() []*delayRelay { return c.peers }

// servesAbandon reports, as an error, a node whose GREETING does not
// offer SPEC §6a yet.
func (c *lockdCluster) servesAbandon(ctx context.Context, i int) error {
	d := net.Dialer{Timeout: time.Second}
	conn, err := d.DialContext(ctx, "tcp", c.listen[i])
	if err != nil {
		return fmt.Errorf("node %d: %w", i+1, err)
	}
	defer conn.Close()
	_ = conn.SetReadDeadline(time.Now().Add(time.Second))
	var g [3]byte // op, version, flags
	if _, err := io.ReadFull(conn, g[:]); err != nil {
		return fmt.Errorf("node %d: greeting: %w", i+1, err)
	}
	if g[0] != codec.OpGreeting || g[2]&codec.GreetingAbandon == 0 {
		return fmt.Errorf("node %d does not offer SPEC §6a yet (greeting %q)", i+1, g[:])
	}
	return nil
}

func (c *lockdCluster) describe() string {
	d := "3-node lockd cluster, 1 group, default flags"
	if c.link.delay > 0 {
		d += ", " + c.link.String()
	}
	if c.noAbandon != "" {
		d += ", WITHOUT SPEC §6a ABANDON (" + c.noAbandon + ")"
	}
	return d
}

// leaderView reads node i's view of the group's leader from its
// /metrics: a node index, or -1 while it knows none.
func (c *lockdCluster) leaderView(ctx context.Context, i int) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+c.admin[i]+"/metrics", nil)
	if err != nil {
		return -1, err
	}
	hc := http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := hc.Do(req)
	if err != nil {
		return -1, err
	}
	defer resp.Body.Close()
	const want = `lockd_cluster_group_leader{group="1"} `
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), want); ok {
			id, err := strconv.Atoi(rest)
			if err != nil || id < 0 || id > len(c.procs) {
				return -1, fmt.Errorf("node %d: leader %q", i+1, rest)
			}
			return id - 1, nil
		}
	}
	return -1, fmt.Errorf("node %d: no %s in /metrics", i+1, strings.TrimSpace(want))
}

func (c *lockdCluster) leader(ctx context.Context) (int, error) {
	return leaderOfRunning(c.procs, func(i int) (int, error) { return c.leaderView(ctx, i) })
}

// leaderOfRunning asks each running node in turn for the leader and
// returns the first answer that names a running node.
func leaderOfRunning(procs []*serverProc, view func(i int) (int, error)) (int, error) {
	var errs []error
	for i, p := range procs {
		if !p.running() {
			continue
		}
		l, err := view(i)
		if err == nil && l >= 0 && procs[l].running() {
			return l, nil
		}
		errs = append(errs, fmt.Errorf("node %d: leader %d, %v", i+1, l+1, err))
	}
	return -1, fmt.Errorf("no running leader: %w", errors.Join(errs...))
}

func (c *lockdCluster) newCaller(ctx context.Context, id int, lease time.Duration) (Caller, func(), error) {
	cl, err := client.Dial(ctx, client.Config{Addrs: rotated(c.listen, id)})
	if err != nil {
		return nil, nil, err
	}
	return &lockdCaller{t: &lockdTarget{c: cl, lease: lease}}, func() { cl.Close() }, nil
}

// etcdCluster is three etcd members, data on disk, defaults otherwise.
type etcdCluster struct {
	procs   []*serverProc
	clients []string
	link    peerLink
	peers   []*delayRelay
}

func startEtcdCluster(ctx context.Context, bin, dir string, link peerLink, flags []string) (*etcdCluster, error) {
	ports, err := loopbackPorts(6)
	if err != nil {
		return nil, err
	}
	peerPorts := make([]string, 3)
	for i := range peerPorts {
		peerPorts[i] = fmt.Sprintf("127.0.0.1:%d", ports[3+i])
	}
	reach, relays, err := relayPeers(peerPorts, link)
	if err != nil {
		return nil, err
	}
	c := &etcdCluster{link: link, peers: relays}
	var initial []string
	for i := range 3 {
		initial = append(initial, fmt.Sprintf("e%d=http://%s", i+1, reach[i]))
	}
	for i := range 3 {
		clientURL := fmt.Sprintf("http://127.0.0.1:%d", ports[i])
		c.clients = append(c.clients, clientURL)
		args := []string{"--name", fmt.Sprintf("e%d", i+1), "--data-dir", filepath.Join(dir, fmt.Sprintf("etcd%d", i+1)),
			"--logger", "zap", "--log-level", "error",
			"--listen-client-urls", clientURL, "--advertise-client-urls", clientURL,
			"--listen-peer-urls", "http://" + peerPorts[i], "--initial-advertise-peer-urls", "http://" + reach[i],
			"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-state", "new",
			"--initial-cluster-token", "lockbench-failover"}
		c.procs = append(c.procs, &serverProc{bin: bin, log: filepath.Join(dir, fmt.Sprintf("etcd%d.log", i+1)), args: append(args, flags...)})
	}
	for _, p := range c.procs {
		if err := p.start(); err != nil {
			stopAll(c)
			return nil, err
		}
	}
	err = awaitReady(ctx, c, "etcd cluster", func(ctx context.Context) error {
		for i := range c.procs {
			if l, err := c.leaderView(ctx, i); err != nil || l < 0 {
				return fmt.Errorf("member %d knows no leader (%v)", i+1, err)
			}
		}
		return nil
	})
	if err != nil {
		stopAll(c)
		return nil, err
	}
	return c, nil
}

func (c *etcdCluster) nodes() []*serverProc  { return c.procs }
func (c *etcdCluster) relays() []*delayRelay { return c.peers }

func (c *etcdCluster) describe() string {
	d := "3-node etcd cluster, concurrency.Mutex, session TTL = lease"
	if c.link.delay > 0 {
		d += ", " + c.link.String()
	}
	return d
}

// leaderView asks member i for its status: the index of the member it
// knows as leader, or -1.
func (c *etcdCluster) leaderView(ctx context.Context, i int) (int, error) {
	cl, err := clientv3.New(clientv3.Config{Endpoints: []string{c.clients[i]}, DialTimeout: time.Second, Logger: zap.NewNop()})
	if err != nil {
		return -1, err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	leaderID := uint64(0)
	ids := make([]uint64, len(c.clients))
	for j, ep := range c.clients {
		st, err := cl.Status(ctx, ep)
		if err != nil {
			if j == i {
				return -1, err
			}
			continue // another member, down: it cannot be the leader
		}
		ids[j] = st.Header.MemberId
		if j == i {
			leaderID = st.Leader
		}
	}
	for j, id := range ids {
		if id != 0 && id == leaderID {
			return j, nil
		}
	}
	return -1, nil
}

func (c *etcdCluster) leader(ctx context.Context) (int, error) {
	return leaderOfRunning(c.procs, func(i int) (int, error) { return c.leaderView(ctx, i) })
}

func (c *etcdCluster) newCaller(ctx context.Context, id int, lease time.Duration) (Caller, func(), error) {
	cl, err := clientv3.New(clientv3.Config{Endpoints: rotated(c.clients, id), DialTimeout: answerSlack, Logger: zap.NewNop()})
	if err != nil {
		return nil, nil, err
	}
	s, err := concurrency.NewSession(cl, concurrency.WithTTL(int(max(wholeSeconds(lease), 1))), concurrency.WithContext(ctx))
	if err != nil {
		cl.Close()
		return nil, nil, fmt.Errorf("etcd session: %w", err)
	}
	return &etcdCaller{s: s}, func() { s.Close(); cl.Close() }, nil
}

// stopAll kills every node of c, then closes its relays.
func stopAll(c failoverCluster) {
	for _, p := range c.nodes() {
		p.kill()
	}
	for _, r := range c.relays() {
		r.close()
	}
}
