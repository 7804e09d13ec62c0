package server

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/lockd/lockd/codec"
	"github.com/lockd/lockd/engine"
	"github.com/lockd/lockd/engine/tokenfile"
	"github.com/rs/zerolog"
)

// A restarted single-mode server hands out only tokens above every token
// of the process before it, held locks included, and /metrics shows the
// mark that makes it so.
func TestTokensGrowAcrossServerRestarts(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "lockd.data")
	var highest uint64
	for restart := range 3 {
		s := startServer(t, func(cfg *Config) { cfg.DataDir = dir; cfg.Admin = "127.0.0.1:0" })
		c := dial(t, s)
		for i := range 5 {
			token := c.mustAcquire(uint64(i+1), "k1")
			if token <= highest {
				t.Fatalf("restart %d: token %d, want above %d", restart, token, highest)
			}
			highest = token
			c.send(codec.AppendRelease(nil, 100, token, "k1"))
			c.expect(codec.OpReleased, 100)
		}
		held := c.mustAcquire(10, "k1")
		if held <= highest {
			t.Fatalf("restart %d: token %d, want above %d", restart, held, highest)
		}
		highest = held
		_, metrics := scrape(t, "http://"+s.AdminAddr()+"/metrics")
		if got := metricValue(t, metrics, "lockd_token_highest_issued"); got != held {
			t.Fatalf("lockd_token_highest_issued %d, want the last token %d", got, held)
		}
		if mark := metricValue(t, metrics, "lockd_token_mark"); mark <= held {
			t.Fatalf("lockd_token_mark %d is not above the issued token %d", mark, held)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// recordedMark reads the token mark a stopped server left in dir.
func recordedMark(t *testing.T, dir string) uint64 {
	t.Helper()
	mark, err := tokenfile.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer mark.Close()
	return mark.Reserved()
}

func TestFirstTokenBelowTheMarkIsRefused(t *testing.T) {
	dir := t.TempDir()
	s := startServer(t, func(cfg *Config) { cfg.DataDir = dir })
	s.Close()
	recorded := recordedMark(t, dir)
	_, err := Start(Config{Listen: "127.0.0.1:0", DataDir: dir, Engine: engine.Config{FirstToken: recorded - 1}})
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("--first-token %d is below the token mark %d", recorded-1, recorded)) ||
		!strings.Contains(err.Error(), filepath.Join(dir, tokenfile.Name)) {
		t.Fatalf("a first token below the mark: %v", err)
	}
	if recordedMark(t, dir) != recorded {
		t.Fatal("a refused start moved the mark")
	}
	for _, above := range []uint64{0, 1000} {
		first := recordedMark(t, dir) + above
		s := startServer(t, func(cfg *Config) { cfg.DataDir = dir; cfg.Engine.FirstToken = first })
		if got := dial(t, s).mustAcquire(1, "k"); got != first {
			t.Fatalf("--first-token %d, %d above the mark: first token %d", first, above, got)
		}
		s.Close()
	}
}

// A data dir the mark cannot be recorded in stops the start, before any
// client is served.
func TestUnwritableDataDirStopsTheStart(t *testing.T) {
	dir := t.TempDir()
	// Where the next mark is written first: a directory, whoever we are.
	if err := os.Mkdir(filepath.Join(dir, tokenfile.Name+".tmp"), 0o755); err != nil {
		t.Fatal(err)
	}
	_, err := Start(Config{Listen: "127.0.0.1:0", DataDir: dir})
	if err == nil || !strings.Contains(err.Error(), "cannot record the mark in "+filepath.Join(dir, tokenfile.Name)) {
		t.Fatalf("start on an unwritable data dir: %v", err)
	}
	// It let go of the data dir.
	mark, err := tokenfile.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	mark.Close()
}

// syncBuffer is a log sink that tests read while the server writes.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// While the mark cannot be recorded, grants go on from the tokens already
// reserved, then acquires are answered B — never given an unrecorded
// token. The failure is logged and counted, and grants resume once a
// retry records the mark.
func TestUnrecordableMarkWhileServingAnswersBusy(t *testing.T) {
	dir := t.TempDir()
	var log syncBuffer
	s := startServer(t, func(cfg *Config) {
		cfg.DataDir, cfg.Admin, cfg.Logger = dir, "127.0.0.1:0", zerolog.New(&log)
		cfg.Engine.TokenBlock = 8 // tokens 1..8 are reserved at start
	})
	// Where the next mark is written first: a directory, whoever we are.
	blocker := filepath.Join(dir, tokenfile.Name+".tmp")
	if err := os.Mkdir(blocker, 0o755); err != nil {
		t.Fatal(err)
	}
	c := dial(t, s)
	var owner uint64
	cycle := func() codec.Response {
		owner++
		c.acquire(owner, 30, 0, "k")
		r := c.recv()
		if r.Op == codec.OpAcquired {
			owner++
			c.send(codec.AppendRelease(nil, owner, r.Token, "k"))
			c.expect(codec.OpReleased, owner)
		}
		return r
	}
	for want := uint64(1); want <= 8; want++ {
		if r := cycle(); r.Op != codec.OpAcquired || r.Token != want {
			t.Fatalf("got %q token %d, want token %d", r.Op, r.Token, want)
		}
	}
	if r := cycle(); r.Op != codec.OpBusy {
		t.Fatalf("past the reserved tokens: %q token %d, want B", r.Op, r.Token)
	}
	waitFor(t, func() bool {
		return strings.Contains(log.String(), "cannot reserve fencing tokens") && strings.Contains(log.String(), filepath.Join(dir, tokenfile.Name))
	})
	_, metrics := scrape(t, "http://"+s.AdminAddr()+"/metrics")
	if busy, failures := metricValue(t, metrics, "lockd_token_reserve_busy_total"), metricValue(t, metrics, "lockd_token_reserve_failures_total"); busy != 1 || failures < 1 {
		t.Fatalf("lockd_token_reserve_busy_total %d, lockd_token_reserve_failures_total %d", busy, failures)
	}

	if err := os.Remove(blocker); err != nil {
		t.Fatal(err)
	}
	var resumed codec.Response
	waitFor(t, func() bool { resumed = cycle(); return resumed.Op == codec.OpAcquired })
	if resumed.Token != 9 {
		t.Fatalf("the first token after the retry is %d, want 9", resumed.Token)
	}
}
