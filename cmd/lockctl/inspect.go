package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/lockd/lockd/codec"
)

// status and list read lockd's admin endpoint (the lock inspection under
// /v1/locks/), not the lock port: they need no secret, and they change
// nothing.

// Defaults of the inspection flags. defaultAdmin is lockd's own --admin
// default.
const (
	defaultAdmin     = "127.0.0.1:7421"
	defaultListLimit = 100
	maxListLimit     = 1000
	// defaultTenant is the tenant of clients that send no HELLO.
	defaultTenant = "default"
	// adminTimeout bounds one inspection request.
	adminTimeout = 10 * time.Second
)

// isInspection reports whether command reads the admin endpoint.
func isInspection(command string) bool { return command == "status" || command == "list" }

// defineInspectionFlags defines the flags of status and list over o.
func defineInspectionFlags(fs *flag.FlagSet, command string, o *options) {
	fs.StringVar(&o.admin, "admin", defaultAdmin, "`HOST:PORT` of lockd's admin endpoint (lockd --admin)")
	fs.StringVar(&o.tenant, "tenant", "", "tenant `name` whose locks to show; empty means \"default\", the tenant of clients that send no HELLO")
	fs.BoolVar(&o.asJSON, "json", false, "print the server's JSON answer as it came")
	if command == "list" {
		fs.IntVar(&o.limit, "limit", defaultListLimit, "list at most `n` keys, 1..1000")
	}
}

// checkInspection refuses inspection flag values the server would refuse.
func (o *options) checkInspection(command string) error {
	if _, _, err := net.SplitHostPort(o.admin); err != nil {
		return fmt.Errorf("--admin %q: want HOST:PORT", o.admin)
	}
	if command == "list" && (o.limit < 1 || o.limit > maxListLimit) {
		return fmt.Errorf("--limit %d: want 1..%d", o.limit, maxListLimit)
	}
	return nil
}

func (o *options) inspectedTenant() string {
	if o.tenant == "" {
		return defaultTenant
	}
	return o.tenant
}

// lockStatus is one key in the admin endpoint's answer.
type lockStatus struct {
	Tenant           string `json:"tenant"`
	Key              string `json:"key"`
	Held             bool   `json:"held"`
	Token            uint64 `json:"token"`
	LeaseRemainingMs int64  `json:"lease_remaining_ms"`
	Waiters          int    `json:"waiters"`
	Node             string `json:"node"`
}

func runStatus(ctx context.Context, o *options, key string, p proc) int {
	if !codec.ValidClientKey(key) {
		fmt.Fprintf(p.err, "lockctl status: key %q: want 1..%d bytes of UTF-8 without spaces or line breaks\n", key, codec.MaxKeyLen)
		return exitUsage
	}
	path := "/v1/locks/" + url.PathEscape(o.inspectedTenant()) + "/" + url.PathEscape(key)
	var one lockStatus
	return inspect(ctx, o, "status", path, &one, p, func(w io.Writer) { printLocks(w, []lockStatus{one}) })
}

func runList(ctx context.Context, o *options, prefix string, p proc) int {
	if prefix != "" && !codec.ValidClientKey(prefix) {
		fmt.Fprintf(p.err, "lockctl list: prefix %q: want at most %d bytes of UTF-8 without spaces or line breaks\n", prefix, codec.MaxKeyLen)
		return exitUsage
	}
	query := url.Values{"limit": {strconv.Itoa(o.limit)}}
	if prefix != "" {
		query.Set("prefix", prefix)
	}
	path := "/v1/locks/" + url.PathEscape(o.inspectedTenant()) + "?" + query.Encode()
	var list []lockStatus
	return inspect(ctx, o, "list", path, &list, p, func(w io.Writer) { printLocks(w, list) })
}

// inspect GETs path from the admin endpoint, decodes the answer into v and
// prints it with print, or as it came with --json. A signal ends the
// request.
func inspect(ctx context.Context, o *options, command, path string, v any, p proc, print func(io.Writer)) int {
	ctx, interrupted := untilSignal(ctx, p.signals)
	defer interrupted()
	ctx, cancel := context.WithTimeout(ctx, adminTimeout)
	defer cancel()
	body, err := getAdmin(ctx, "http://"+o.admin+path)
	if err == nil && !o.asJSON {
		if err = json.Unmarshal(body, v); err != nil {
			err = fmt.Errorf("the answer of --admin %s is not lockd's: %w", o.admin, err)
		}
	}
	if err != nil {
		fmt.Fprintf(p.err, "lockctl %s: %v\n", command, err)
		return exitFailure
	}
	if o.asJSON {
		_, _ = p.out.Write(body)
		return exitOK
	}
	print(p.out)
	return exitOK
}

// getAdmin returns the body of a 200 answer, or an error with the
// server's own message.
func getAdmin(ctx context.Context, u string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("--admin: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return nil, fmt.Errorf("--admin: reading the answer: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		var e struct{ Error string }
		if json.Unmarshal(body, &e) == nil && e.Error != "" {
			return nil, errors.New(e.Error)
		}
		return nil, fmt.Errorf("--admin %s answered %s (is it lockd's admin endpoint?)", req.URL.Host, resp.Status)
	}
	return body, nil
}

// printLocks writes locks as a table.
func printLocks(w io.Writer, locks []lockStatus) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tHELD\tTOKEN\tLEASE LEFT\tWAITERS\tNODE")
	for _, l := range locks {
		held, token, left := "no", "-", "-"
		if l.Held {
			held, token, left = "yes", strconv.FormatUint(l.Token, 10), (time.Duration(l.LeaseRemainingMs) * time.Millisecond).String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\n", l.Key, held, token, left, l.Waiters, l.Node)
	}
	_ = tw.Flush()
}
