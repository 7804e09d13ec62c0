package bench

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// These tests run the peer targets against real servers, and skip when
// redis-server or etcd is not installed (`make bench-peers` installs both;
// `apt-get install redis-server etcd-server` does too).

// startPeer runs a server binary for the test on n loopback ports of its
// own, given to it by args, and returns them once the server listens on
// them all. A port cannot be handed to another process already bound, so
// the kernel picks it free and the server binds it; the test then takes
// the server's word, not the port's: it waits until the kernel shows the
// sockets listening on those ports among the server's own file
// descriptors. Another test that took a port in between makes the server
// exit, and it is started again on new ports; no test ever talks to a
// server not its own.
func startPeer(t *testing.T, binary string, n int, args func(ports []int) []string) []int {
	t.Helper()
	path, err := exec.LookPath(binary)
	if err != nil {
		t.Skipf("%s is not installed, so its target cannot be tested (apt-get install %s-server)", binary, binary)
	}
	for range 5 {
		ports := make([]int, n)
		for i := range ports {
			ports[i] = pickPort(t)
		}
		cmd := exec.Command(path, args(ports)...)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan struct{})
		go func() { cmd.Wait(); close(exited) }()
		t.Cleanup(func() {
			cmd.Process.Kill()
			<-exited
		})
		if waitListening(t, cmd.Process.Pid, ports, exited) {
			return ports
		}
	}
	t.Fatalf("%s exited five times before it listened", binary)
	return nil
}

// pickPort is pickedPort, but for the test that makes it pick a port
// already taken.
var pickPort = pickedPort

// pickedPort is a loopback port the kernel found free; it is free no
// longer once the server it is meant for binds it, or another process
// does first.
func pickedPort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// waitListening waits until process pid listens on every port, and says
// false if it exits first.
func waitListening(t *testing.T, pid int, ports []int, exited <-chan struct{}) bool {
	t.Helper()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(15 * time.Second)
	for {
		select {
		case <-exited:
			return false
		case <-deadline:
			t.Fatalf("pid %d did not listen on %v", pid, ports)
		case <-tick.C:
		}
		listening := listeningPorts(pid)
		all := true
		for _, p := range ports {
			all = all && listening[p]
		}
		if all {
			return true
		}
	}
}

// listeningPorts reads, from /proc, the TCP ports on which sockets among
// pid's own file descriptors listen.
func listeningPorts(pid int) map[int]bool {
	dir := fmt.Sprintf("/proc/%d", pid)
	fds, _ := os.ReadDir(dir + "/fd")
	inodes := make(map[string]bool)
	for _, fd := range fds {
		link, err := os.Readlink(dir + "/fd/" + fd.Name())
		if inode, ok := strings.CutPrefix(link, "socket:["); ok && err == nil {
			inodes[strings.TrimSuffix(inode, "]")] = true
		}
	}
	ports := make(map[int]bool)
	for _, table := range []string{"tcp", "tcp6"} {
		data, _ := os.ReadFile(dir + "/net/" + table)
		for line := range strings.Lines(string(data)) {
			// sl local_address rem_address st ... inode: the state 0A is
			// LISTEN, the address HEX-IP:HEX-PORT.
			f := strings.Fields(line)
			if len(f) < 10 || f[3] != "0A" || !inodes[f[9]] {
				continue
			}
			_, hexPort, _ := strings.Cut(f[1], ":")
			if port, err := strconv.ParseUint(hexPort, 16, 16); err == nil {
				ports[int(port)] = true
			}
		}
	}
	return ports
}

