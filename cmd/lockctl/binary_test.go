package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lockd/lockd/internal/adminjson"
)

// binary runs the built lockctl, as a user's shell does.
type binary string

func buildBinary(t *testing.T) binary {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "lockctl")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build lockctl: %v\n%s", err, out)
	}
	return binary(bin)
}

func (b binary) run(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	cmd := exec.Command(string(b), args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	var out, errs strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errs
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		code = exit.ExitCode()
	case err != nil:
		t.Fatalf("lockctl %q: %v", args, err)
	}
	return code, out.String(), errs.String()
}

// The findings of a new user's first hour, each replayed through the
// built binary.
func TestCLIFindingsThroughTheBinary(t *testing.T) {
	bin := buildBinary(t)
	addr, admin := startInspectable(t, nil)
	if code, _, errs := bin.run(t, "acquire", "--addr", addr, "--lease", "1m", "held1"); code != exitOK {
		t.Fatalf("acquire: %d %s", code, errs)
	}

	t.Run("a busy lock reads as busy", func(t *testing.T) {
		code, out, errs := bin.run(t, "exec", "--addr", addr, "--wait", "1s", "held1", "--", "echo", "ran")
		if want := "lockctl: held1 is held; not acquired within 1s\n"; code != exitNotAcquired || errs != want || out != "" {
			t.Fatalf("exit %d, stdout %q, stderr %q; want %d and %q", code, out, errs, exitNotAcquired, want)
		}
		code, _, errs = bin.run(t, "acquire", "--addr", addr, "held1")
		if want := "lockctl: held1 is held; not acquired\n"; code != exitNotAcquired || errs != want {
			t.Fatalf("wait 0: exit %d, stderr %q; want %q", code, errs, want)
		}
		code, _, errs = bin.run(t, "acquire", "--addr", addr, "--verbose", "--wait", "1s", "held1")
		// The client's answer: its wait ran out, or, on a slow machine, the
		// server's TIMEOUT came first.
		if code != exitNotAcquired || !strings.HasPrefix(errs, "lockctl: held1 is held; not acquired within 1s\nlockctl acquire: lockd client: ") {
			t.Fatalf("--verbose: exit %d, stderr %q; want the plain line, then the client's answer", code, errs)
		}
	})

	t.Run("flags after the arguments", func(t *testing.T) {
		code, out, errs := bin.run(t, "status", "held1", "--json", "--admin", admin)
		var st adminjson.LockStatus
		if code != exitOK || json.Unmarshal([]byte(out), &st) != nil || !st.Held {
			t.Fatalf("status KEY --json: exit %d %q %q", code, out, errs)
		}
		code, out, errs = bin.run(t, "acquire", "free1", "--addr", addr, "--lease", "1m")
		if _, err := strconv.ParseUint(strings.TrimSpace(out), 10, 64); code != exitOK || err != nil {
			t.Fatalf("acquire KEY --addr: exit %d %q %q", code, out, errs)
		}
		clusterAdmin, _ := startClusterNode(t)
		code, out, errs = bin.run(t, "cluster", "list", "--admin", clusterAdmin)
		if code != exitOK || !strings.Contains(out, "REACHABLE") {
			t.Fatalf("cluster list --admin X: exit %d %q %q", code, out, errs)
		}
		code, out, errs = bin.run(t, "exec", "free2", "--addr", addr, "--", "sh", "-c", `echo "$LOCKD_KEY" --addr`)
		if code != exitOK || out != "free2 --addr\n" {
			t.Fatalf("exec KEY --addr X -- CMD: the command's arguments are its own: exit %d %q %q", code, out, errs)
		}
	})

	t.Run("one bad-key message stating the rule", func(t *testing.T) {
		const rule = "want 1..128 bytes of UTF-8 without spaces or line breaks"
		long := strings.Repeat("k", 200)
		for _, args := range [][]string{
			{"exec", "--addr", addr, "my key", "--", "true"},
			{"exec", "--addr", addr, long, "--", "true"},
			{"acquire", "--addr", addr, "my key"},
			{"release", "--addr", addr, "my key", "1"},
			{"elect", "--addr", addr, "my key", "--", "true"},
			{"status", "--admin", admin, "my key"},
		} {
			code, _, errs := bin.run(t, args...)
			if code != exitUsage || !strings.Contains(errs, rule) || strings.Count(errs, "\n") != 1 {
				t.Errorf("%s %.20q: exit %d, stderr %q; want %d and one line stating the rule", args[0], args[3], code, errs, exitUsage)
			}
		}
	})

	t.Run("grace defaults to a share of a short lease", func(t *testing.T) {
		code, out, errs := bin.run(t, "exec", "--addr", addr, "--lease", "2s", "short", "--", "echo", "ran")
		if code != exitOK || out != "ran\n" {
			t.Fatalf("exec --lease 2s: exit %d %q %q", code, out, errs)
		}
		code, _, errs = bin.run(t, "exec", "--addr", addr, "--lease", "2s", "--grace", "2s", "short", "--", "true")
		if code != exitUsage || !strings.Contains(errs, "--grace 2s") {
			t.Fatalf("an explicit --grace as long as the lease: exit %d %q", code, errs)
		}
	})

	t.Run("a bare number gets a unit hint", func(t *testing.T) {
		code, _, errs := bin.run(t, "acquire", "--addr", addr, "--lease", "30", "k")
		if code != exitUsage || !strings.Contains(errs, "write 30s") {
			t.Fatalf("--lease 30: exit %d %q", code, errs)
		}
	})

	t.Run("per-command help", func(t *testing.T) {
		code, out, errs := bin.run(t, "exec", "--help")
		if code != exitOK || !strings.HasPrefix(out, "usage: lockctl exec ") || strings.Contains(out, "lockctl cluster") || !strings.Contains(out, "--grace") {
			t.Fatalf("exec --help: exit %d %q %q", code, out, errs)
		}
		_, all, _ := bin.run(t, "--help")
		if lines, total := strings.Count(out, "\n"), strings.Count(all, "\n"); lines*2 > total {
			t.Fatalf("exec --help has %d lines of the global help's %d", lines, total)
		}
	})
}

