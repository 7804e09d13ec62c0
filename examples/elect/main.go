// Command elect is leader election with lockd: run it in several
// terminals and exactly one leads at a time; stop the leader (Ctrl-C)
// or kill it, and another takes over — at once after a clean stop, within
// the lease after a crash — with a higher term.
//
//	bin/lockd serve &                      # built by make build
//	go run ./examples/elect                # --addr or LOCKD_ADDR: one HOST:PORT or a comma-separated list, default 127.0.0.1:7420
//
// The term is the leadership's fencing token: pass it with everything the
// leader writes, so that writes of a deposed leader can be refused.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"strings"
	"syscall"
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
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, strings.Split(addrs, ","), os.Stdout); err != nil {
		log.Fatal(err)
	}
}

// run campaigns for examples/leader until ctx ends, and while leader does
// its work every second, until ctx ends (it then resigns) or leadership
// is lost (it then campaigns again).
func run(ctx context.Context, addrs []string, out io.Writer) error {
	c, err := client.Dial(ctx, client.Config{Addrs: addrs})
	if err != nil {
		return fmt.Errorf("is lockd running on %s? %w", strings.Join(addrs, ","), err)
	}
	defer c.Close()
	for {
		fmt.Fprintln(out, "campaigning for examples/leader")
		leader, err := c.Campaign(ctx, "examples/leader", client.ElectionOptions{Lease: 5 * time.Second})
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "leader, term %d\n", leader.Term())
		tick := time.NewTicker(time.Second)
	lead:
		for {
			select {
			case <-tick.C:
				fmt.Fprintf(out, "term %d: working as the leader\n", leader.Term())
			case <-leader.Lost():
				fmt.Fprintf(out, "term %d: leadership lost (%v)\n", leader.Term(), leader.Err())
				break lead
			case <-ctx.Done():
				tick.Stop()
				// Resign, so that the next candidate takes over at once.
				err := leader.Resign(context.Background())
				fmt.Fprintf(out, "term %d: resigned\n", leader.Term())
				return err
			}
		}
		tick.Stop()
	}
}
