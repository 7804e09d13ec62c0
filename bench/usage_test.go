package bench

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The usage tests read real /proc counters: of this process, and of a
// child process (this test binary again, in the helper mode below) that
// makes a known number of system calls and context switches on command.

// usageHelperEnv, set in a child's environment, makes the test binary the
// helper process instead of running tests.
const usageHelperEnv = "LOCKBENCH_USAGE_HELPER"

// What one "work" command of the helper does.
const (
	helperReads  = 500
	helperWrites = 500
	helperSleeps = 50
)

func init() {
	if os.Getenv(usageHelperEnv) != "" {
		// The main goroutine keeps the main thread: a locked goroutine
		// that exits elsewhere then always ends its own thread.
		runtime.LockOSThread()
	}
}

// usageHelper answers commands on stdin, one a line, until stdin closes:
//
//	work       read /dev/zero and write /dev/null helperReads and
//	           helperWrites times, sleep helperSleeps times 1 ms; "done"
//	spawn      start a thread that waits; "spawned"
//	exit       that thread sleeps helperSleeps times and exits; "exited"
//	           once the kernel has removed it
//	meter PID  meter PID across one "work" of its own; prints what is
//	           known and the notes
func usageHelper() {
	in := bufio.NewScanner(os.Stdin)
	var exitThread chan struct{}
	var threadGone chan int
	for in.Scan() {
		cmd, arg, _ := strings.Cut(in.Text(), " ")
		switch cmd {
		case "work":
			helperWork()
			fmt.Println("done")
		case "spawn":
			exitThread, threadGone = make(chan struct{}), make(chan int)
			go func() {
				runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
				tid := syscall.Gettid()
				fmt.Println("spawned")
				<-exitThread
				helperSleep()
				threadGone <- tid
			}()
		case "exit":
			close(exitThread)
			tid := <-threadGone
			for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
				if _, err := os.Stat(fmt.Sprintf("/proc/self/task/%d", tid)); os.IsNotExist(err) {
					break
				}
			}
			fmt.Println("exited")
		case "meter":
			pid, _ := strconv.Atoi(arg)
			m := startMeter(procRoot, []int{pid})
			helperWork()
			_, server, notes := m.stop()
			cpuKnown := !strings.Contains(fmt.Sprint(notes), "server counters unknown")
			fmt.Printf("cpu known %t, io known %t, switches known %t, notes %q\n", cpuKnown, server.ioKnown, server.switchesKnown, notes)
		}
	}
	os.Exit(0)
}

func helperWork() {
	zero, _ := syscall.Open("/dev/zero", syscall.O_RDONLY, 0)
	null, _ := syscall.Open("/dev/null", syscall.O_WRONLY, 0)
	var b [1]byte
	for range helperReads {
		syscall.Read(zero, b[:])
	}
	for range helperWrites {
		syscall.Write(null, b[:])
	}
	syscall.Close(zero)
	syscall.Close(null)
	helperSleep()
}

// helperSleep blocks its thread helperSleeps times: a voluntary context
// switch each.
func helperSleep() {
	ts := syscall.NsecToTimespec(int64(time.Millisecond))
	for range helperSleeps {
		syscall.Nanosleep(&ts, nil)
	}
}

// helper is a running helper process.
type helper struct {
	t   *testing.T
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
}

func startHelper(t *testing.T, binary string, configure func(*exec.Cmd)) *helper {
	t.Helper()
	if _, err := os.Stat(filepath.Join(procRoot, "self", "io")); err != nil {
		t.Skipf("no /proc/self/io here: %v", err)
	}
	cmd := exec.Command(binary)
	cmd.Env = append(os.Environ(), usageHelperEnv+"=1")
	cmd.Stderr = os.Stderr
	if configure != nil {
		configure(cmd)
	}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h := &helper{t: t, cmd: cmd, in: in, out: bufio.NewScanner(out)}
	t.Cleanup(func() {
		in.Close()
		cmd.Wait()
	})
	return h
}

