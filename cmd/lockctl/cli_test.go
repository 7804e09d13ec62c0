package main

import (
	"encoding/hex"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lockd/lockd/cmd/internal/envflag"
)

// flagsOf are the flags of a lockctl command.
func flagsOf(command string) []*flag.Flag {
	var flags []*flag.Flag
	newFlagSet(command, &options{}).VisitAll(func(f *flag.Flag) { flags = append(flags, f) })
	return flags
}

// checkFlagHelp asserts that help lists every flag as --name with its
// environment variable, and states each default at most once.
func checkFlagHelp(t *testing.T, what, help string, flags []*flag.Flag) {
	t.Helper()
	quoted := regexp.MustCompile(`"[^"]*"`)
	for _, f := range flags {
		_, entry, ok := strings.Cut(help, "  --"+f.Name+" ")
		if !ok { // a boolean flag takes no value
			_, entry, ok = strings.Cut(help, "  --"+f.Name+"\n")
		}
		if !ok {
			t.Errorf("%s: help does not list --%s", what, f.Name)
			continue
		}
		if next := strings.Index(entry, "\n  --"); next >= 0 {
			entry = entry[:next]
		}
		if !strings.Contains(entry, envflag.Name(f.Name)) {
			t.Errorf("%s --%s: help does not name %s: %q", what, f.Name, envflag.Name(f.Name), entry)
		}
		if n := strings.Count(quoted.ReplaceAllString(entry, ""), "default"); n > 1 {
			t.Errorf("%s --%s: the default is stated %d times: %q", what, f.Name, n, entry)
		}
	}
}

func TestHelpShowsEveryFlagAndExitsZero(t *testing.T) {
	every := append(flagsOf("exec"), flagsOf("list")...)
	for _, args := range [][]string{{"--help"}, {"-h"}, {"help"}} {
		code, out, errs := ctl{}.run(args...)
		if code != exitOK || errs != "" || !strings.Contains(out, "Exit status:") {
			t.Errorf("lockctl %q: exit %d, stderr %q, stdout %q", args, code, errs, out)
		}
		checkFlagHelp(t, strings.Join(args, " "), out, every)
	}
	for command := range commandArgs {
		for _, help := range []string{"--help", "-h"} {
			code, out, errs := ctl{}.run(command, help)
			if code != exitOK || errs != "" || !strings.Contains(out, "Flags of lockctl "+command) {
				t.Errorf("lockctl %s %s: exit %d, stderr %q, stdout %q", command, help, code, errs, out)
			}
			checkFlagHelp(t, command+" "+help, out, flagsOf(command))
		}
	}
	var names []string
	for _, f := range flagsOf("release") {
		names = append(names, f.Name)
	}
	slices.Sort(names)
	if want := []string{"addr", "secret-file", "tenant", "tls-ca", "tls-cert", "tls-key", "tls-server-name"}; !slices.Equal(names, want) {
		t.Errorf("release has the flags %q; the help says it takes only --addr, --tenant, --secret-file and the --tls ones", names)
	}
}

func TestVersion(t *testing.T) {
	code, out, _ := ctl{}.run("--version")
	if code != exitOK || !strings.HasPrefix(out, "lockctl ") || !strings.Contains(out, runtime.Version()) {
		t.Fatalf("exit %d, %q", code, out)
	}
}

