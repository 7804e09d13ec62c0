// Command lock is the smallest complete lockd program: it takes a lock,
// does its work while the lock is surely held, and releases it. It needs
// only a running server (make build && bin/lockd serve) and no database:
//
//	go run ./examples/lock                 # --addr or LOCKD_ADDR: one HOST:PORT or a comma-separated list, default 127.0.0.1:7420
//
// Run two at once and the second waits its turn.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"strings"
	"time"

	"github.com/lockd/lockd/client"
)

func main() {
	// Like lockctl: --addr or LOCKD_ADDR, one address or several,
	// comma-separated; the client moves on to the next when one fails.
	addrs := os.Getenv("LOCKD_ADDR")
	if addrs == "" {
		addrs = "127.0.0.1:7420"
	}
	flag.StringVar(&addrs, "addr", addrs, "lockd's `HOST:PORT`, or several, comma-separated (LOCKD_ADDR)")
	flag.Parse()
	if err := run(context.Background(), strings.Split(addrs, ","), 2*time.Second, os.Stdout); err != nil {
		log.Fatal(err)
	}
}

// run takes examples/report on the server at addr, works for work while
// holding it, and releases it.
func run(ctx context.Context, addrs []string, work time.Duration, out io.Writer) error {
	c, err := client.Dial(ctx, client.Config{Addrs: addrs})
	if err != nil {
		return fmt.Errorf("is lockd running on %s? %w", strings.Join(addrs, ","), err)
	}
	defer c.Close()

	ticket, err := c.Acquire(ctx, "examples/report", client.AcquireOptions{
		Lease: 10 * time.Second, // the lock lapses by itself after this
		Wait:  30 * time.Second, // how long to queue behind another holder
		// Required: the time the work needs once the lock is held. A grant
		// with less validity left is handed back (ErrIndeterminate).
		MinWorkBudget: client.Budget(work),
	})
	switch {
	case errors.Is(err, client.ErrTimeout), errors.Is(err, client.ErrWaitElapsed), errors.Is(err, client.ErrBusy):
		return fmt.Errorf("examples/report stayed held by someone else: %w", err)
	case err != nil:
		return err
	}
	fmt.Fprintf(out, "holding examples/report with fencing token %d\n", ticket.Token())

	// The work stops when the lock is no longer surely held. A real job
	// passes ticket.Token() to what it writes, so a late write is refused.
	working, cancel := context.WithDeadline(ctx, ticket.ValidUntil())
	defer cancel()
	select {
	case <-time.After(work):
	case <-working.Done():
		return fmt.Errorf("the lease ran out before the work was done")
	}

	if err := c.Release(ctx, ticket); err != nil {
		return fmt.Errorf("release: %w", err) // the lease frees it anyway
	}
	fmt.Fprintln(out, "done, released")
	return nil
}
