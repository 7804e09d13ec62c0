package main

import (
	"context"
	"fmt"
	"time"
)

// runHold is acquire --hold, like `etcdctl lock NAME`: it takes key,
// prints its token, and keeps it, renewing its lease every third of
// --lease, until SIGINT or SIGTERM (any relayed signal), then releases
// it. Exit status 0 after the release; 3 when the lock was lost first (a
// renewal answered NOT HELD, or none confirmed before the lease ran
// out), 1 when the release's outcome is unknown.
func runHold(ctx context.Context, o *options, key string, p proc) int {
	c, ticket, code := takeLock(ctx, o, key, "acquire", p)
	if c == nil {
		return code
	}
	defer c.Close()
	fmt.Fprintln(p.out, ticket.Token())
	heldAtMost := leaseBound(time.Now(), o.lease)

	lost := ticket.Lost()
	renewing, stop := context.WithCancel(context.Background())
	confirmed := make(chan renewal, 1)
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		keepAlive(renewing, ticket, o.lease, confirmed, "acquire", p)
	}()
	defer func() { stop(); <-stopped }()
	for {
		select {
		case r := <-confirmed:
			heldAtMost = r.heldAtMost
		case <-lost:
			fmt.Fprintf(p.err, "lockctl acquire: %q is no longer held (no renewal confirmed in time, or the server said so)\n", key)
			return exitNotHeld
		case sig := <-p.signals:
			stop()
			<-stopped
			// A renewal confirmed just before the stop moves the bound.
			select {
			case r := <-confirmed:
				heldAtMost = r.heldAtMost
			default:
			}
			if !release(c, ticket, "acquire", heldAtMost, p) {
				return exitFailure
			}
			if o.verbose {
				fmt.Fprintf(p.err, "lockctl acquire: %s: %q released\n", signalName(sig), key)
			}
			return exitOK
		}
	}
}
