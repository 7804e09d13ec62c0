package bench

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// CPU time spent during a run, so that a result can say where the
// machine's cores went: on a small machine the load generator and the
// server share them, and cycles per second alone cannot tell which of the
// two was the limit.

// userHZ is the unit of the CPU times in /proc/PID/stat, fixed by the
// Linux ABI.
const userHZ = 100

// selfCPU is the CPU time this process has used, user and system.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// processCPU is the CPU time process pid has used, user and system, read
// from /proc (Linux only).
func processCPU(pid int) (time.Duration, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name, field 2, is in parentheses and may hold spaces;
	// utime and stime are fields 14 and 15, the 12th and 13th after it.
	s := string(data)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fields) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: too few fields", pid)
	}
	var ticks int64
	for _, f := range fields[11:13] {
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / userHZ, nil
}

// serverCPU is the CPU time the processes pids have used together, user
// and system: a cluster's nodes, or a single server's one process. It
// fails when any of them cannot be read, rather than give a partial sum.
func serverCPU(pids []int) (time.Duration, error) {
	var sum time.Duration
	for _, pid := range pids {
		t, err := processCPU(pid)
		if err != nil {
			return 0, err
		}
		sum += t
	}
	return sum, nil
}

// cpuMeter reads the CPU times at the start of the measurement.
type cpuMeter struct {
	serverPIDs []int
	self       time.Duration
	server     time.Duration
	haveServer bool
}

func (r *run) startCPU() cpuMeter {
	m := cpuMeter{serverPIDs: r.cfg.ServerPIDs, self: selfCPU()}
	if len(m.serverPIDs) > 0 {
		var err error
		m.server, err = serverCPU(m.serverPIDs)
		m.haveServer = err == nil
	}
	return m
}

// stop returns the CPU times used since startCPU; the server's is 0 when
// unknown.
func (m cpuMeter) stop() (bench, server time.Duration) {
	bench = selfCPU() - m.self
	if m.haveServer {
		if now, err := serverCPU(m.serverPIDs); err == nil {
			server = now - m.server
		}
	}
	return bench, server
}
