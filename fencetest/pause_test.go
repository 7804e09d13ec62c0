package fencetest

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/lockd/lockd/client/fence"
	"github.com/lockd/lockd/internal/pgtest"
)

// The lease of the holder that is paused: short, so that the test waits
// little for it to lapse.
const pausedLease = 2 * time.Second

// guarded starts PostgreSQL with the fences table and guarded(id, writer),
// whose row 1 every holder's write sets to its token.
func guarded(t *testing.T) (*pgtest.Server, *sql.DB) {
	t.Helper()
	pg := pgtest.Start(t)
	db := pg.Open(t)
	if err := fence.NewSQL(db, fence.Postgres).Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE guarded (id integer PRIMARY KEY, writer bigint NOT NULL); INSERT INTO guarded VALUES (1, 0)`); err != nil {
		t.Fatal(err)
	}
	return pg, db
}

// row is (guarded row 1's writer, the key's mark).
func row(t *testing.T, db *sql.DB, key string) (writer, mark uint64) {
	t.Helper()
	if err := db.QueryRow(`SELECT writer, (SELECT token FROM lockd_fences WHERE key = $1) FROM guarded WHERE id = 1`, key).Scan(&writer, &mark); err != nil {
		t.Fatal(err)
	}
	return writer, mark
}

// pause plays the pause: holder A is granted key with a 2 s lease and
// stopped before its write; between runs (a leader change, in cluster
// mode); holder B is granted key once A's lease lapsed, with a larger
// token, and writes; A is resumed and writes. It returns both tokens and
// A's outcome line.
func pause(t *testing.T, addrs []string, key, target string, between func()) (tokenA, tokenB uint64, outcomeA string) {
	t.Helper()
	a := startHolder(t, "A", addrs, key, pausedLease, target, true)
	tokenA = a.token(t, 20*time.Second)
	a.signal(t, syscall.SIGSTOP)
	between()
	b := startHolder(t, "B", addrs, key, 10*time.Second, target, false)
	tokenB = b.token(t, 40*time.Second)
	if tokenB <= tokenA {
		t.Fatalf("B was granted token %d after A's %d; tokens must grow", tokenB, tokenA)
	}
	if got := b.next(t, 10*time.Second); got != "wrote" {
		t.Fatalf("B's write: %q", got)
	}
	a.resume(t)
	return tokenA, tokenB, a.next(t, 10*time.Second)
}

func noLeaderChange() {}

// checkRefused asserts A's outcome and that the row is B's.
func checkRefused(t *testing.T, db *sql.DB, key string, tokenA, tokenB uint64, outcomeA, want string) {
	t.Helper()
	if outcomeA != want {
		t.Errorf("A (token %d) resumed after B (token %d) wrote: %q; want %q", tokenA, tokenB, outcomeA, want)
	}
	if writer, mark := row(t, db, key); writer != tokenB || mark != tokenB {
		t.Errorf("after A's refused write: writer %d, mark %d; want B's token %d for both", writer, mark, tokenB)
	}
}

// A paused past its lease writes through fence.SQL after B: its
// transaction fails with ErrStale, carrying B's token.
func TestPauseSQL(t *testing.T) {
	pg, db := guarded(t)
	addr := startSingle(t)
	a, b, outcome := pause(t, []string{addr}, "pause/sql", "sql:"+pg.DSN(), noLeaderChange)
	checkRefused(t, db, "pause/sql", a, b, outcome, fmt.Sprint("stale ", b))
}

// The same, across a leader change: the leader that granted A is killed
// (kill -9) while A is paused, and a new leader grants B.
func TestPauseSQLLeaderChange(t *testing.T) {
	pg, db := guarded(t)
	nodes := startCluster(t)
	var addrs []string
	for _, n := range nodes {
		addrs = append(addrs, n.listen)
	}
	var first, second *lockd
	a, b, outcome := pause(t, addrs, "pause/cluster", "sql:"+pg.DSN(), func() {
		first = leader(t, nodes)
		first.kill()
		second = leader(t, nodes)
	})
	if second == first {
		t.Fatalf("the leader did not change: node %d", first.id)
	}
	checkRefused(t, db, "pause/cluster", a, b, outcome, fmt.Sprint("stale ", b))
}

// guardedHandler sets guarded row 1's writer to the request's token; it
// runs behind fence.Handler, which has validated the token.
func guardedHandler(db *sql.DB) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, _ := strconv.ParseUint(r.Header.Get(fence.HeaderToken), 10, 64)
		if _, err := db.ExecContext(r.Context(), `UPDATE guarded SET writer = $1 WHERE id = 1`, int64(token)); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
}

// A paused past its lease PUTs to a service behind fence.Handler over
// fence.SQL after B: 409 Conflict, and the row is B's.
func TestPauseHTTP(t *testing.T) {
	_, db := guarded(t)
	addr := startSingle(t)
	srv := httptest.NewServer(fence.Handler(fence.NewSQL(db, fence.Postgres), guardedHandler(db)))
	defer srv.Close()
	a, b, outcome := pause(t, []string{addr}, "pause/http", "http:"+srv.URL+"/guarded/1", noLeaderChange)
	checkRefused(t, db, "pause/http", a, b, outcome, "refused 409 lockd fence: stale token: a newer lock holder came first")
}

// The same with the service in Python: lockd.fence's WSGI middleware over
// its SQL store on psycopg.
func TestPauseHTTPPython(t *testing.T) {
	pg, db := guarded(t)
	addr := startSingle(t)
	url := startPythonBackend(t, pg)
	a, b, outcome := pause(t, []string{addr}, "pause/python", "http:"+url+"/guarded/1", noLeaderChange)
	checkRefused(t, db, "pause/python", a, b, outcome, "refused 409 lockd fence: stale token: a newer lock holder came first")
}
