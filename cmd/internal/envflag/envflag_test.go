package envflag

import (
	"flag"
	"io"
	"strings"
	"testing"
	"time"
)

func TestApply(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	keys := fs.Int("max-keys", 1, "")
	wait := fs.Duration("wait", 0, "")
	name := fs.String("name", "default", "")
	env := map[string]string{"LOCKD_MAX_KEYS": "9", "LOCKD_WAIT": "3s", "LOCKD_NAME": "from-env"}
	if err := Apply(fs, func(k string) (string, bool) { v, ok := env[k]; return v, ok }); err != nil {
		t.Fatal(err)
	}
	if err := fs.Parse([]string{"--name", "from-flag"}); err != nil {
		t.Fatal(err)
	}
	if *keys != 9 || *wait != 3*time.Second || *name != "from-flag" {
		t.Fatalf("keys %d wait %v name %q", *keys, *wait, *name)
	}
	bad := flag.NewFlagSet("t", flag.ContinueOnError)
	bad.Int("max-keys", 1, "")
	err := Apply(bad, func(k string) (string, bool) { return "many", k == "LOCKD_MAX_KEYS" })
	if err == nil || !strings.Contains(err.Error(), "LOCKD_MAX_KEYS") {
		t.Fatalf("a bad value must name its variable: %v", err)
	}
}

func TestPrintFlags(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.Int("max-keys", 1024, "hard limit of live `N`")
	fs.Duration("wait", 0, "how long to wait")
	fs.Bool("insecure-no-auth", false, "allow auth off")
	fs.String("listen", "127.0.0.1:7420", "client protocol address")
	var out strings.Builder
	PrintFlags(&out, fs)
	want := `  --insecure-no-auth
    	allow auth off (LOCKD_INSECURE_NO_AUTH)
  --listen string
    	client protocol address (LOCKD_LISTEN; default 127.0.0.1:7420)
  --max-keys N
    	hard limit of live N (LOCKD_MAX_KEYS; default 1024)
  --wait duration
    	how long to wait (LOCKD_WAIT)
`
	if out.String() != want {
		t.Fatalf("help:\n%s\nwant\n%s", out.String(), want)
	}
}

func TestDurationHintsAtUnits(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var lease time.Duration
	DurationVar(fs, &lease, "lease", 30*time.Second, "how long")
	if err := fs.Parse([]string{"--lease", "30"}); err == nil || !strings.Contains(err.Error(), "write 30s") {
		t.Fatalf("--lease 30: %v, want a hint to write 30s", err)
	}
	if err := fs.Parse([]string{"--lease", "soon"}); err == nil || !strings.Contains(err.Error(), "such as 30s") {
		t.Fatalf("--lease soon: %v, want an example", err)
	}
	if err := fs.Parse([]string{"--lease", "1m30s"}); err != nil || lease != 90*time.Second {
		t.Fatalf("--lease 1m30s: %v, %v", err, lease)
	}
	var out strings.Builder
	PrintFlags(&out, fs)
	if want := "  --lease duration\n    \thow long (LOCKD_LEASE; default 30s)\n"; out.String() != want {
		t.Fatalf("help %q, want %q", out.String(), want)
	}
}
