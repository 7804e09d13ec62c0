// Package version describes how a lockd binary was built, for the
// commands' --version: the module version, the commit and whether the
// tree was modified, and the Go toolchain — all from the build information
// the Go linker embeds, so no build step has to stamp anything.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
)

// String is the --version text of program.
func String(program string) string {
	info, ok := debug.ReadBuildInfo()
	return Format(program, info, ok, runtime.GOOS+"/"+runtime.GOARCH)
}

// Format is String for given build information (ok false when the binary
// has none) and platform.
func Format(program string, info *debug.BuildInfo, ok bool, platform string) string {
	var b strings.Builder
	if !ok {
		fmt.Fprintf(&b, "%s (no build information)\n%s %s\n", program, runtime.Version(), platform)
		return b.String()
	}
	version := info.Main.Version
	if version == "" {
		version = "(devel)"
	}
	fmt.Fprintf(&b, "%s %s\n", program, version)
	settings := make(map[string]string)
	for _, s := range info.Settings {
		settings[s.Key] = s.Value
	}
	if rev := settings["vcs.revision"]; rev != "" {
		fmt.Fprintf(&b, "commit %s", rev)
		if at := settings["vcs.time"]; at != "" {
			fmt.Fprintf(&b, " %s", at)
		}
		if settings["vcs.modified"] == "true" {
			b.WriteString(" (modified)")
		}
		b.WriteByte('\n')
	}
	fmt.Fprintf(&b, "%s %s\n", info.GoVersion, platform)
	return b.String()
}
