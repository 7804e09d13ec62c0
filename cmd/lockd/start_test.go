package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// A default start is routine: everything lockd logs until it serves is
// info, nothing a warning (the connection cap below the default
// --max-conns included); a cap below a --max-conns the operator chose
// is a warning.
func TestDefaultStartLogsNoWarning(t *testing.T) {
	bin := buildLockd(t)
	cmd := exec.Command(bin, "serve", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--data-dir", t.TempDir(), "--drain-grace", "0s")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		var l logLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("not a log line: %q", sc.Text())
		}
		if l.Level != "info" {
			t.Errorf("a default start logged at %s: %s", l.Level, sc.Text())
		}
		if l.Message == "lockd serving" {
			break
		}
	}

	w := startWatched(t, "1024:1024", "--max-conns", "5000", "--drain-grace", "0s")
	if w.capLine.Level != "warn" || w.capLine.ConnCap >= 5000 {
		t.Fatalf("a cap below the --max-conns chosen: %+v, want a warning", w.capLine)
	}
}

// A start that fails — here the admin port is taken — exits 1 at once:
// it served nobody, so the drain grace is not waited out.
func TestFailedStartExitsAtOnce(t *testing.T) {
	bin := buildLockd(t)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	cmd := exec.Command(bin, "serve", "--listen", "127.0.0.1:0", "--admin", taken.Addr().String(), "--data-dir", t.TempDir(), "--drain-grace", "1h")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != exitFailure || !strings.Contains(stderr.String(), taken.Addr().String()) {
			t.Fatalf("exit %v, stderr %q; want %d naming the admin address", err, stderr.String(), exitFailure)
		}
	case <-time.After(time.Minute): // far below the hour of drain grace
		cmd.Process.Kill()
		<-exited
		t.Fatalf("a failed start did not exit; it waits out --drain-grace? stderr %q", stderr.String())
	}
}

func TestDurationFlagsHintAtUnits(t *testing.T) {
	code, _, errs := lockd("serve", "--drain-grace", "5")
	if code != exitUsage || !strings.Contains(errs, "write 5s") {
		t.Fatalf("--drain-grace 5: exit %d, %q", code, errs)
	}
}

// The data dir's log line says what happened: a new data dir starts
// tokens at 1; a restart continues above the mark the first run left.
func TestTokenMarkLogLine(t *testing.T) {
	bin := buildLockd(t)
	dataDir := t.TempDir() + "/data"
	first := startLockd(t, bin, t.TempDir(), "--data-dir", dataDir)
	if !strings.Contains(first.startLog, `"first_token":1,`) || !strings.Contains(first.startLog, "fencing tokens start in a new data dir") ||
		strings.Contains(first.startLog, "continue above") {
		t.Fatalf("a fresh data dir's start log:\n%s", first.startLog)
	}
	first.kill9(t)
	again := startLockd(t, bin, t.TempDir(), "--data-dir", dataDir)
	if !strings.Contains(again.startLog, "fencing tokens continue above the data dir's mark") || strings.Contains(again.startLog, `"first_token":1,`) {
		t.Fatalf("a restart's start log:\n%s", again.startLog)
	}
}
