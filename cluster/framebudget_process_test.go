package cluster

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockd/lockd/cluster/raftnet"
)

// vmRSS reads a process's resident set size, in bytes, from
// /proc/PID/status.
func vmRSS(pid int) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("process %d: no VmRSS in its status", pid)
}

// floodFrames sends conns frames of the largest size to raftAddr, each on
// its own connection, half from 127.0.0.1, the members' host, whose
// connections the budget counts as members', and half from 127.0.0.2,
// whose are guests' (the node caps the connections per host): a valid
// header, then the whole body as fast as the node reads it. The body is zeros, which pass the checksum and
// fail to decode, so the node reads every frame in full and then drops
// its connection. It returns how many frames were written in full and
// then closed by the node.
func floodFrames(t *testing.T, raftAddr string, conns int) int {
	t.Helper()
	frame := raftnet.AppendFrame(nil, raftnet.FrameMessages, make([]byte, raftnet.MaxFrame))
	var wg sync.WaitGroup
	var mu sync.Mutex
	full := 0
	for i := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(1+i%2))}}
			c, err := d.Dial("tcp", raftAddr)
			if err != nil {
				t.Errorf("flood connection %d: %v", i, err)
				return
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(50 * time.Second))
			if _, err := c.Write(frame); err != nil {
				t.Errorf("flood connection %d: the node did not read its frame: %v", i, err)
				return
			}
			if _, err := io.Copy(io.Discard, c); err != nil {
				t.Errorf("flood connection %d: %v, want it closed by the node", i, err)
				return
			}
			mu.Lock()
			full++
			mu.Unlock()
		}()
	}
	wg.Wait()
	return full
}

// Twenty connections that each send a frame of the largest size in full,
// from anyone who reaches a node's plain TCP Raft port, would grow a node
// without a frame budget (raftnet.FrameBudget) by more than 1.4 GiB. The
// node they flood, its group's leader, grows by at
// most 200 MB (the budget is 128 MiB: half the flood comes from the
// members' host), reads every frame, and keeps granting locks while they
// arrive.
func TestProcessesFrameFloodStaysWithinTheBudget(t *testing.T) {
	const conns, maxGrowth = 20, 200 << 20
	procs, _, _ := attackedCluster(t)
	target := procs[groupLeader(t, procs, 0)-1]
	lockCycle(t, target, 1, "flood/before")
	pid := target.cmd.Process.Pid
	base, err := vmRSS(pid)
	if err != nil {
		t.Fatal(err)
	}

	flooded := make(chan int)
	go func() { flooded <- floodFrames(t, target.raftAddr(), conns) }()
	var peak int64
	grants := 0
	for done := false; !done; {
		select {
		case full := <-flooded:
			if full != conns {
				t.Fatalf("%d of %d flood frames read in full", full, conns)
			}
			done = true
		default:
			lockCycle(t, target, uint64(100+grants), fmt.Sprintf("flood/during/%d", grants))
			grants++
		}
		rss, err := vmRSS(pid)
		if err != nil {
			t.Fatal(err)
		}
		peak = max(peak, rss)
	}
	t.Logf("%d flood frames of %d MiB: node %d grew from %d MiB to a peak of %d MiB; %d lock cycles through it meanwhile",
		conns, raftnet.MaxFrame>>20, target.id, base>>20, peak>>20, grants)
	if grown := peak - base; grown > maxGrowth {
		t.Fatalf("node %d grew by %d MiB under the flood, want at most %d MiB", target.id, grown>>20, maxGrowth>>20)
	}
	if grants < 2 {
		t.Fatalf("%d lock cycles completed during the flood", grants)
	}
	for i, p := range procs {
		if isClosed(p.done) {
			t.Fatalf("node %d exited", p.id)
		}
		lockCycle(t, p, uint64(10+i), fmt.Sprintf("flood/after/%d", i))
	}
}
