package fence_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"

	"github.com/lockd/lockd/client/fence"
	"github.com/lockd/lockd/internal/pgtest"
	_ "modernc.org/sqlite" // the "sqlite" database/sql driver
)

// database is one real database of a dialect, with the fences table and a
// guarded table, account(id, balance, writer).
type database struct {
	db      *sql.DB
	dialect fence.Dialect
	fences  *fence.SQL
}

func openSQLite(t testing.TB) database {
	t.Helper()
	// One connection: SQLite has one writer, and a second connection would
	// only wait on its lock.
	db, err := sql.Open("sqlite", filepath.Join(t.TempDir(), "fence.db")+"?_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	t.Cleanup(func() { db.Close() })
	return prepare(t, db, fence.SQLite)
}

func openPostgres(t testing.TB) database {
	t.Helper()
	return prepare(t, pgtest.Start(t).Open(t), fence.Postgres)
}

func prepare(t testing.TB, db *sql.DB, d fence.Dialect) database {
	t.Helper()
	fences := fence.NewSQL(db, d)
	if err := fences.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Init twice: the table exists, and that is fine.
	if err := fences.Init(context.Background()); err != nil {
		t.Fatalf("second Init: %v", err)
	}
	if _, err := db.Exec(`CREATE TABLE account (id integer PRIMARY KEY, balance integer NOT NULL, writer bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`INSERT INTO account VALUES (1, 0, 0)`); err != nil {
		t.Fatal(err)
	}
	return database{db: db, dialect: d, fences: fences}
}

// deposit adds one to the balance of account 1 as the holder of token,
// fenced on key, in one transaction.
func (d database) deposit(ctx context.Context, key string, token uint64) error {
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := d.fences.Check(ctx, tx, key, token); err != nil {
		return err
	}
	q := `UPDATE account SET balance = balance + 1, writer = $1 WHERE id = 1`
	if d.dialect == fence.SQLite {
		q = `UPDATE account SET balance = balance + 1, writer = ? WHERE id = 1`
	}
	if _, err := tx.ExecContext(ctx, q, int64(token)); err != nil {
		return err
	}
	return tx.Commit()
}

func (d database) account(t *testing.T) (balance int, writer uint64) {
	t.Helper()
	if err := d.db.QueryRow(`SELECT balance, writer FROM account WHERE id = 1`).Scan(&balance, &writer); err != nil {
		t.Fatal(err)
	}
	return balance, writer
}

func (d database) mark(t *testing.T, key string) uint64 {
	t.Helper()
	var mark uint64
	q := `SELECT token FROM lockd_fences WHERE key = $1`
	if d.dialect == fence.SQLite {
		q = `SELECT token FROM lockd_fences WHERE key = ?`
	}
	if err := d.db.QueryRow(q, key).Scan(&mark); err != nil {
		t.Fatal(err)
	}
	return mark
}

func TestSQLite(t *testing.T)   { testSQL(t, openSQLite(t)) }
func TestPostgres(t *testing.T) { testSQL(t, openPostgres(t)) }

func testSQL(t *testing.T, d database) {
	ctx := context.Background()
	t.Run("tokens in order are accepted, an equal one too", func(t *testing.T) {
		for _, token := range []uint64{3, 3, 7, 7, 8} {
			if err := d.deposit(ctx, "order", token); err != nil {
				t.Fatalf("token %d: %v", token, err)
			}
		}
		if balance, writer := d.account(t); balance != 5 || writer != 8 {
			t.Fatalf("account: balance %d, writer %d; want 5 deposits, the last by token 8", balance, writer)
		}
	})
	t.Run("a token below the mark is refused with the mark, and writes nothing", func(t *testing.T) {
		before, _ := d.account(t)
		err := d.deposit(ctx, "order", 5)
		var stale *fence.StaleError
		if !errors.Is(err, fence.ErrStale) || !errors.As(err, &stale) {
			t.Fatalf("token 5 after 8: %v; want a *StaleError", err)
		}
		if *stale != (fence.StaleError{Key: "order", Token: 5, Mark: 8}) {
			t.Fatalf("stale error %+v; want key order, token 5, mark 8", *stale)
		}
		if after, writer := d.account(t); after != before || writer != 8 {
			t.Fatalf("account after the refusal: balance %d (was %d), writer %d; want unchanged", after, before, writer)
		}
	})
	t.Run("keys are fenced apart", func(t *testing.T) {
		if err := d.deposit(ctx, "other", 1); err != nil {
			t.Fatalf("token 1 on a new key: %v", err)
		}
	})
	t.Run("a rolled back check leaves the mark", func(t *testing.T) {
		tx, err := d.db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := d.fences.Check(ctx, tx, "order", 100); err != nil {
			t.Fatal(err)
		}
		if err := tx.Rollback(); err != nil {
			t.Fatal(err)
		}
		if mark := d.mark(t, "order"); mark != 8 {
			t.Fatalf("mark %d after a rolled back check of 100; want 8", mark)
		}
		if err := d.deposit(ctx, "order", 9); err != nil {
			t.Fatalf("token 9 after the rollback: %v", err)
		}
	})
	t.Run("Fence commits the mark on its own", func(t *testing.T) {
		if err := d.fences.Fence(ctx, "order", 10); err != nil {
			t.Fatal(err)
		}
		if err := d.deposit(ctx, "order", 9); !errors.Is(err, fence.ErrStale) {
			t.Fatalf("token 9 after Fence(10): %v; want ErrStale", err)
		}
	})
	t.Run("bad input is refused before the database", func(t *testing.T) {
		for _, c := range []struct {
			key   string
			token uint64
			want  error
		}{
			{"", 1, fence.ErrBadKey},
			{"a b", 1, fence.ErrBadKey},
			{"a\r", 1, fence.ErrBadKey},
			{string(make([]byte, 129)), 1, fence.ErrBadKey},
			{"\xff", 1, fence.ErrBadKey},
			{"k", 0, fence.ErrBadToken},
			{"k", 1 << 63, fence.ErrBadToken},
		} {
			if err := d.fences.Fence(ctx, c.key, c.token); !errors.Is(err, c.want) {
				t.Errorf("Fence(%q, %d) = %v; want %v", c.key, c.token, err, c.want)
			}
		}
	})
	t.Run("concurrent holders: the newest token always commits and writes last", func(t *testing.T) {
		const holders = 8
		var wg sync.WaitGroup
		errs := make([]error, holders)
		for i := range holders {
			wg.Go(func() { errs[i] = d.deposit(ctx, "race", uint64(100+i)) })
		}
		wg.Wait()
		committed := 0
		for i, err := range errs {
			var stale *fence.StaleError
			switch {
			case err == nil:
				committed++
			case errors.As(err, &stale):
				if stale.Mark <= stale.Token {
					t.Errorf("token %d refused with mark %d, not above it", 100+i, stale.Mark)
				}
			default:
				t.Errorf("token %d: %v", 100+i, err)
			}
		}
		if errs[holders-1] != nil {
			t.Errorf("the newest token %d was refused: %v", 100+holders-1, errs[holders-1])
		}
		if _, writer := d.account(t); writer != 100+holders-1 {
			t.Errorf("last writer %d; want the newest token %d (%d of %d committed)", writer, 100+holders-1, committed, holders)
		}
	})
}

// A read of the mark that fails after a refusal still reports ErrStale.
func TestStaleErrorWithoutMark(t *testing.T) {
	err := &fence.StaleError{Key: "k", Token: 4}
	if !errors.Is(fmt.Errorf("wrapped: %w", err), fence.ErrStale) {
		t.Fatal("a wrapped *StaleError does not match ErrStale")
	}
	if got := err.Error(); got != `fence: key "k": token 4 is stale` {
		t.Fatalf("message %q", got)
	}
}
