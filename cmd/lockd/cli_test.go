package main

import (
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/lockd/lockd/cmd/internal/envflag"
)

func noEnv(string) (string, bool) { return "", false }

// lockd runs the command in-process and returns its status and output.
func lockd(args ...string) (code int, stdout, stderr string) {
	var out, errs strings.Builder
	code = run(args, noEnv, &out, &errs)
	return code, out.String(), errs.String()
}

// serveFlags are the flags of `lockd serve`.
func serveFlags(t *testing.T) []*flag.Flag {
	t.Helper()
	o, err := parseServeOptions(nil, noEnv)
	if err != nil {
		t.Fatal(err)
	}
	var flags []*flag.Flag
	o.flags.VisitAll(func(f *flag.Flag) { flags = append(flags, f) })
	if len(flags) < 20 {
		t.Fatalf("only %d flags", len(flags))
	}
	return flags
}

// checkFlagHelp asserts that help lists every flag as --name with its
// environment variable, and states each default at most once.
func checkFlagHelp(t *testing.T, help string, flags []*flag.Flag) {
	t.Helper()
	quoted := regexp.MustCompile(`"[^"]*"`)
	for _, f := range flags {
		_, entry, ok := strings.Cut(help, "  --"+f.Name+" ")
		if !ok {
			_, entry, ok = strings.Cut(help, "  --"+f.Name+"\n")
		}
		if !ok {
			t.Errorf("help does not list --%s", f.Name)
			continue
		}
		if next := strings.Index(entry, "\n  --"); next >= 0 {
			entry = entry[:next]
		}
		if !strings.Contains(entry, envflag.Name(f.Name)) {
			t.Errorf("--%s: help does not name %s: %q", f.Name, envflag.Name(f.Name), entry)
		}
		if n := strings.Count(quoted.ReplaceAllString(entry, ""), "default"); n > 1 {
			t.Errorf("--%s: the default is stated %d times: %q", f.Name, n, entry)
		}
	}
}

func TestHelpShowsEveryFlagAndExitsZero(t *testing.T) {
	flags := serveFlags(t)
	for _, args := range [][]string{{"--help"}, {"-h"}, {"help"}, {"serve", "--help"}, {"serve", "-h"}} {
		code, out, errs := lockd(args...)
		if code != 0 || errs != "" {
			t.Errorf("lockd %q: exit %d, stderr %q; want 0 and nothing", args, code, errs)
		}
		if !strings.Contains(out, "usage: lockd serve") {
			t.Errorf("lockd %q: no usage in %q", args, out)
		}
		checkFlagHelp(t, out, flags)
	}
}

func TestUsageErrorsExitTwoAndNameTheFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		says string
	}{
		{nil, "usage: lockd serve"},
		{[]string{"start"}, `unknown command "start"`},
		{[]string{"serve", "--max-keyz", "1"}, "max-keyz"},
		{[]string{"serve", "--max-keys", "many"}, "max-keys"},
		{[]string{"serve", "now"}, "unexpected arguments"},
		{[]string{"serve", "--log-level", "loud"}, "--log-level"},
		{[]string{"serve", "--cluster", "--node-id", "1"}, "--peers"},
		{[]string{"serve", "--tls-listen", "127.0.0.1:0", "--tls-cert", "c.pem"}, "--tls-listen needs --tls-cert and --tls-key"},
		{[]string{"serve", "--tls-client-ca", "ca.pem"}, "need --tls-listen"},
	} {
		code, _, errs := lockd(tc.args...)
		if code != exitUsage || !strings.Contains(errs, tc.says) {
			t.Errorf("lockd %q: exit %d, stderr %q; want %d and %q", tc.args, code, errs, exitUsage, tc.says)
		}
	}
}

func TestRuntimeFailuresExitOne(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "auth")
	weak := filepath.Join(t.TempDir(), "weak")
	if err := os.WriteFile(weak, []byte("billing : 0011\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	shared := filepath.Join(t.TempDir(), "shared")
	if err := os.WriteFile(shared, []byte("billing:"+strings.Repeat("ab", 32)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(shared, 0o644); err != nil { // past the umask
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		says []string
	}{
		{[]string{"serve", "--auth-file", missing}, []string{"--auth-file", missing}},
		{[]string{"serve", "--auth-file", weak}, []string{"--auth-file", weak + ": line 1", "openssl rand -hex 32"}},
		{[]string{"serve", "--auth-file", shared, "--admin", ""}, []string{"--auth-file", shared, "chmod 600 " + shared}},
		// Refused before anything listens: auth off on every interface.
		{[]string{"serve", "--listen", "0.0.0.0:0", "--admin", ""}, []string{"--auth-file", "--insecure-no-auth"}},
	} {
		code, _, errs := lockd(tc.args...)
		if code != exitFailure {
			t.Errorf("lockd %q: exit %d, want %d (%s)", tc.args, code, exitFailure, errs)
		}
		for _, s := range tc.says {
			if !strings.Contains(errs, s) {
				t.Errorf("lockd %q: stderr %q does not say %q", tc.args, errs, s)
			}
		}
	}
}

func TestVersion(t *testing.T) {
	for _, arg := range []string{"--version", "-version", "version"} {
		code, out, _ := lockd(arg)
		if code != 0 || !strings.HasPrefix(out, "lockd ") || !strings.Contains(out, runtime.Version()) {
			t.Errorf("lockd %s: exit %d, %q", arg, code, out)
		}
	}
}

// TestVersionOfABuiltBinary builds lockd as a release would and reads its
// version: the Go toolchain, and the commit when Go could stamp one.
func TestVersionOfABuiltBinary(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "lockd")
	if out, err := exec.Command("go", "build", "-buildvcs=auto", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		t.Fatal(err)
	}
	goVersion, err := exec.Command("go", "env", "GOVERSION").Output()
	if err != nil {
		t.Fatal(err)
	}
	text := string(out)
	if !strings.HasPrefix(text, "lockd ") || !strings.Contains(text, strings.TrimSpace(string(goVersion))+" ") {
		t.Fatalf("--version: %q", text)
	}
	if _, commit, stamped := strings.Cut(text, "\ncommit "); stamped {
		head, err := exec.Command("git", "rev-parse", "HEAD").Output()
		if err != nil {
			t.Fatalf("--version names a commit outside a git checkout: %q", text)
		}
		if !strings.HasPrefix(commit, strings.TrimSpace(string(head))) {
			t.Fatalf("--version names commit %q, HEAD is %s", commit, head)
		}
	}
}
