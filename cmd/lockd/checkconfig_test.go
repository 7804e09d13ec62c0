package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// checkConfigRun runs the built binary's serve --check-config with args
// and returns its exit status and output.
func checkConfigRun(t *testing.T, bin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"serve", "--check-config"}, args...)...)
	cmd.Dir = t.TempDir()
	var out, errs strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errs
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		code = exit.ExitCode()
	case err != nil:
		t.Fatal(err)
	}
	return code, out.String(), errs.String()
}

// TestCheckConfigAcceptsWhatServeStarts: a configuration serve accepts
// checks out with exit status 0, and the check neither binds the port
// nor creates the data dir.
func TestCheckConfigAcceptsWhatServeStarts(t *testing.T) {
	bin := buildLockd(t)
	dataDir := filepath.Join(t.TempDir(), "data")
	code, out, errs := checkConfigRun(t, bin, "--listen", "127.0.0.1:0", "--admin", "", "--data-dir", dataDir)
	if code != 0 || !strings.Contains(out, "ok (single mode)") || errs != "" {
		t.Fatalf("exit %d, stdout %q, stderr %q; want 0 and ok", code, out, errs)
	}
	if _, err := os.Stat(dataDir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("--check-config touched the data dir: %v", err)
	}
	p := startLockd(t, bin, t.TempDir(), "--data-dir", dataDir)
	if p.listen == "" {
		t.Fatal("serve did not start with the checked flags")
	}
}

// TestCheckConfigNamesEveryProblem: each problem is one line naming its
// flag, all of them in one run, and the exit status is 1; serve refuses
// the same configuration.
func TestCheckConfigNamesEveryProblem(t *testing.T) {
	bin := buildLockd(t)
	notADir := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(notADir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(t.TempDir(), "no-such-auth")
	args := []string{
		"--cluster", "--node-id", "1", "--peers", "1=10.0.0.1:7430,2=10.0.0.2:x,3=10.0.0.3:7430",
		"--data-dir", filepath.Join(notADir, "data"),
		"--listen", "0.0.0.0:7420", "--admin", "0.0.0.0:7421",
		"--raft-tls-cert", missing, "--raft-tls-key", missing, "--raft-tls-ca", missing,
	}
	code, out, errs := checkConfigRun(t, bin, args...)
	if code != exitFailure || out != "" {
		t.Fatalf("exit %d, stdout %q: want 1 and nothing on stdout", code, out)
	}
	lines := strings.Split(strings.TrimSuffix(errs, "\n"), "\n")
	for _, want := range [][]string{
		{"--raft-tls-cert", missing},
		{"--peers 2 10.0.0.2:x", "port"},
		{"--data-dir", "not a directory"},
		{`listen on non-loopback "0.0.0.0:7420"`, "--auth-file"},
		{`admin endpoint on non-loopback "0.0.0.0:7421"`, "--admin-token-file"},
	} {
		found := false
		for _, l := range lines {
			found = found || strings.Contains(l, want[0]) && strings.Contains(l, want[1])
		}
		if !found {
			t.Errorf("no line says %q and %q:\n%s", want[0], want[1], errs)
		}
	}
	if len(lines) != 5 {
		t.Errorf("%d lines for 5 problems:\n%s", len(lines), errs)
	}
	for _, l := range lines {
		if !strings.HasPrefix(l, "lockd serve --check-config: ") {
			t.Errorf("line %q does not say where it comes from", l)
		}
	}
	refusedStart(t, bin, args[:len(args)-6]...)

	// Plain TCP Raft on an address other machines reach: the rule serve
	// applies, without --insecure-raft.
	code, _, errs = checkConfigRun(t, bin, "--cluster", "--node-id", "1", "--peers", "1=10.0.0.1:7430,2=10.0.0.2:7430,3=10.0.0.3:7430",
		"--data-dir", t.TempDir(), "--listen", "127.0.0.1:0", "--admin", "")
	if code != exitFailure || !strings.Contains(errs, "--insecure-raft") || strings.Count(errs, "\n") != 1 {
		t.Fatalf("plain Raft on 10.0.0.1: exit %d, %q; want 1 and one line naming --raft-tls-cert or --insecure-raft", code, errs)
	}
}
