package version

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

func TestFormat(t *testing.T) {
	stamped := &debug.BuildInfo{
		GoVersion: "go1.26.8",
		Main:      debug.Module{Path: "github.com/lockd/lockd", Version: "v0.1.0"},
		Settings: []debug.BuildSetting{
			{Key: "CGO_ENABLED", Value: "0"},
			{Key: "vcs.revision", Value: "5e9c6d2b0f5e5b1c3a0e6f1d2c3b4a5968778695"},
			{Key: "vcs.time", Value: "2026-12-03T12:03:00Z"},
			{Key: "vcs.modified", Value: "true"},
		},
	}
	devel := &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}}
	for _, tc := range []struct {
		name  string
		stamp Stamp
		info  *debug.BuildInfo
		ok    bool
		want  string
	}{
		{"release with commit", Stamp{}, stamped, true,
			"lockd v0.1.0\ncommit 5e9c6d2b0f5e5b1c3a0e6f1d2c3b4a5968778695 2026-12-03T12:03:00Z (modified)\ngo1.26.8 linux/arm64\n"},
		{"go install, no VCS", Stamp{}, &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v0.1.0"}}, true,
			"lockd v0.1.0\ngo1.26.8 linux/arm64\n"},
		{"development build, VCS stamped", Stamp{}, &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc"}}}, true,
			"lockd (devel)\ncommit abc\ngo1.26.8 linux/arm64\n"},
		{"nothing stamped (-buildvcs=false, no .git)", Stamp{}, devel, true,
			"lockd (devel; built without a version: make build, make dist and the Dockerfile stamp one)\ngo1.26.8 linux/arm64\n"},
		{"ldflags without VCS", Stamp{Version: "v0.2.0-3-gabc", Revision: "abcdef"}, devel, true,
			"lockd v0.2.0-3-gabc\ncommit abcdef\ngo1.26.8 linux/arm64\n"},
		{"ldflags win over VCS", Stamp{Version: "v0.2.0", Revision: "abcdef"}, stamped, true,
			"lockd v0.2.0\ncommit abcdef\ngo1.26.8 linux/arm64\n"},
		{"no build information", Stamp{}, nil, false,
			"lockd (no build information)\n" + runtime.Version() + " linux/arm64\n"},
	} {
		if got := Format("lockd", tc.stamp, tc.info, tc.ok, "linux/arm64"); got != tc.want {
			t.Errorf("%s:\n%s\nwant\n%s", tc.name, got, tc.want)
		}
	}
}

// TestStringDescribesThisBinary reads the test binary's own build
// information, which the Go toolchain always embeds.
func TestStringDescribesThisBinary(t *testing.T) {
	got := String("lockctl")
	if !strings.HasPrefix(got, "lockctl ") || !strings.Contains(got, runtime.Version()+" "+runtime.GOOS+"/"+runtime.GOARCH) {
		t.Fatalf("version text %q", got)
	}
}

const versionPkg = "github.com/lockd/lockd/cmd/internal/version"

// Every build path of the repository stamps the version and commit with
// -ldflags, so that --version is right without VCS stamping: make build
// and make dist under GOFLAGS=-buildvcs=false, and the Dockerfile, whose
// context has no .git.
func TestEveryBuildPathStampsTheVersion(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make is not installed")
	}
	for _, target := range []string{"build", "dist"} {
		cmd := exec.Command("make", "-n", target, "VERSION=v9.9.9", "REVISION=feedface")
		cmd.Dir = "../../.."
		cmd.Env = append(os.Environ(), "GOFLAGS=-buildvcs=false")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("make -n %s: %v\n%s", target, err, out)
		}
		builds := 0
		for _, line := range strings.Split(string(out), "\n") {
			if !strings.Contains(line, " build ") {
				continue
			}
			builds++
			if !strings.Contains(line, "-X "+versionPkg+".version=v9.9.9") || !strings.Contains(line, "-X "+versionPkg+".revision=feedface") {
				t.Errorf("make %s builds without stamping the version: %s", target, line)
			}
		}
		if builds == 0 {
			t.Errorf("make -n %s shows no go build:\n%s", target, out)
		}
	}
	dockerfile, err := os.ReadFile("../../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"ARG VERSION", "ARG REVISION", "-X " + versionPkg + ".version=${VERSION}", "-X " + versionPkg + ".revision=${REVISION}"} {
		if !strings.Contains(string(dockerfile), want) {
			t.Errorf("the Dockerfile does not contain %q", want)
		}
	}
}

// A binary built without VCS stamping but with the ldflags names its
// version and commit.
func TestStampedBinaryWithoutVCS(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "lockd")
	cmd := exec.Command("go", "build", "-ldflags", "-X "+versionPkg+".version=v9.9.9 -X "+versionPkg+".revision=feedface", "-o", bin, "../../lockd")
	cmd.Env = append(os.Environ(), "GOFLAGS=-buildvcs=false")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(out), "lockd v9.9.9\ncommit feedface\n") {
		t.Fatalf("--version: %q", out)
	}
}
