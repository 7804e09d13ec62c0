// Package pgtest runs a throwaway PostgreSQL server for tests: Debian's
// postgresql binaries, a fresh data directory under the system temporary
// directory, 127.0.0.1 on a free port, trust authentication, removed at
// the end of the test. PostgreSQL refuses to run as root, so when the test
// runs as root the server runs as the postgres system user.
//
// Where PostgreSQL is not installed a test fails when CI is set (a CI run
// must never count a skipped database test as passed) and is skipped,
// saying why, elsewhere.
package pgtest

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
)

// Server is one running PostgreSQL.
type Server struct {
	// Host and Port are where it listens (TCP only).
	Host string
	Port int
	// User and Database are the superuser and database to connect as.
	User, Database string
	// BinDir holds the server's client programs (psql).
	BinDir string
}

// DSN is a connection string for the pgx driver and for psql.
func (s *Server) DSN() string {
	return fmt.Sprintf("postgres://%s@%s:%d/%s?sslmode=disable", s.User, s.Host, s.Port, s.Database)
}

// Env is the libpq environment (PGHOST, PGPORT, PGUSER, PGDATABASE) that
// points psql at the server.
func (s *Server) Env() []string {
	return []string{"PGHOST=" + s.Host, "PGPORT=" + strconv.Itoa(s.Port), "PGUSER=" + s.User, "PGDATABASE=" + s.Database}
}

// Open connects through database/sql and closes the pool at the end of
// the test.
func (s *Server) Open(t testing.TB) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", s.DSN())
	if err != nil {
		t.Fatalf("pgtest: open: %v", err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// Start initialises a data directory and starts PostgreSQL, stopped and
// removed at the end of the test. Durability is off (fsync,
// synchronous_commit): the tests measure round trips, not disks.
func Start(t testing.TB) *Server {
	t.Helper()
	bin := binDir(t, installed)
	dir, err := os.MkdirTemp("", "lockd-pgtest-")
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	cred := credential(t, dir)

	data := filepath.Join(dir, "data")
	initdb := exec.Command(filepath.Join(bin, "initdb"), "--no-sync", "--auth=trust", "--username=postgres",
		"--encoding=UTF8", "--locale=C", "-D", data)
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		t.Fatalf("pgtest: initdb: %v\n%s", err, out)
	}

	port := freePort(t)
	logPath := filepath.Join(dir, "postgres.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	defer logFile.Close()
	srv := exec.Command(filepath.Join(bin, "postgres"), "-D", data, "-h", "127.0.0.1", "-p", strconv.Itoa(port),
		"-k", dir, "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
		"-c", "max_connections=50", "-c", "shared_buffers=16MB")
	// SIGQUIT, PostgreSQL's immediate shutdown, if the test process dies
	// without its cleanup (a test timeout): no server outlives its test.
	srv.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGQUIT}
	srv.Stdout, srv.Stderr = logFile, logFile
	if err := srv.Start(); err != nil {
		t.Fatalf("pgtest: start postgres: %v", err)
	}
	exited := make(chan struct{})
	go func() { _ = srv.Wait(); close(exited) }()
	t.Cleanup(func() {
		// SIGINT is PostgreSQL's fast shutdown: sessions are ended, not awaited.
		_ = srv.Process.Signal(syscall.SIGINT)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = srv.Process.Kill()
			<-exited
		}
	})

	s := &Server{Host: "127.0.0.1", Port: port, User: "postgres", Database: "postgres", BinDir: bin}
	if err := s.waitReady(exited); err != nil {
		b, _ := os.ReadFile(logPath)
		t.Fatalf("pgtest: %v\n%s", err, b)
	}
	return s
}

// waitReady pings the server until it answers, it exits, or 30 s pass.
func (s *Server) waitReady(exited <-chan struct{}) error {
	db, err := sql.Open("pgx", s.DSN())
	if err != nil {
		return err
	}
	defer db.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err = db.PingContext(ctx)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("postgres exited before accepting connections")
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("postgres did not accept connections within 30 s: %w", err)
		}
	}
}

// installed is where Debian's postgresql packages put initdb.
const installed = "/usr/lib/postgresql/*/bin/initdb"

// binDir finds the directory of the newest initdb matching pattern that
// has postgres beside it, or ends the test: failed in CI, skipped
// elsewhere.
func binDir(t testing.TB, pattern string) string {
	t.Helper()
	found, _ := filepath.Glob(pattern)
	slices.SortFunc(found, func(a, b string) int { return version(b) - version(a) })
	for _, initdb := range found {
		dir := filepath.Dir(initdb)
		if _, err := os.Stat(filepath.Join(dir, "postgres")); err == nil {
			return dir
		}
	}
	msg := "PostgreSQL is not installed (no " + pattern + "): apt-get install postgresql"
	if os.Getenv("CI") != "" {
		t.Fatal(msg + " — CI is set, so this test fails instead of skipping")
	}
	t.Skip(msg)
	return ""
}

// version is the major version in /usr/lib/postgresql/N/bin/initdb.
func version(initdb string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(initdb))))
	return n
}

// credential is the postgres system user when running as root (the
// directory is handed to it), else nil: the server runs as the test.
func credential(t testing.TB, dir string) *syscall.Credential {
	t.Helper()
	if os.Geteuid() != 0 {
		return nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		t.Fatalf("pgtest: running as root, PostgreSQL needs an unprivileged user: %v", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if err := os.Chown(dir, uid, gid); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
}

// freePort is a port of 127.0.0.1 that was free a moment ago.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
