package fence_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"time"

	"github.com/lockd/lockd/client"
	"github.com/lockd/lockd/client/fence"
	"github.com/lockd/lockd/client/lockdtest"
)

// exampleDB is a fresh SQLite database with an invoices table; the
// examples run on it (a PostgreSQL *sql.DB with fence.Postgres works the
// same way).
func exampleDB() (*sql.DB, func()) {
	dir, err := os.MkdirTemp("", "fence-example-")
	if err != nil {
		log.Fatal(err)
	}
	db, err := sql.Open("sqlite", filepath.Join(dir, "app.db"))
	if err != nil {
		log.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	if _, err := db.Exec(`CREATE TABLE invoices (id integer PRIMARY KEY, state text, paid_by bigint)`); err != nil {
		log.Fatal(err)
	}
	if _, err := db.Exec(`INSERT INTO invoices VALUES (42, 'open', 0)`); err != nil {
		log.Fatal(err)
	}
	return db, func() { db.Close(); os.RemoveAll(dir) }
}

// pay marks invoice 42 paid by the holder of token, fenced in the same
// transaction as the UPDATE.
func pay(ctx context.Context, db *sql.DB, fences *fence.SQL, token uint64) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := fences.Check(ctx, tx, "invoice/42", token); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `UPDATE invoices SET state = 'paid', paid_by = ? WHERE id = 42`, token); err != nil {
		return err
	}
	return tx.Commit()
}

// Fence a database write with the token of the lock that guards it. The
// holder of token 7 paused past its lease; the holder of token 8 paid the
// invoice meanwhile; 7's transaction is refused when it wakes.
func Example() {
	ctx := context.Background()
	db, done := exampleDB()
	defer done()
	fences := fence.NewSQL(db, fence.SQLite)
	if err := fences.Init(ctx); err != nil {
		log.Fatal(err)
	}

	fmt.Println("token 8:", pay(ctx, db, fences, 8))
	fmt.Println("token 7:", pay(ctx, db, fences, 7))
	var paidBy uint64
	_ = db.QueryRow(`SELECT paid_by FROM invoices WHERE id = 42`).Scan(&paidBy)
	fmt.Println("paid by", paidBy)
	// Output:
	// token 8: <nil>
	// token 7: fence: key "invoice/42": token 7 is stale, a holder with token 8 came after it
	// paid by 8
}

// The fences table lives in the guarded database; NewSQL names the
// database and its dialect (fence.Postgres with pgx or lib/pq).
func ExampleNewSQL() {
	db, done := exampleDB()
	defer done()
	fences := fence.NewSQL(db, fence.SQLite)
	fmt.Println(fences.Init(context.Background()))
	// Output: <nil>
}

// Init creates lockd_fences if it is not there; a migration may create it
// instead with the DDL in SQL's documentation.
func ExampleSQL_Init() {
	db, done := exampleDB()
	defer done()
	ctx := context.Background()
	fmt.Println(fence.NewSQL(db, fence.SQLite).Init(ctx))
	fmt.Println(fence.NewSQL(db, fence.SQLite).Init(ctx))
	// Output:
	// <nil>
	// <nil>
}

// Check in the transaction of the writes it guards: an equal token is the
// same holder and passes, an older one is refused.
func ExampleSQL_Check() {
	ctx := context.Background()
	db, done := exampleDB()
	defer done()
	fences := fence.NewSQL(db, fence.SQLite)
	if err := fences.Init(ctx); err != nil {
		log.Fatal(err)
	}
	for _, token := range []uint64{5, 5, 4} {
		err := pay(ctx, db, fences, token)
		fmt.Printf("token %d stale: %v\n", token, errors.Is(err, fence.ErrStale))
	}
	// Output:
	// token 5 stale: false
	// token 5 stale: false
	// token 4 stale: true
}

