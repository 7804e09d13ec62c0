package lockd_test

import (
	"bufio"
	"crypto/sha256"
	"debug/buildinfo"
	"debug/elf"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/lockd/lockd/server"
	"github.com/lockd/lockd/server/servertest"
	"go.uber.org/goleak"
)

var lockdBinary struct {
	once sync.Once
	path string
	err  error
	out  []byte
}

// buildLockd builds cmd/lockd once for the tests of this file.
func buildLockd(t *testing.T) string {
	t.Helper()
	lockdBinary.once.Do(func() {
		dir, err := os.MkdirTemp("", "lockd-deploy-test")
		if err != nil {
			lockdBinary.err = err
			return
		}
		lockdBinary.path = filepath.Join(dir, "lockd")
		lockdBinary.out, lockdBinary.err = exec.Command("go", "build", "-o", lockdBinary.path, "./cmd/lockd").CombinedOutput()
	})
	if lockdBinary.err != nil {
		t.Fatalf("build lockd: %v\n%s", lockdBinary.err, lockdBinary.out)
	}
	return lockdBinary.path
}

func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(servertest.IgnoreGnetWorkers()...); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	if lockdBinary.path != "" {
		os.RemoveAll(filepath.Dir(lockdBinary.path))
	}
	os.Exit(code)
}

// serveFlags are the flags `lockd serve --help` lists.
func serveFlags(t *testing.T) map[string]bool {
	t.Helper()
	out, err := exec.Command(buildLockd(t), "serve", "--help").Output()
	if err != nil {
		t.Fatalf("lockd serve --help: %v", err)
	}
	flags := make(map[string]bool)
	for _, m := range regexp.MustCompile(`(?m)^  --([a-z-]+)`).FindAllStringSubmatch(string(out), -1) {
		flags[m[1]] = true
	}
	if len(flags) < 20 {
		t.Fatalf("lockd serve --help lists %d flags:\n%s", len(flags), out)
	}
	return flags
}

// flagOfEnv is the flag an environment variable LOCKD_<NAME> sets.
func flagOfEnv(name string) (string, bool) {
	rest, ok := strings.CutPrefix(name, "LOCKD_")
	return strings.ReplaceAll(strings.ToLower(rest), "_", "-"), ok
}

