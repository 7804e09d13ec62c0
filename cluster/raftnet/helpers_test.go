package raftnet

import (
	"bytes"
	"crypto/tls"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/lockd/lockd/internal/testcerts"
	"github.com/lockd/lockd/server/servertest"
	"go.uber.org/goleak"
)

// TestMain checks that closed transports leave no goroutines behind.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, servertest.IgnoreGnetWorkers()...)
}

// raftListeners binds n loopback Raft ports for transports, which take
// the listeners over (Factory.Listener).
func raftListeners(t testing.TB, n int) []net.Listener {
	t.Helper()
	ls := make([]net.Listener, n)
	for i := range ls {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls[i] = l
	}
	return ls
}

func waitUntil(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// raftTLSFor writes a node certificate for 127.0.0.1 signed by ca and
// loads it as LoadTLS does from the flags.
func raftTLSFor(t *testing.T, ca *testcerts.CA, name string) *tls.Config {
	t.Helper()
	f := ca.WriteFiles(t, t.TempDir(), name, "127.0.0.1")
	cfg, err := LoadTLS(f.Cert, f.Key, f.CA)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// logWatch is a log destination that closes seen once a line contains
// want.
type logWatch struct {
	want []byte
	seen chan struct{}
	once sync.Once
}

func watchLog(want string) *logWatch {
	return &logWatch{want: []byte(want), seen: make(chan struct{})}
}

func (w *logWatch) Write(p []byte) (int, error) {
	if bytes.Contains(p, w.want) {
		w.once.Do(func() { close(w.seen) })
	}
	return len(p), nil
}

func (w *logWatch) wait(t *testing.T, what string) {
	t.Helper()
	select {
	case <-w.seen:
	case <-time.After(20 * time.Second):
		t.Fatalf("no log line says %s (%q) in 20 s", what, w.want)
	}
}

const refusedLog = "raft transport: TLS handshake refused"
