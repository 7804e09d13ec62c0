package client_test

import (
	"context"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/lockd/lockd/client"
)

// Guard a database write with the fencing token. The row remembers the
// newest token that wrote it and the UPDATE refuses an older one, so a
// holder whose lease lapsed unnoticed — a long GC pause, a partition —
// cannot overwrite the work of the holder after it.
func Example() {
	ctx := context.Background()
	secret, err := hex.DecodeString(os.Getenv("LOCKD_SECRET"))
	if err != nil {
		log.Fatal(err)
	}
	c, err := client.Dial(ctx, client.Config{
		Addrs:  []string{"10.0.0.1:7420", "10.0.0.2:7420"},
		Tenant: "billing",
		Secret: secret,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	var db *sql.DB // the database the critical section writes to
	ticket, err := c.Acquire(ctx, "invoice/42", client.AcquireOptions{
		Lease: 30 * time.Second,
		Wait:  10 * time.Second,
		// The UPDATE, its commit, and a pause we can tolerate.
		MinWorkBudget: client.Budget(5 * time.Second),
	})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Release(ctx, ticket)

	// Stop working when the lease is no longer surely ours.
	work, cancel := context.WithDeadline(ctx, ticket.ValidUntil())
	defer cancel()
	res, err := db.ExecContext(work,
		`UPDATE invoices SET state = 'paid', fence = $1 WHERE id = 42 AND fence < $1`, ticket.Token())
	if err != nil {
		log.Fatal(err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		log.Print("a newer lock holder already wrote invoice 42; this write was fenced off")
	}
}

// Try the lock once, without queueing behind its holder: wait 0 is one
// immediate attempt, and ErrTimeout means someone else holds the lock.
func ExampleClient_Acquire_tryLock() {
	ctx := context.Background()
	c, err := client.Dial(ctx, client.Config{Addrs: []string{"127.0.0.1:7420"}})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	ticket, err := c.Acquire(ctx, "nightly-report", client.AcquireOptions{
		Lease:         10 * time.Minute,
		MinWorkBudget: client.Budget(5 * time.Minute),
	})
	switch {
	case errors.Is(err, client.ErrTimeout), errors.Is(err, client.ErrBusy):
		fmt.Println("another instance is running the report")
		return
	case err != nil:
		log.Fatal(err)
	}
	defer c.Release(ctx, ticket)
	fmt.Println("running the report with fencing token", ticket.Token())
}

// Handle an indeterminate outcome. ErrIndeterminate means the lock may be
// held, but not by this caller as far as it can know: never proceed as
// the holder. Retrying is safe — a grant the client learned about has
// already been released as compensation, and one it did not learn about
// expires with its lease, so a retry at worst waits that long.
func ExampleClient_Acquire_indeterminate() {
	ctx := context.Background()
	c, err := client.Dial(ctx, client.Config{Addrs: []string{"127.0.0.1:7420"}})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	opts := client.AcquireOptions{
		Lease:         15 * time.Second,
		Wait:          5 * time.Second,
		MinWorkBudget: client.Budget(3 * time.Second),
	}
	for attempt := 1; attempt <= 3; attempt++ {
		ticket, err := c.Acquire(ctx, "queue/shard-7", opts)
		switch {
		case err == nil:
			defer c.Release(ctx, ticket)
			fmt.Println("holding shard 7 until", ticket.ValidUntil())
			return
		case errors.Is(err, client.ErrIndeterminate), errors.Is(err, client.ErrTimeout):
			log.Printf("attempt %d: %v", attempt, err)
		default:
			log.Fatal(err) // bad input, authentication, closed client
		}
	}
}

// Stop working the moment the lease may be gone.
func ExampleTicket_Lost() {
	ctx := context.Background()
	c, err := client.Dial(ctx, client.Config{Addrs: []string{"127.0.0.1:7420"}})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	ticket, err := c.Acquire(ctx, "leader", client.AcquireOptions{
		Lease:         time.Minute,
		MinWorkBudget: client.Budget(30 * time.Second),
	})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Release(ctx, ticket)

	batches := make(chan string)
	for {
		select {
		case <-ticket.Lost():
			fmt.Println("lease over: stepping down")
			return
		case batch := <-batches:
			fmt.Println("processing", batch, "as leader", ticket.Token())
		}
	}
}

// Hold a lock for work of unknown length: renew it every 10 s while the
// work runs, and stop the work as soon as the lock may be gone.
func ExampleTicket_KeepAlive() {
	ctx := context.Background()
	c, err := client.Dial(ctx, client.Config{Addrs: []string{"127.0.0.1:7420"}})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ticket, err := c.Acquire(ctx, "reindex", client.AcquireOptions{
		Lease:         30 * time.Second,
		MinWorkBudget: client.Budget(10 * time.Second),
	})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Release(ctx, ticket)

	work, stopWork := context.WithCancel(ctx)
	defer stopWork()
	go func() {
		// Lost follows every confirmed renewal of the kept copy.
		<-ticket.Lost()
		stopWork()
	}()
	kept := ticket
	renewing, stopRenewing := context.WithCancel(ctx)
	renewed := make(chan error, 1)
	go func() { renewed <- kept.KeepAlive(renewing, 10*time.Second) }()

	reindex(work, ticket.Token())
	stopRenewing()
	if err := <-renewed; err != nil {
		log.Printf("the lock was lost during the work: %v", err)
	}
}

func reindex(ctx context.Context, fence uint64) {}

// Elect one leader among replicas: Campaign returns once this process
// leads; the term is the fencing token to pass with every write; Lost
// closes when leadership can no longer be confirmed, before the lease
// could lapse, and the leader must then stop acting as one.
func ExampleClient_Campaign() {
	ctx := context.Background()
	c, err := client.Dial(ctx, client.Config{Addrs: []string{"127.0.0.1:7420"}})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	leader, err := c.Campaign(ctx, "scheduler", client.ElectionOptions{Lease: 15 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer leader.Resign(ctx) // the next candidate wins at once
	fmt.Println("leading with term", leader.Term())
	select {
	case <-leader.Lost():
		log.Printf("no longer the leader: %v", leader.Err())
	case <-time.After(time.Minute): // the leader's work
	}
}
