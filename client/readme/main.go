// Pay invoice 42 under a lockd lock. The fencing token goes into the
// UPDATE, so a holder whose lease ran out unnoticed (a long pause, a
// partition) cannot overwrite the work of the holder after it.
//
// It needs a PostgreSQL database with an invoices table (id, paid,
// fence) in DATABASE_URL and its database/sql driver linked in: add
// the import _ "github.com/jackc/pgx/v5/stdlib". Without a database,
// run examples/lock.
package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"os"
	"slices"
	"time"

	"github.com/lockd/lockd/client"
	// and your database/sql driver, e.g. _ "github.com/jackc/pgx/v5/stdlib"
)

func main() {
	if err := payInvoice(context.Background()); err != nil {
		log.Fatal(err)
	}
}

func payInvoice(ctx context.Context) error {
	if !slices.Contains(sql.Drivers(), "pgx") || os.Getenv("DATABASE_URL") == "" {
		return errors.New(`this program needs the "pgx" database/sql driver linked in (import _ "github.com/jackc/pgx/v5/stdlib") and DATABASE_URL; without a database, run examples/lock`)
	}
	db, err := sql.Open("pgx", os.Getenv("DATABASE_URL"))
	if err != nil {
		return err
	}
	defer db.Close()

	c, err := client.Dial(ctx, client.Config{Addrs: []string{"127.0.0.1:7420"}})
	if err != nil {
		return err
	}
	defer c.Close()

	t, err := c.Acquire(ctx, "invoice/42", client.AcquireOptions{
		Lease: 30 * time.Second, // the lock lapses by itself after this
		Wait:  5 * time.Second,  // how long to queue behind another holder
		// Required: the time you need once you hold the lock (the UPDATE,
		// its commit, a pause you can tolerate). A grant with less
		// validity left is handed back and reported ErrIndeterminate.
		MinWorkBudget: client.Budget(2 * time.Second),
	})
	switch {
	case errors.Is(err, client.ErrTimeout), errors.Is(err, client.ErrBusy), errors.Is(err, client.ErrWaitElapsed):
		return fmt.Errorf("invoice 42 is locked by someone else: %w", err)
	case err != nil:
		// ErrIndeterminate: perhaps granted, to nobody who knows the
		// token; its lease bounds it. Or bad input, auth, no server.
		return err
	}
	defer c.Release(ctx, t) // unanswered, it leaves the lock to its lease

	// Stop when the lease is no longer surely ours; the fence refuses
	// this write anyway once a newer token has written the row.
	work, cancel := context.WithDeadline(ctx, t.ValidUntil())
	defer cancel()
	_, err = db.ExecContext(work,
		`UPDATE invoices SET paid = true, fence = $1 WHERE id = 42 AND fence < $1`, t.Token())
	return err
}
