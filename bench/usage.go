package bench

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// What the processes of a run used: CPU time, read and write system calls
// and context switches, for lockbench itself and for the target's server
// processes (--server-pids). On a small machine the load generator and the
// server share the cores, and cycles per second alone cannot tell which of
// the two was the limit, nor whether a gain came from fewer syscalls or
// fewer wake-ups.
//
// Where Linux keeps each counter, and what it includes:
//
//   - CPU time: /proc/PID/stat utime+stime (another process) and
//     getrusage(RUSAGE_SELF) (lockbench), both for the whole process,
//     threads that exited included.
//   - syscr / syscw: /proc/PID/io, for the whole thread group, threads that
//     exited included (the kernel folds an exiting thread's counts into its
//     process's). They count the read-like (read, readv, pread, ...) and
//     write-like (write, writev, pwrite, ...) calls that go through the VFS,
//     a read that finds nothing included (Go's net package tries one before
//     it parks a goroutine on the poller); send/recv-family calls and
//     epoll_wait are not in them. Go's net
//     package, gnet, Redis and etcd move socket bytes with read/write and
//     writev, so these are the I/O calls of every target here. Reading
//     another process's io file needs ptrace-read access (the same user, or
//     root); without it the syscalls stay unknown and the result says why.
//   - context switches (voluntary + involuntary): /proc/PID/status holds the
//     counts of the main thread alone, not of the process, so for another
//     process they are summed over /proc/PID/task/*/status, thread by
//     thread. A thread that exits during the run takes its counts with it:
//     such threads are counted and named in the result's notes, and a
//     thread born and gone within the run is not seen at all. For
//     lockbench itself getrusage(RUSAGE_SELF) has the whole process's sum,
//     exited threads included, and is used instead.

// procRoot is where the proc file system is mounted.
const procRoot = "/proc"

// userHZ is the unit of the CPU times in /proc/PID/stat, fixed by the
// Linux ABI.
const userHZ = 100

// usage is what a process, or a group of processes, used during a run.
type usage struct {
	cpu          time.Duration
	syscr, syscw uint64
	switches     uint64
	// ioKnown and switchesKnown say whether syscr/syscw and switches could
	// be read at both ends of the run.
	ioKnown, switchesKnown bool
}

// reading is one process's cumulative counters at one instant.
type reading struct {
	cpu          time.Duration
	syscr, syscw uint64
	ioErr        error
	// threads has each live thread's context switches by thread id;
	// threadsErr says why it could not be read.
	threads    map[int]uint64
	threadsErr error
}

// readProcess reads pid's counters under root. It fails only when the
// process's stat cannot be read (the process is gone); the io file and the
// threads fail soft, into ioErr and threadsErr.
func readProcess(root string, pid int) (reading, error) {
	dir := filepath.Join(root, strconv.Itoa(pid))
	var rd reading
	var err error
	if rd.cpu, err = readStatCPU(filepath.Join(dir, "stat")); err != nil {
		return rd, err
	}
	rd.syscr, rd.syscw, rd.ioErr = readIO(filepath.Join(dir, "io"))
	rd.threads, rd.threadsErr = readThreadSwitches(filepath.Join(dir, "task"))
	return rd, nil
}

// readStatCPU reads utime+stime from a /proc/PID/stat file.
func readStatCPU(path string) (time.Duration, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	// The command name, field 2, is in parentheses and may hold spaces;
	// utime and stime are fields 14 and 15, the 12th and 13th after it.
	end := bytes.LastIndexByte(data, ')')
	if end < 0 {
		return 0, fmt.Errorf("%s: no command name", path)
	}
	fields := strings.Fields(string(data[end+1:]))
	if len(fields) < 13 {
		return 0, fmt.Errorf("%s: too few fields", path)
	}
	var ticks int64
	for _, f := range fields[11:13] {
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", path, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / userHZ, nil
}

// readIO reads syscr and syscw from a /proc/PID/io file.
func readIO(path string) (syscr, syscw uint64, err error) {
	data, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, fs.ErrPermission) {
			err = fmt.Errorf("%w (reading another process's io needs the same user or root)", err)
		}
		return 0, 0, err
	}
	if syscr, err = procField(data, "syscr"); err != nil {
		return 0, 0, fmt.Errorf("%s: %w", path, err)
	}
	if syscw, err = procField(data, "syscw"); err != nil {
		return 0, 0, fmt.Errorf("%s: %w", path, err)
	}
	return syscr, syscw, nil
}

// readThreadSwitches reads voluntary + involuntary context switches of
// every thread under a /proc/PID/task directory. A thread that exits
// between the listing and its read is left out, as one that exited before
// the listing is.
func readThreadSwitches(taskDir string) (map[int]uint64, error) {
	entries, err := os.ReadDir(taskDir)
	if err != nil {
		return nil, err
	}
	threads := make(map[int]uint64, len(entries))
	for _, e := range entries {
		tid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		path := filepath.Join(taskDir, e.Name(), "status")
		data, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
			continue
		}
		if err != nil {
			return nil, err
		}
		voluntary, err := procField(data, "voluntary_ctxt_switches")
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		involuntary, err := procField(data, "nonvoluntary_ctxt_switches")
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		threads[tid] = voluntary + involuntary
	}
	return threads, nil
}