// do sends a command and returns the helper's answer.
func (h *helper) do(command string) string {
	h.t.Helper()
	if _, err := fmt.Fprintln(h.in, command); err != nil {
		h.t.Fatal(err)
	}
	if !h.out.Scan() {
		h.t.Fatalf("the helper did not answer %q: %v", command, h.out.Err())
	}
	return h.out.Text()
}

func TestUsageOfAnotherProcess(t *testing.T) {
	h := startHelper(t, os.Args[0], nil)
	pid := h.cmd.Process.Pid
	one := startMeter(procRoot, []int{pid})
	// The same process twice, as a cluster's pid+pid+pid would sum it.
	// Its window lies inside one's: the helper's runtime may make a read
	// of its own (the poller's wake-up) at any instant, so the pair is
	// bounded by one's counts rather than equal to twice them.
	two := startMeter(procRoot, []int{pid, pid})
	if got := h.do("work"); got != "done" {
		t.Fatalf("helper answered %q", got)
	}
	_, sum, _ := two.stop()
	_, server, notes := one.stop()
	if !server.ioKnown || !server.switchesKnown {
		t.Fatalf("counters of a child process unknown: %+v %q", server, notes)
	}
	if server.syscr < helperReads || server.syscw < helperWrites {
		t.Errorf("syscr %d, syscw %d; the child read %d and wrote %d times", server.syscr, server.syscw, helperReads, helperWrites)
	}
	if server.switches < helperSleeps {
		t.Errorf("%d context switches; the child slept %d times", server.switches, helperSleeps)
	}
	if sum.syscr < 2*helperReads || sum.syscr > 2*server.syscr || sum.syscw < 2*helperWrites || sum.syscw > 2*server.syscw {
		t.Errorf("pid+pid: syscr %d, syscw %d; want twice the child's %d reads and %d writes, at most twice the one pid's %d, %d",
			sum.syscr, sum.syscw, helperReads, helperWrites, server.syscr, server.syscw)
	}
	if sum.switches < 2*helperSleeps || sum.switches > 2*server.switches || sum.cpu > 2*server.cpu {
		t.Errorf("pid+pid: cpu %v, switches %d; one pid: %v, %d", sum.cpu, sum.switches, server.cpu, server.switches)
	}
}

func TestUsageOfThisProcess(t *testing.T) {
	if _, err := os.Stat(filepath.Join(procRoot, "self", "io")); err != nil {
		t.Skipf("no /proc/self/io here: %v", err)
	}
	m := startMeter(procRoot, nil)
	helperWork()
	self, server, notes := m.stop()
	if len(notes) > 0 || !self.ioKnown || server != (usage{}) {
		t.Fatalf("self %+v, server %+v, notes %q", self, server, notes)
	}
	if self.syscr < helperReads || self.syscw < helperWrites || self.switches < helperSleeps {
		t.Fatalf("syscr %d, syscw %d, switches %d after %d reads, %d writes and %d sleeps",
			self.syscr, self.syscw, self.switches, helperReads, helperWrites, helperSleeps)
	}
}

// Linux's per-thread counts of another process lose a thread that exits;
// the result says so. lockbench's own count (getrusage) keeps it.
func TestUsageOfThreadsThatExit(t *testing.T) {
	h := startHelper(t, os.Args[0], nil)
	pid := h.cmd.Process.Pid
	if got := h.do("spawn"); got != "spawned" {
		t.Fatalf("helper answered %q", got)
	}
	m := startMeter(procRoot, []int{pid})
	if got := h.do("exit"); got != "exited" {
		t.Fatalf("helper answered %q", got)
	}
	_, server, notes := m.stop()
	want := fmt.Sprintf("1 thread(s) of server pid %d exited during the run", pid)
	if !server.switchesKnown || len(notes) != 1 || !strings.Contains(notes[0], want) {
		t.Fatalf("switches known %t, notes %q; want one saying %q", server.switchesKnown, notes, want)
	}

	self := startMeter(procRoot, nil)
	done := make(chan struct{})
	go func() {
		runtime.LockOSThread() // the thread ends with the goroutine, unless it is the main thread
		helperSleep()
		close(done)
	}()
	<-done
	used, _, _ := self.stop()
	if used.switches < helperSleeps {
		t.Fatalf("lockbench's own switches %d, after a thread slept %d times and exited", used.switches, helperSleeps)
	}
}