// goMinor is go.mod's language version as major.minor.
func goMinor(t *testing.T) string {
	t.Helper()
	mod, err := os.ReadFile("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(mod)
	if m == nil {
		t.Fatal("go.mod has no go directive")
	}
	return string(m[1])
}

// instruction is one Dockerfile instruction, continuation lines joined.
type instruction struct {
	stage int // index of the FROM it follows
	op    string
	args  string
}

func readDockerfile(t *testing.T) []instruction {
	t.Helper()
	text, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var out []instruction
	stage := -1
	var pending string
	for _, line := range strings.Split(string(text), "\n") {
		trimmed := strings.TrimSpace(line)
		if pending == "" && (trimmed == "" || strings.HasPrefix(trimmed, "#")) {
			continue
		}
		if body, more := strings.CutSuffix(trimmed, "\\"); more {
			pending += body + " "
			continue
		}
		full := pending + trimmed
		pending = ""
		op, args, _ := strings.Cut(full, " ")
		op = strings.ToUpper(op)
		if op == "FROM" {
			stage++
		}
		out = append(out, instruction{stage: stage, op: op, args: strings.TrimSpace(args)})
	}
	return out
}

// TestDockerfile checks what a build of the image relies on, since no
// container engine runs here: the builder's Go matches go.mod, the final
// stage is a static base run by a non-root user, every file it copies is
// built (static, trimmed) from a command that exists, the entrypoint is
// one of them, and every LOCKD_ variable it sets is a flag of lockd.
func TestDockerfile(t *testing.T) {
	ins := readDockerfile(t)
	last := ins[len(ins)-1].stage
	built := make(map[string]bool)    // files the build stage makes
	binaries := make(map[string]bool) // destinations of built binaries
	var user, entrypoint string
	env := make(map[string]string)
	buildOutput := regexp.MustCompile(`-o (\S+) (\./cmd/\S+)`)
	for _, in := range ins {
		switch {
		case in.op == "FROM" && in.stage == 0:
			if want := "golang:" + goMinor(t) + " AS build"; in.args != want {
				t.Errorf("builder stage FROM %q, want %q (go.mod's Go)", in.args, want)
			}
		case in.op == "FROM" && in.stage == last:
			if !strings.HasPrefix(in.args, "gcr.io/distroless/static") && in.args != "scratch" {
				t.Errorf("final stage FROM %q: want distroless static or scratch", in.args)
			}
		case in.op == "RUN" && strings.Contains(in.args, "go build"):
			if !strings.Contains(in.args, "CGO_ENABLED=0") || !strings.Contains(in.args, "-trimpath") {
				t.Errorf("RUN %s: want a static (CGO_ENABLED=0), -trimpath build", in.args)
			}
			m := buildOutput.FindStringSubmatch(in.args)
			if m == nil {
				t.Errorf("RUN %s: no -o OUTPUT ./cmd/NAME", in.args)
				continue
			}
			if main, err := os.ReadFile(filepath.Join(m[2], "main.go")); err != nil || !strings.Contains(string(main), "\npackage main\n") {
				t.Errorf("RUN %s: %s is not a command of this repository (%v)", in.args, m[2], err)
			}
			built[m[1]] = true
		case in.op == "RUN" && strings.HasPrefix(in.args, "mkdir "):
			for _, dir := range strings.Fields(in.args)[1:] {
				built[dir] = true
			}
		case in.op == "COPY" && in.stage == last:
			fields := strings.Fields(in.args)
			if len(fields) < 3 || fields[0] != "--from=build" {
				t.Errorf("final stage COPY %s: want only files from the build stage", in.args)
				continue
			}
			src, dst := fields[len(fields)-2], fields[len(fields)-1]
			if !built[src] {
				t.Errorf("COPY %s: the build stage does not make %s", in.args, src)
			}
			if strings.HasPrefix(src, "/out/lockd") {
				binaries[dst] = true
			}
		case in.op == "USER" && in.stage == last:
			user = in.args
		case in.op == "ENV" && in.stage == last:
			for _, kv := range strings.Fields(in.args) {
				name, value, _ := strings.Cut(kv, "=")
				env[name] = value
			}
		case in.op == "ENTRYPOINT":
			entrypoint = in.args
		}
	}
	if u, _, _ := strings.Cut(user, ":"); u == "" || u == "root" || u == "0" {
		t.Errorf("final stage USER %q: want a non-root user", user)
	}
	if m := regexp.MustCompile(`^\["([^"]+)"`).FindStringSubmatch(entrypoint); m == nil || !binaries[m[1]] {
		t.Errorf("ENTRYPOINT %s is not a binary the image copies in (%v)", entrypoint, binaries)
	}
	flags := serveFlags(t)
	for name := range env {
		if flag, ok := flagOfEnv(name); !ok || !flags[flag] {
			t.Errorf("ENV %s sets no flag of lockd serve", name)
		}
	}
	host, _, err := net.SplitHostPort(env["LOCKD_LISTEN"])
	if err != nil || host != "0.0.0.0" {
		t.Errorf("LOCKD_LISTEN=%q: a container's server listens on 0.0.0.0", env["LOCKD_LISTEN"])
	}
	if env["LOCKD_AUTH_FILE"] == "" || env["LOCKD_INSECURE_NO_AUTH"] != "" {
		t.Errorf("listening on every interface, the image must turn authentication on: %v", env)
	}
	if env["LOCKD_ADMIN_TOKEN_FILE"] == "" || env["LOCKD_INSECURE_ADMIN"] != "" {
		t.Errorf("its admin port on every interface, the image must require the admin token: %v", env)
	}
}

// TestImageSettingsFailClosed runs lockd with the image's environment:
// without the auth file mounted it exits 1 saying which file, and with
// authentication switched off it refuses the address; it listens on
// nothing in either case.
func TestImageSettingsFailClosed(t *testing.T) {
	bin := buildLockd(t)
	env := make(map[string]string)
	for _, in := range readDockerfile(t) {
		if in.op == "ENV" {
			for _, kv := range strings.Fields(in.args) {
				name, value, _ := strings.Cut(kv, "=")
				env[name] = value
			}
		}
	}
	// Ports and paths of this machine, not of a container.
	env["LOCKD_LISTEN"] = strings.Replace(env["LOCKD_LISTEN"], ":7420", ":0", 1)
	env["LOCKD_ADMIN"] = "127.0.0.1:0"
	env["LOCKD_DATA_DIR"] = t.TempDir()
	token := filepath.Join(t.TempDir(), "admin-token")
	if err := os.WriteFile(token, []byte("0123456789abcdef0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(t.TempDir(), "auth")
	for _, tc := range []struct {
		authFile, tokenFile string
		says                []string
	}{
		{missing, token, []string{"--auth-file", missing}},
		{"", token, []string{"--auth-file", "--insecure-no-auth"}},
		{"", missing, []string{"--admin-token-file", missing}},
	} {
		env["LOCKD_AUTH_FILE"], env["LOCKD_ADMIN_TOKEN_FILE"] = tc.authFile, tc.tokenFile
		cmd := exec.Command(bin, "serve")
		cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
		for name, value := range env {
			cmd.Env = append(cmd.Env, name+"="+value)
		}
		out, err := cmd.CombinedOutput()
		if exit, ok := err.(*exec.ExitError); !ok || exit.ExitCode() != 1 {
			t.Errorf("LOCKD_AUTH_FILE=%q: %v, want exit status 1\n%s", tc.authFile, err, out)
		}
		for _, s := range tc.says {
			if !strings.Contains(string(out), s) {
				t.Errorf("LOCKD_AUTH_FILE=%q: %q does not say %q", tc.authFile, out, s)
			}
		}
	}
}

// unitSettings reads a systemd unit as section.Key → values.
func unitSettings(t *testing.T, path string) map[string][]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	settings := make(map[string][]string)
	section := ""
	lines := bufio.NewScanner(f)
	for lines.Scan() {
		line := strings.TrimSpace(lines.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "["):
			section = strings.Trim(line, "[]")
		default:
			key, value, ok := strings.Cut(line, "=")
			if !ok {
				t.Fatalf("%s: %q is not KEY=VALUE", path, line)
			}
			settings[section+"."+key] = append(settings[section+"."+key], value)
		}
	}
	return settings
}

const unitFile = "deploy/lockd.service"

// TestSystemdUnit checks the example unit's hardening and that what it
// passes to lockd is what lockd accepts.
func TestSystemdUnit(t *testing.T) {
	u := unitSettings(t, unitFile)
	one := func(key string) string {
		if v := u["Service."+key]; len(v) == 1 {
			return v[0]
		}
		t.Errorf("%s: want exactly one %s=, have %q", unitFile, key, u["Service."+key])
		return ""
	}
	for key, want := range map[string]string{
		"DynamicUser":     "yes",
		"NoNewPrivileges": "yes",
		"ProtectSystem":   "strict",
		"Restart":         "on-failure",
		"StateDirectory":  "lockd",
	} {
		if got := one(key); got != want {
			t.Errorf("%s: %s=%s, want %s", unitFile, key, got, want)
		}
	}
	if n, err := strconv.Atoi(one("LimitNOFILE")); err != nil || n <= server.DefaultMaxConns {
		t.Errorf("%s: LimitNOFILE must exceed the default --max-conns %d", unitFile, server.DefaultMaxConns)
	}
	execStart := strings.Fields(one("ExecStart"))
	if len(execStart) < 2 || execStart[0] != "/usr/local/bin/lockd" || execStart[1] != "serve" {
		t.Fatalf("%s: ExecStart %q, want /usr/local/bin/lockd serve", unitFile, execStart)
	}
	flags := serveFlags(t)
	given := make(map[string]bool)
	for _, arg := range execStart[2:] {
		if name, ok := strings.CutPrefix(arg, "--"); ok {
			if !flags[name] {
				t.Errorf("%s: ExecStart passes --%s, which lockd serve does not have", unitFile, name)
			}
			given[name] = true
		}
	}
	env := make(map[string]string)
	for _, line := range u["Service.Environment"] {
		for _, kv := range strings.Fields(line) {
			name, value, _ := strings.Cut(kv, "=")
			if flag, ok := flagOfEnv(name); !ok || !flags[flag] {
				t.Errorf("%s: Environment %s sets no flag of lockd serve", unitFile, name)
			}
			env[name] = value
		}
	}
	if host, _, _ := net.SplitHostPort(env["LOCKD_LISTEN"]); host != "127.0.0.1" && !given["auth-file"] {
		t.Errorf("%s: listening on %q needs --auth-file", unitFile, env["LOCKD_LISTEN"])
	}
}

// TestSystemdAnalyze has systemd verify the unit and rate its exposure
// (with ExecStart pointed at a built lockd, since verify wants the
// binary to exist).
func TestSystemdAnalyze(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze is not installed (Debian: apt-get install systemd); TestSystemdUnit checked the unit's structure")
	}
	unit, err := os.ReadFile(unitFile)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "lockd.service")
	if err := os.WriteFile(path, []byte(strings.ReplaceAll(string(unit), "/usr/local/bin/lockd", buildLockd(t))), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(analyze, "verify", "--man=no", path).CombinedOutput(); err != nil || len(out) != 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
	// Exposure is rated 0..10; the threshold is in tenths. 2.0 is "OK".
	if out, err := exec.Command(analyze, "security", "--offline=yes", "--threshold=20", path).CombinedOutput(); err != nil {
		t.Errorf("systemd-analyze security rates the unit above 2.0: %v\n%s", err, out)
	}
}