// procField finds the line "name: value" (or "name:\tvalue") in a /proc
// file and parses its value.
func procField(data []byte, name string) (uint64, error) {
	for line := range bytes.Lines(data) {
		key, value, ok := bytes.Cut(line, []byte(":"))
		if !ok || string(key) != name {
			continue
		}
		n, err := strconv.ParseUint(string(bytes.TrimSpace(value)), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("field %s: %w", name, err)
		}
		return n, nil
	}
	return 0, fmt.Errorf("no field %s", name)
}

// selfReading is lockbench's own counters: CPU time and context switches
// from getrusage, which has the whole process's sums, exited threads
// included; syscalls from /proc/self/io.
type selfReading struct {
	cpu          time.Duration
	switches     uint64
	syscr, syscw uint64
	ioErr        error
}

func readSelf(root string) selfReading {
	var s selfReading
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err == nil {
		s.cpu = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
		s.switches = uint64(ru.Nvcsw + ru.Nivcsw)
	}
	s.syscr, s.syscw, s.ioErr = readIO(filepath.Join(root, "self", "io"))
	return s
}

// meter reads the counters at the start of the measurement; stop reads
// them again and returns the differences.
type meter struct {
	root       string
	serverPIDs []int
	self       selfReading
	server     []reading // by pid, in serverPIDs order
	serverErr  error     // the server's counters are unknown
}

func startMeter(root string, serverPIDs []int) *meter {
	m := &meter{root: root, serverPIDs: serverPIDs, self: readSelf(root)}
	for _, pid := range serverPIDs {
		rd, err := readProcess(root, pid)
		if err != nil {
			m.serverErr = err
			break
		}
		m.server = append(m.server, rd)
	}
	return m
}

// stop returns what lockbench and the server used since startMeter, and
// notes on what could not be counted. The server's usage is zero, and
// unknown, when no pids were given or any of its processes could not be
// read: a group is never reported as a partial sum.
func (m *meter) stop() (self, server usage, notes []string) {
	end := readSelf(m.root)
	self = usage{
		cpu:           end.cpu - m.self.cpu,
		switches:      end.switches - m.self.switches,
		switchesKnown: true,
	}
	if m.self.ioErr == nil && end.ioErr == nil {
		self.syscr, self.syscw, self.ioKnown = end.syscr-m.self.syscr, end.syscw-m.self.syscw, true
	} else {
		notes = append(notes, fmt.Sprintf("lockbench's syscalls unknown: %v", cmp.Or(m.self.ioErr, end.ioErr)))
	}
	if len(m.serverPIDs) == 0 {
		return self, server, notes
	}
	if m.serverErr != nil {
		return self, server, append(notes, fmt.Sprintf("server counters unknown: %v", m.serverErr))
	}
	server.ioKnown, server.switchesKnown = true, true
	for i, pid := range m.serverPIDs {
		start := m.server[i]
		now, err := readProcess(m.root, pid)
		if err != nil {
			return self, usage{}, append(notes, fmt.Sprintf("server counters unknown: %v", err))
		}
		server.cpu += now.cpu - start.cpu
		if ioErr := cmp.Or(start.ioErr, now.ioErr); ioErr != nil {
			if server.ioKnown {
				notes = append(notes, fmt.Sprintf("server syscalls unknown: %v", ioErr))
			}
			server.ioKnown = false
		} else {
			server.syscr += now.syscr - start.syscr
			server.syscw += now.syscw - start.syscw
		}
		if threadsErr := cmp.Or(start.threadsErr, now.threadsErr); threadsErr != nil {
			if server.switchesKnown {
				notes = append(notes, fmt.Sprintf("server context switches unknown: %v", threadsErr))
			}
			server.switchesKnown = false
			continue
		}
		switches, lost := threadSwitchesSince(start.threads, now.threads)
		server.switches += switches
		if lost > 0 {
			notes = append(notes, fmt.Sprintf("%d thread(s) of server pid %d exited during the run: their context switches during it are not counted", lost, pid))
		}
	}
	if !server.ioKnown {
		server.syscr, server.syscw = 0, 0
	}
	if !server.switchesKnown {
		server.switches = 0
	}
	return self, server, notes
}

// threadSwitchesSince sums the context switches each thread made between
// two readings: a thread seen in both contributes its difference, one born
// since contributes all it has. lost counts the threads of the first
// reading that are gone, or whose count went backwards (the thread id was
// reused by a new thread): what they did during the run is unknown.
func threadSwitchesSince(start, now map[int]uint64) (switches uint64, lost int) {
	for tid, n := range now {
		before, seen := start[tid]
		switch {
		case !seen:
			switches += n
		case n >= before:
			switches += n - before
		default:
			switches += n
			lost++
		}
	}
	for tid := range start {
		if _, alive := now[tid]; !alive {
			lost++
		}
	}
	return switches, lost
}
