package version

import (
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
	for _, tc := range []struct {
		name string
		info *debug.BuildInfo
		ok   bool
		want string
	}{
		{"release with commit", stamped, true,
			"lockd v0.1.0\ncommit 5e9c6d2b0f5e5b1c3a0e6f1d2c3b4a5968778695 2026-12-03T12:03:00Z (modified)\ngo1.26.8 linux/arm64\n"},
		{"go install, no VCS", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v0.1.0"}}, true,
			"lockd v0.1.0\ngo1.26.8 linux/arm64\n"},
		{"development build", &debug.BuildInfo{GoVersion: "go1.26.8"}, true,
			"lockd (devel)\ngo1.26.8 linux/arm64\n"},
		{"no build information", nil, false,
			"lockd (no build information)\n" + runtime.Version() + " linux/arm64\n"},
	} {
		if got := Format("lockd", tc.info, tc.ok, "linux/arm64"); got != tc.want {
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