// lockctl elect runs the command while leader, with its term; a second
// candidate is not elected while it leads, and the next leader, once it
// resigned, has a higher term.
func TestElectThroughTheBinary(t *testing.T) {
	bin := buildBinary(t)
	addr := startServer(t, nil)
	dir := t.TempDir()
	leading := exec.Command(string(bin), "elect", "--addr", addr, "--lease", "3s", "svc/leader", "--",
		"sh", "-c", `echo "$LOCKD_TERM"; echo "$LOCKD_KEY"; exec sleep 60`)
	leading.Env = []string{"PATH=" + os.Getenv("PATH")}
	stdout, err := leading.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var errs strings.Builder
	leading.Stderr = &errs
	if err := leading.Start(); err != nil {
		t.Fatal(err)
	}
	defer leading.Process.Kill()
	lines := bufio.NewScanner(stdout)
	if !lines.Scan() {
		t.Fatalf("the leader's command printed nothing: %s", errs.String())
	}
	first, err := strconv.ParseUint(lines.Text(), 10, 64)
	if err != nil || first == 0 || !lines.Scan() || lines.Text() != "svc/leader" {
		t.Fatalf("LOCKD_TERM %q, LOCKD_KEY %q", lines.Text(), lines.Text())
	}

	code, _, stderr := bin.run(t, "elect", "--addr", addr, "--wait", "1s", "svc/leader", "--", "touch", filepath.Join(dir, "ran"))
	if want := "lockctl: svc/leader has a leader; not elected within 1s\n"; code != exitNotAcquired || stderr != want {
		t.Fatalf("second candidate: exit %d %q, want %d %q", code, stderr, exitNotAcquired, want)
	}
	if _, err := os.Stat(filepath.Join(dir, "ran")); !os.IsNotExist(err) {
		t.Fatal("the second candidate ran its command while the first led")
	}

	// SIGTERM is relayed to the command; when it exits, lockctl resigns.
	leading.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- leading.Wait() }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("elect did not end after its command did")
	}
	if leading.ProcessState.ExitCode() != exitSignalBase+int(syscall.SIGTERM) {
		t.Fatalf("elect exited %v, want the command's 143", leading.ProcessState)
	}
	code, out, stderr := bin.run(t, "elect", "--addr", addr, "--wait", "2s", "svc/leader", "--", "sh", "-c", `echo "$LOCKD_TERM"`)
	next, err := strconv.ParseUint(strings.TrimSpace(out), 10, 64)
	if code != exitOK || err != nil || next <= first {
		t.Fatalf("next leader: exit %d, term %q (%s), want one above %d at once", code, out, stderr, first)
	}
}