// Fence checks and commits at once, for a caller with no transaction of
// its own (Handler uses it).
func ExampleSQL_Fence() {
	ctx := context.Background()
	db, done := exampleDB()
	defer done()
	fences := fence.NewSQL(db, fence.SQLite)
	if err := fences.Init(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println(fences.Fence(ctx, "report/daily", 3))
	fmt.Println(fences.Fence(ctx, "report/daily", 2))
	// Output:
	// <nil>
	// fence: key "report/daily": token 2 is stale, a holder with token 3 came after it
}

func ExampleDialect_String() {
	fmt.Println(fence.Postgres, fence.SQLite)
	// Output: postgres sqlite
}

// The refusal carries the mark the token lost to.
func ExampleStaleError() {
	var marks fence.Memory
	ctx := context.Background()
	_ = marks.Fence(ctx, "queue/emails", 12)
	err := marks.Fence(ctx, "queue/emails", 11)
	var stale *fence.StaleError
	if errors.As(err, &stale) {
		fmt.Println(stale.Token, "lost to", stale.Mark)
	}
	// Output: 11 lost to 12
}

// Memory fences a resource that lives in this process.
func ExampleMemory_Fence() {
	var marks fence.Memory
	ctx := context.Background()
	fmt.Println(marks.Fence(ctx, "cache/users", 1))
	fmt.Println(marks.Fence(ctx, "cache/users", 2))
	fmt.Println(errors.Is(marks.Fence(ctx, "cache/users", 1), fence.ErrStale))
	fmt.Println(errors.Is(marks.Fence(ctx, "cache/users", 0), fence.ErrBadToken))
	fmt.Println(errors.Is(marks.Fence(ctx, "cache users", 3), fence.ErrBadKey))
	// Output:
	// <nil>
	// <nil>
	// true
	// true
	// true
}

// logged is a Store that logs every refusal of the Store it wraps.
type logged struct{ fence.Store }

func (l logged) Fence(ctx context.Context, key string, token uint64) error {
	err := l.Store.Fence(ctx, key, token)
	if errors.Is(err, fence.ErrStale) {
		fmt.Println("refused:", err)
	}
	return err
}

// Any type with Fence is a Store.
func ExampleStore() {
	var store fence.Store = logged{&fence.Memory{}}
	ctx := context.Background()
	_ = store.Fence(ctx, "k", 2)
	_ = store.Fence(ctx, "k", 1)
	// Output: refused: fence: key "k": token 1 is stale, a holder with token 2 came after it
}

// An HTTP service fenced by Handler: a request with an older token than
// one already seen for its key is answered 409 Conflict.
func ExampleHandler() {
	var marks fence.Memory
	srv := httptest.NewServer(fence.Handler(&marks, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "written by", r.Header.Get(fence.HeaderToken))
	})))
	defer srv.Close()

	for _, token := range []uint64{8, 7} {
		req, _ := http.NewRequest(http.MethodPut, srv.URL+"/invoice/42", nil)
		fence.SetHeaders(req.Header, "invoice/42", token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Printf("%d %s", resp.StatusCode, body)
	}
	// Output:
	// 200 written by 8
	// 409 lockd fence: stale token: a newer lock holder came first
}

// SetHeaders sends a key and a token the caller holds as values, such as
// lockctl exec's LOCKD_KEY and LOCKD_TOKEN.
func ExampleSetHeaders() {
	req, _ := http.NewRequest(http.MethodPost, "http://backend.internal/jobs", nil)
	fence.SetHeaders(req.Header, "jobs/nightly", 1234)
	fmt.Println(req.Header.Get(fence.HeaderKey), req.Header.Get(fence.HeaderToken))
	// Output: jobs/nightly 1234
}

// SetTicket sends the key and token of a lock held through the client.
// Here the lock server is lockdtest's in-memory double.
func ExampleSetTicket() {
	ctx := context.Background()
	locks, err := lockdtest.Start((&lockdtest.Locks{}).Serve)
	if err != nil {
		log.Fatal(err)
	}
	defer locks.Close()
	c, err := client.Dial(ctx, client.Config{Addrs: []string{locks.Addr()}})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ticket, err := c.Acquire(ctx, "invoice/42", client.AcquireOptions{
		Lease: 10 * time.Second, MinWorkBudget: client.Budget(time.Second)})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Release(ctx, ticket)

	req, _ := http.NewRequest(http.MethodPut, "http://billing.internal/invoice/42", nil)
	fence.SetTicket(req.Header, ticket)
	fmt.Println(req.Header.Get(fence.HeaderKey), req.Header.Get(fence.HeaderToken) == fmt.Sprint(ticket.Token()))
	// Output: invoice/42 true
}