// startRedis runs a redis-server without persistence for the test.
func startRedis(t *testing.T) string {
	t.Helper()
	port := startPeer(t, "redis-server", 1, func(ports []int) []string {
		return []string{"--port", fmt.Sprint(ports[0]), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--loglevel", "warning"}
	})[0]
	return fmt.Sprintf("127.0.0.1:%d", port)
}

// A port taken between its pick and the server's bind (here: taken
// before) makes the server exit, and startPeer starts it again on another
// port rather than talk to whatever holds the first.
func TestStartPeerTalksOnlyToItsOwnServer(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	takenPort := taken.Addr().(*net.TCPAddr).Port
	picks := 0
	pickPort = func(t *testing.T) int {
		if picks++; picks == 1 {
			return takenPort
		}
		return pickedPort(t)
	}
	defer func() { pickPort = pickedPort }()
	addr := startRedis(t)
	if addr == taken.Addr().String() || picks != 2 {
		t.Fatalf("redis at %s after %d picks; %s was taken", addr, picks, taken.Addr())
	}
	admin := redis.NewClient(&redis.Options{Addr: addr})
	defer admin.Close()
	if err := admin.Ping(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
}

// redisTargets are the two client libraries' targets.
var redisTargets = []struct{ scheme, kind string }{
	{SchemeRedis, "redis/rueidis"},
	{SchemeGoRedis, "redis/go-redis"},
}

func runPeerWorkloads(t *testing.T, spec TargetSpec, kind string) {
	for _, cfg := range []Config{
		{Workload: Uncontended, Callers: 8, Duration: time.Second},
		{Workload: Contended, Callers: 8, Keys: 1, Duration: time.Second},
		// 8 callers holding one key 100 ms each queue 800 ms deep: most
		// of their 250 ms waits run out.
		{Workload: Timeouts, Callers: 8, Wait: 250 * time.Millisecond, Hold: 100 * time.Millisecond, Rate: 200, Duration: time.Second},
	} {
		t.Run(cfg.Workload, func(t *testing.T) {
			res, err := Run(context.Background(), spec, testTargetOptions, cfg)
			if err != nil {
				t.Fatal(err)
			}
			checkSane(t, res)
			if res.Kind != kind || res.Conns < 1 || res.Transport == "" {
				t.Fatalf("kind %q, %d connections, transport %q", res.Kind, res.Conns, res.Transport)
			}
			// A peer's waits that run out end T; it has no indeterminate
			// outcome and no reconnect count.
			if to := res.Timeouts; to != nil && (to.Waiting.TimedOut == 0 || to.Waiting.OwnIndeterminate+to.Waiting.Collateral != 0 || to.LoadedReconnects != nil) {
				t.Fatalf("timeouts: %+v", to)
			}
		})
	}
}

func TestRedisTargetsAgainstRedisServer(t *testing.T) {
	addr := startRedis(t)
	for _, rt := range redisTargets {
		t.Run(rt.scheme, func(t *testing.T) {
			runPeerWorkloads(t, TargetSpec{Scheme: rt.scheme, Addr: addr}, rt.kind)
		})
	}
}

// commandCalls reads how often Redis ran command (INFO commandstats).
func commandCalls(t *testing.T, admin *redis.Client, command string) int {
	t.Helper()
	info, err := admin.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(info) {
		if rest, ok := strings.CutPrefix(line, "cmdstat_"+command+":calls="); ok {
			var n int
			fmt.Sscan(strings.SplitN(rest, ",", 2)[0], &n)
			return n
		}
	}
	return 0
}

// The lock recipe, through each library, against a real Redis: SET NX
// with the lease, a polling wait, compare-and-delete by EVALSHA, loaded
// again by EVAL once after the server lost its scripts.
func TestRedisLockRecipe(t *testing.T) {
	addr := startRedis(t)
	admin := redis.NewClient(&redis.Options{Addr: addr})
	defer admin.Close()
	ctx := context.Background()
	for _, rt := range redisTargets {
		t.Run(rt.scheme, func(t *testing.T) {
			target, err := Open(ctx, TargetSpec{Scheme: rt.scheme, Addr: addr}, TargetOptions{Lease: 30 * time.Second, RedisRetry: time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			defer target.Close()
			a, _ := target.NewCaller(ctx, 0)
			b, _ := target.NewCaller(ctx, 1)
			key := "recipe/" + rt.scheme
			expect := func(what string, got Outcome, err error, want Outcome) {
				t.Helper()
				if got != want || err != nil {
					t.Fatalf("%s: %v %v, want %v", what, got, err, want)
				}
			}
			out, err := a.Acquire(ctx, key, 0)
			expect("first acquire", out, err, Acquired)
			if ttl := admin.PTTL(ctx, key).Val(); ttl <= 29*time.Second || ttl > 30*time.Second {
				t.Fatalf("the lock's expiry is %v, want the 30 s lease", ttl)
			}
			holder := admin.Get(ctx, key).Val()
			out, err = b.Acquire(ctx, key, 0)
			expect("acquire of a held key without waiting", out, err, TimedOut)
			sets := commandCalls(t, admin, "set")
			start := time.Now()
			out, err = b.Acquire(ctx, key, 50*time.Millisecond)
			expect("acquire of a held key with a wait", out, err, TimedOut)
			if waited := time.Since(start); waited < 50*time.Millisecond {
				t.Fatalf("a waiting acquire gave up after %v", waited)
			}
			// It waits by polling (more than one SET NX), and never faster
			// than the retry pause allows: 1 ms ± 50 %, so at most one poll
			// per 0.5 ms. How many polls a loaded machine fits into 50 ms
			// is not the recipe's to promise.
			if polls := commandCalls(t, admin, "set") - sets; polls < 2 || polls > 50/0.5+1 {
				t.Fatalf("%d SET NX polls in a 50 ms wait", polls)
			}
			if admin.Get(ctx, key).Val() != holder {
				t.Fatal("a failed acquire changed the lock's value")
			}
			out, err = b.Release(ctx)
			expect("release by a caller that does not hold it", out, err, NotHeld)
			if admin.Exists(ctx, key).Val() != 1 {
				t.Fatal("another caller's release deleted the lock")
			}
			out, err = a.Release(ctx)
			expect("release", out, err, Released)
			out, err = a.Release(ctx)
			expect("second release", out, err, NotHeld)

			out, err = b.Acquire(ctx, key, 0)
			expect("acquire after the release", out, err, Acquired)
			if admin.Get(ctx, key).Val() == holder {
				t.Fatal("two acquires used the same value")
			}
			// The server lost its scripts: EVALSHA answers NOSCRIPT, and
			// the library sends the script itself once.
			if err := admin.ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			evals, evalshas := commandCalls(t, admin, "eval"), commandCalls(t, admin, "evalsha")
			out, err = b.Release(ctx)
			expect("release after SCRIPT FLUSH", out, err, Released)
			if got := commandCalls(t, admin, "evalsha") - evalshas; got != 1 {
				t.Fatalf("%d EVALSHA for one release", got)
			}
			if got := commandCalls(t, admin, "eval") - evals; got != 1 {
				t.Fatalf("%d EVAL after NOSCRIPT, want 1", got)
			}
			out, err = b.Acquire(ctx, key, 0)
			expect("acquire after the reload", out, err, Acquired)
			evals = commandCalls(t, admin, "eval")
			out, err = b.Release(ctx)
			expect("release after the reload", out, err, Released)
			if got := commandCalls(t, admin, "eval") - evals; got != 0 {
				t.Fatalf("%d EVAL once the script is loaded again", got)
			}
		})
	}
}

// --conns reaches each library as its users configure it, and the result
// counts the connections Redis sees.
func TestRedisConnections(t *testing.T) {
	addr := startRedis(t)
	ctx := context.Background()
	for _, tc := range []struct {
		scheme      string
		conns       int
		min, max    int
		inTransport string
	}{
		{SchemeRedis, 1, 1, 1, "PipelineMultiplex -1"},
		{SchemeRedis, 4, 4, 4, "PipelineMultiplex 2"},
		{SchemeRedis, 0, 1, 4, "its default PipelineMultiplex"},
		{SchemeGoRedis, 3, 1, 3, "PoolSize 3"},
		{SchemeGoRedis, 0, 1, 10 * 64, "its default PoolSize"},
	} {
		t.Run(fmt.Sprintf("%s conns %d", tc.scheme, tc.conns), func(t *testing.T) {
			target, err := Open(ctx, TargetSpec{Scheme: tc.scheme, Addr: addr}, TargetOptions{Conns: tc.conns, Lease: 30 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer target.Close()
			// 16 callers at once, as many commands in flight as they make.
			var wg sync.WaitGroup
			for i := range 16 {
				c, _ := target.NewCaller(ctx, i)
				wg.Go(func() {
					for j := range 50 {
						if out, err := c.Acquire(ctx, fmt.Sprintf("conns/%s/%d/%d/%d", tc.scheme, tc.conns, i, j), 0); out != Acquired {
							t.Errorf("acquire: %v %v", out, err)
							return
						}
						if out, err := c.Release(ctx); out != Released {
							t.Errorf("release: %v %v", out, err)
							return
						}
					}
				})
			}
			wg.Wait()
			n, err := target.Conns(ctx)
			if err != nil || n < tc.min || n > tc.max {
				t.Fatalf("%d connections (%v), want %d to %d", n, err, tc.min, tc.max)
			}
			if !strings.Contains(target.Transport(), tc.inTransport) {
				t.Fatalf("transport %q lacks %q", target.Transport(), tc.inTransport)
			}
		})
	}
	_, err := Open(ctx, TargetSpec{Scheme: SchemeRedis, Addr: addr}, TargetOptions{Conns: 3})
	if err == nil || !strings.Contains(err.Error(), "power of two") {
		t.Fatalf("rueidis with 3 connections: %v", err)
	}
}

func TestCountNamedClients(t *testing.T) {
	list := "id=3 addr=127.0.0.1:1 laddr=127.0.0.1:6379 fd=8 name=lockbench-ab age=1\n" +
		"id=4 addr=127.0.0.1:2 laddr=127.0.0.1:6379 fd=9 name=lockbench-abc age=1\n" +
		"id=5 addr=127.0.0.1:3 laddr=127.0.0.1:6379 fd=10 name= age=1\n" +
		"id=6 addr=127.0.0.1:4 laddr=127.0.0.1:6379 fd=11 name=lockbench-ab age=2\n"
	if n := countNamedClients(list, "lockbench-ab"); n != 2 {
		t.Fatalf("%d clients named lockbench-ab, want 2", n)
	}
}

func TestEtcdTargetAgainstEtcdServer(t *testing.T) {
	ports := startPeer(t, "etcd", 2, func(ports []int) []string {
		client := fmt.Sprintf("http://127.0.0.1:%d", ports[0])
		peer := fmt.Sprintf("http://127.0.0.1:%d", ports[1])
		return []string{"--name", "lockbench", "--data-dir", t.TempDir(),
			"--listen-client-urls", client, "--advertise-client-urls", client,
			"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
			"--initial-cluster", "lockbench=" + peer, "--log-level", "error"}
	})
	client := fmt.Sprintf("127.0.0.1:%d", ports[0])
	runPeerWorkloads(t, TargetSpec{Scheme: SchemeEtcd, Addr: client}, SchemeEtcd)
}