// TestMessagesNameFlagsAndVariables: what a user must fix is said in the
// words of the command line, never in the client's Go field names.
func TestMessagesNameFlagsAndVariables(t *testing.T) {
	secret := []byte("a shared secret of the t1 tenant")
	authAddr := startServer(t, map[string][]byte{"t1": secret})
	addr := startServer(t, nil)
	for _, tc := range []struct {
		env  map[string]string
		args []string
		code int
		says []string
	}{
		{nil, []string{"acquire", "--addr", authAddr, "k"}, exitFailure, []string{"requires authentication", "--tenant", "--secret-file", "LOCKD_SECRET"}},
		{map[string]string{"LOCKD_SECRET": hex.EncodeToString(secret)}, []string{"acquire", "--addr", authAddr, "k"}, exitUsage, []string{"--tenant", "LOCKD_SECRET"}},
		{map[string]string{"LOCKD_SECRET": "00"}, []string{"release", "--addr", authAddr, "--tenant", "t1", "k", "1"}, exitFailure, []string{"--tenant \"t1\"", "--secret-file or LOCKD_SECRET"}},
		{map[string]string{"LOCKD_SECRET": "not hex"}, []string{"acquire", "--addr", authAddr, "--tenant", "t1", "k"}, exitFailure, []string{"LOCKD_SECRET", "openssl rand -hex 32"}},
		{nil, []string{"acquire", "--addr", addr, "--tenant", "a/b", "k"}, exitUsage, []string{"--tenant"}},
		{nil, []string{"acquire", "--addr", addr, "--budget", "31s", "k"}, exitUsage, []string{"--budget", "--lease"}},
		{nil, []string{"acquire", "--addr", addr, "--lease", "2h", "k"}, exitUsage, []string{"--lease"}},
		{nil, []string{"exec", "--addr", addr, "--wait", "300s", "k", "--", "true"}, exitUsage, []string{"--wait"}},
		{nil, []string{"acquire", "--addr", addr, "--lease", "-1s", "k"}, exitUsage, []string{"--lease"}},
	} {
		code, _, errs := ctl{env: tc.env}.run(tc.args...)
		if code != tc.code {
			t.Errorf("%q: exit %d, want %d (%s)", tc.args, code, tc.code, errs)
		}
		for _, s := range tc.says {
			if !strings.Contains(errs, s) {
				t.Errorf("%q: %q does not say %q", tc.args, errs, s)
			}
		}
		if strings.Contains(errs, "Config.") || strings.Contains(errs, "MinWorkBudget") {
			t.Errorf("%q: %q names a Go field", tc.args, errs)
		}
	}
}

// waitForWaiters waits until the server has n queued waiters.
func waitForWaiters(t *testing.T, count func() int, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for count() != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d waiters, want %d", count(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestCtrlCDuringAWaitIsNotAcquired: SIGINT while lockctl queues for a
// held lock ends it with 130, "not acquired", its waiter gone from the
// server, and exec's command never started.
func TestCtrlCDuringAWaitIsNotAcquired(t *testing.T) {
	srv := startLockd(t, nil)
	waiters := func() int { return srv.Engine().Stats().Waiters }
	if code, _, errs := (ctl{}).run("acquire", "--addr", srv.Addr(), "--lease", "1m", "held"); code != exitOK {
		t.Fatalf("first acquire: %d %s", code, errs)
	}
	marker := filepath.Join(t.TempDir(), "ran")
	for _, args := range [][]string{
		{"acquire", "--addr", srv.Addr(), "--wait", "60s", "held"},
		{"exec", "--addr", srv.Addr(), "--wait", "60s", "held", "--", "touch", marker},
	} {
		signals := make(chan os.Signal, 1)
		type result struct {
			code int
			errs string
		}
		done := make(chan result, 1)
		go func() {
			code, _, errs := ctl{signals: signals}.run(args...)
			done <- result{code, errs}
		}()
		waitForWaiters(t, waiters, 1)
		signals <- syscall.SIGINT
		r := <-done
		if r.code != 130 || !strings.Contains(r.errs, "SIGINT") || !strings.Contains(r.errs, "not acquired") {
			t.Errorf("%s: exit %d, stderr %q; want 130 and \"not acquired\"", args[0], r.code, r.errs)
		}
		waitForWaiters(t, waiters, 0)
	}
	if _, err := os.Stat(marker); !os.IsNotExist(err) {
		t.Fatalf("exec ran its command after Ctrl-C: %v", err)
	}
}
