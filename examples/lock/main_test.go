package main

import (
	"context"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lockd/lockd/server"
)

// The example runs as it is against a real server, twice in a row.
func TestExampleRuns(t *testing.T) {
	srv, err := server.Start(server.Config{Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	for range 2 {
		var out strings.Builder
		if err := run(context.Background(), []string{srv.Addr()}, 10*time.Millisecond, &out); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out.String(), "holding examples/report with fencing token") || !strings.HasSuffix(out.String(), "done, released\n") {
			t.Fatalf("output %q", out.String())
		}
	}
}

// The built program takes an address list as lockctl does, --addr or
// LOCKD_ADDR, and moves past an address where nothing listens.
func TestExampleBinaryTakesAnAddressList(t *testing.T) {
	srv, err := server.Start(server.Config{Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	bin := filepath.Join(t.TempDir(), "lock")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	list := dead + "," + srv.Addr()
	for _, cmd := range []*exec.Cmd{exec.Command(bin, "--addr", list), exec.Command(bin)} {
		if len(cmd.Args) == 1 {
			cmd.Env = []string{"LOCKD_ADDR=" + list}
		}
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.HasSuffix(string(out), "done, released\n") {
			t.Fatalf("%q, environment %q: %v\n%s", cmd.Args, cmd.Env, err, out)
		}
	}
}
