package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lockd/lockd/bench"
	"github.com/lockd/lockd/engine"
	"github.com/lockd/lockd/internal/testcerts"
	"github.com/lockd/lockd/server"
)

// With the --tls flags lockbench drives a mutual-TLS port, through the
// client and in bare frames, and says so in each run's transport.
func TestTLSFlags(t *testing.T) {
	ca := testcerts.NewCA(t, "lockd test CA")
	dir := t.TempDir()
	srvFiles := ca.WriteFiles(t, dir, "server", "127.0.0.1")
	tlsCfg, err := server.LoadTLSConfig(srvFiles.Cert, srvFiles.Key, srvFiles.CA)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.Start(server.Config{Listen: "127.0.0.1:0", TLSListen: "127.0.0.1:0", TLS: tlsCfg, Engine: engine.Config{}})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	f := ca.WriteFiles(t, dir, "client", "client")
	for _, raw := range []bool{false, true} {
		jsonPath := filepath.Join(dir, "out.json")
		args := []string{"--target", "lockd://" + srv.TLSAddr(), "--workload", "uncontended", "--duration", "300ms",
			"--progress", "0", "--callers", "4", "--json", jsonPath, "--check",
			"--tls-ca", f.CA, "--tls-cert", f.Cert, "--tls-key", f.Key}
		if raw {
			args = append(args, "--raw")
		}
		stdout, stderr, err := runCommand(t, args...)
		if err != nil {
			t.Fatalf("raw %v: %v\nstdout:\n%s\nstderr:\n%s", raw, err, stdout, stderr)
		}
		data, err := os.ReadFile(jsonPath)
		if err != nil {
			t.Fatal(err)
		}
		var rep bench.Report
		if err := json.Unmarshal(data, &rep); err != nil {
			t.Fatal(err)
		}
		if len(rep.Runs) != 1 || rep.Runs[0].Cycles == 0 || !strings.Contains(rep.Runs[0].Transport, "TLS") {
			t.Fatalf("raw %v: runs %+v", raw, rep.Runs)
		}
	}
	// Without a client certificate the port refuses lockbench.
	if _, _, err := runCommand(t, "--target", "lockd://"+srv.TLSAddr(), "--workload", "uncontended", "--duration", "300ms",
		"--progress", "0", "--callers", "1", "--tls-ca", f.CA); err == nil {
		t.Fatal("lockbench without a client certificate ran against a mutual-TLS port")
	}
}
