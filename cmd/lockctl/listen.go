package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/lockd/lockd/internal/adminjson"
)

// listenInterval is how often elect --listen asks the admin endpoint.
const listenInterval = 250 * time.Millisecond

// runListen is elect --listen, like `etcdctl elect --listen`: it watches
// the leadership of name through lockd's admin endpoint (it campaigns for
// nothing, needs no secret) and prints a line at the start and at every
// change, "term N" for a leader (its fencing token) or "no leader", until
// SIGINT or SIGTERM; then it exits 0. An admin endpoint that fails is
// reported once per kind of failure, and asked again.
func runListen(ctx context.Context, o *options, name string, p proc) int {
	ctx, interrupted := untilSignal(ctx, p.signals)
	defer interrupted()
	path := "/v1/locks/" + url.PathEscape(o.inspectedTenant()) + "/" + url.PathEscape(name)
	last, lastErr := "", ""
	tick := time.NewTicker(listenInterval)
	defer tick.Stop()
	for {
		body, err := o.askAdminOnce(ctx, adminRequest{method: http.MethodGet, path: path, timeout: adminTimeout})
		var st adminjson.LockStatus
		if err == nil {
			err = json.Unmarshal(body, &st)
		}
		switch {
		case ctx.Err() != nil:
			return exitOK
		case err != nil:
			if err.Error() != lastErr {
				fmt.Fprintf(p.err, "lockctl elect --listen: %v\n", err)
				lastErr = err.Error()
			}
		default:
			lastErr = ""
			line := "no leader"
			if st.Held {
				line = fmt.Sprintf("term %d", st.Token)
			}
			if line != last {
				fmt.Fprintln(p.out, line)
				last = line
			}
		}
		select {
		case <-ctx.Done():
			return exitOK
		case <-tick.C:
		}
	}
}