// Another user's server: its syscalls cannot be read (ptrace access), and
// the result says so; its CPU time and context switches are still known.
func TestUsageOfAnUnreadableServer(t *testing.T) {
	if os.Getuid() != 0 {
		// Unprivileged: the io of a process of another user (init's, where
		// it is root's) is what cannot be read.
		if info, err := os.Stat("/proc/1"); err != nil || info.Sys().(*syscall.Stat_t).Uid == uint32(os.Getuid()) {
			t.Skip("no process of another user to meter")
		}
		m := startMeter(procRoot, []int{1})
		_, server, notes := m.stop()
		checkUnreadableIO(t, server.ioKnown, server.switchesKnown, fmt.Sprint(notes))
		return
	}
	// Root reads every io file: meter this process from a helper running
	// as nobody, a copy of the test binary it may execute.
	dir, err := os.MkdirTemp("", "lockbench-helper")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	binary := filepath.Join(dir, "helper")
	data, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(binary, data, 0o755); err != nil {
		t.Fatal(err)
	}
	h := startHelper(t, binary, func(cmd *exec.Cmd) {
		cmd.Dir = dir
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	})
	got := h.do(fmt.Sprintf("meter %d", os.Getpid()))
	t.Log(got)
	checkUnreadableIO(t, strings.Contains(got, "io known true"), strings.Contains(got, "switches known true"), got)
	if !strings.Contains(got, "cpu known true") {
		t.Errorf("CPU time unknown: %s", got)
	}
}

func checkUnreadableIO(t *testing.T, ioKnown, switchesKnown bool, report string) {
	t.Helper()
	if ioKnown || !switchesKnown {
		t.Fatalf("io known %t, switches known %t: %s", ioKnown, switchesKnown, report)
	}
	for _, want := range []string{"server syscalls unknown", "permission denied", "needs the same user or root"} {
		if !strings.Contains(report, want) {
			t.Errorf("the note lacks %q: %s", want, report)
		}
	}
}

func TestMeterOfAMissingProcess(t *testing.T) {
	m := startMeter(procRoot, []int{os.Getpid(), -1})
	_, server, notes := m.stop()
	if server != (usage{}) || len(notes) != 1 || !strings.Contains(notes[0], "server counters unknown") {
		t.Fatalf("a partial sum: %+v, notes %q", server, notes)
	}
}

func TestProcParsers(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	// A command name with spaces and a parenthesis.
	cpu, err := readStatCPU(write("stat", "42 (a b) c) S 1 42 42 0 -1 4194560 100 0 0 0 150 50 0 0 20 0 5 0 100 0 0\n"))
	if err != nil || cpu != 2*time.Second {
		t.Errorf("stat: %v %v, want 2s (200 ticks)", cpu, err)
	}
	if _, err := readStatCPU(write("short", "42 (x) S 1\n")); err == nil {
		t.Error("a short stat parsed")
	}
	r, w, err := readIO(write("io", "rchar: 10\nwchar: 20\nsyscr: 3\nsyscw: 4\nread_bytes: 0\n"))
	if err != nil || r != 3 || w != 4 {
		t.Errorf("io: %d %d %v", r, w, err)
	}
	if _, _, err := readIO(write("io-broken", "syscr: x\nsyscw: 4\n")); err == nil {
		t.Error("a broken io parsed")
	}
	if _, err := procField([]byte("voluntary_ctxt_switches:\t7\n"), "nonvoluntary_ctxt_switches"); err == nil {
		t.Error("a missing field was found")
	}
	switches, lost := threadSwitchesSince(map[int]uint64{1: 10, 2: 5, 3: 9}, map[int]uint64{1: 15, 3: 2, 4: 6})
	// 1: +5; 2: gone; 3: went back (id reused), counts 2; 4: new, counts 6.
	if switches != 13 || lost != 2 {
		t.Errorf("thread sums %d, lost %d; want 13, 2", switches, lost)
	}
}
