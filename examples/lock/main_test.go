package main

import (
	"context"
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
		if err := run(context.Background(), srv.Addr(), 10*time.Millisecond, &out); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out.String(), "holding examples/report with fencing token") || !strings.HasSuffix(out.String(), "done, released\n") {
			t.Fatalf("output %q", out.String())
		}
	}
}