// TestMakeDist runs `make dist` for one command and platform (the full
// matrix is a CI step) and checks what it promises: a static, trimmed
// binary for the asked platform, and its checksum in SHA256SUMS.
func TestMakeDist(t *testing.T) {
	dist := filepath.Join(t.TempDir(), "dist")
	cmd := exec.Command("make", "dist", "DIST="+dist, "DIST_PLATFORMS=linux/arm64", "DIST_COMMANDS=lockctl")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make dist: %v\n%s", err, out)
	}
	bin := filepath.Join(dist, "lockctl-linux-arm64")
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Machine != elf.EM_AARCH64 {
		t.Errorf("%s is for %v", bin, f.Machine)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("%s is dynamically linked (%v)", bin, p.Type)
		}
	}
	info, err := buildinfo.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	settings := make(map[string]string)
	for _, s := range info.Settings {
		settings[s.Key] = s.Value
	}
	if settings["CGO_ENABLED"] != "0" || settings["-trimpath"] != "true" || settings["GOOS"] != "linux" || settings["GOARCH"] != "arm64" {
		t.Errorf("%s built with %v", bin, settings)
	}
	sums, err := os.ReadFile(filepath.Join(dist, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	content, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(content)
	if want := hex.EncodeToString(sum[:]) + "  lockctl-linux-arm64\n"; string(sums) != want {
		t.Errorf("SHA256SUMS %q, want %q", sums, want)
	}
}
