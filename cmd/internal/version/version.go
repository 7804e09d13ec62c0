// Package version describes how a lockd binary was built, for the
// commands' --version: the version and commit, and the Go toolchain.
// They come from what the build stamped with -ldflags (make build, make
// dist and the Dockerfile do, from git, so a build without VCS stamping —
// a Docker context without .git, GOFLAGS=-buildvcs=false — still names
// them), or else from the build information the Go linker embeds.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
)

// Set by the build: -ldflags "-X github.com/lockd/lockd/cmd/internal/version.version=v1.2.3
// -X github.com/lockd/lockd/cmd/internal/version.revision=COMMIT".
var version, revision string

// Stamp is what a build stamped with -ldflags; empty fields were not.
type Stamp struct{ Version, Revision string }

// String is the --version text of program.
func String(program string) string {
	info, ok := debug.ReadBuildInfo()
	return Format(program, Stamp{Version: version, Revision: revision}, info, ok, runtime.GOOS+"/"+runtime.GOARCH)
}

// Format is String for a given stamp, build information (ok false when
// the binary has none) and platform. The stamp wins over the build
// information.
func Format(program string, stamp Stamp, info *debug.BuildInfo, ok bool, platform string) string {
	var b strings.Builder
	settings := make(map[string]string)
	v, goVersion := stamp.Version, runtime.Version()
	if ok {
		for _, s := range info.Settings {
			settings[s.Key] = s.Value
		}
		goVersion = info.GoVersion
		if v == "" && info.Main.Version != "" && info.Main.Version != "(devel)" {
			v = info.Main.Version
		}
	}
	rev := stamp.Revision
	if rev == "" {
		rev = settings["vcs.revision"]
	}
	switch {
	case v != "":
		fmt.Fprintf(&b, "%s %s\n", program, v)
	case !ok:
		fmt.Fprintf(&b, "%s (no build information)\n", program)
	case rev == "":
		fmt.Fprintf(&b, "%s (devel; built without a version: make build, make dist and the Dockerfile stamp one)\n", program)
	default:
		fmt.Fprintf(&b, "%s (devel)\n", program)
	}
	if rev != "" {
		fmt.Fprintf(&b, "commit %s", rev)
		if stamp.Revision == "" {
			if at := settings["vcs.time"]; at != "" {
				fmt.Fprintf(&b, " %s", at)
			}
			if settings["vcs.modified"] == "true" {
				b.WriteString(" (modified)")
			}
		}
		b.WriteByte('\n')
	}
	fmt.Fprintf(&b, "%s %s\n", goVersion, platform)
	return b.String()
}
