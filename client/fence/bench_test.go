package fence_test

import (
	"context"
	"database/sql"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/lockd/lockd/client/fence"
)

// The in-memory check of a key it has seen: 0 allocs/op.
func BenchmarkMemoryFence(b *testing.B) {
	var marks fence.Memory
	ctx := context.Background()
	b.ReportAllocs()
	for i := range b.N {
		if err := marks.Fence(ctx, "invoice/42", uint64(i)+1); err != nil {
			b.Fatal(err)
		}
	}
}

// discard is a ResponseWriter that keeps nothing, so the benchmark counts
// the Handler's allocations, not a recorder's.
type discard struct{ h http.Header }

func (d discard) Header() http.Header       { return d.h }
func (discard) Write(p []byte) (int, error) { return len(p), nil }
func (discard) WriteHeader(statusCode int)  {}

// A request through Handler over Memory, accepted: 0 allocs/op.
func BenchmarkHandlerMemory(b *testing.B) {
	var marks fence.Memory
	h := fence.Handler(&marks, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	r := httptest.NewRequest(http.MethodPost, "/invoice/42", nil)
	fence.SetHeaders(r.Header, "invoice/42", 7)
	w := discard{h: http.Header{}}
	b.ReportAllocs()
	for range b.N {
		h.ServeHTTP(w, r)
	}
}

// The transaction of a guarded write on a real PostgreSQL (BEGIN, UPDATE,
// COMMIT), without the fence check, with it, and with a bare round trip
// (SELECT 1) in its place for scale: the check is one more statement, one
// more round trip, in the same transaction.
func BenchmarkPostgresUpdate(b *testing.B) {
	d := openPostgres(b)
	ctx := context.Background()
	const update = `UPDATE account SET balance = balance + 1, writer = $1 WHERE id = 1`
	run := func(b *testing.B, before func(*sql.Tx) error) {
		b.ReportAllocs()
		for range b.N {
			tx, err := d.db.BeginTx(ctx, nil)
			if err != nil {
				b.Fatal(err)
			}
			if err := before(tx); err != nil {
				b.Fatal(err)
			}
			if _, err := tx.ExecContext(ctx, update, 7); err != nil {
				b.Fatal(err)
			}
			if err := tx.Commit(); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("update", func(b *testing.B) { run(b, func(*sql.Tx) error { return nil }) })
	b.Run("select1+update", func(b *testing.B) {
		run(b, func(tx *sql.Tx) error {
			var one int
			return tx.QueryRowContext(ctx, `SELECT 1`).Scan(&one)
		})
	})
	b.Run("check+update", func(b *testing.B) {
		run(b, func(tx *sql.Tx) error { return d.fences.Check(ctx, tx, "invoice/42", 7) })
	})
}
