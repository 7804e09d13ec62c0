package main

import (
	"bytes"
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

	"github.com/lockd/lockd/client"
	"github.com/lockd/lockd/codec"
	"github.com/lockd/lockd/internal/adminjson"
	"github.com/lockd/lockd/internal/privatefile"
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

// usesAdmin reports whether command talks to the admin endpoint rather
// than the lock port.
func usesAdmin(command string) bool {
	return command == "status" || command == "list" || command == "cluster"
}

// defineAdminFlags defines the flags of status, list and cluster over o.
func defineAdminFlags(fs *flag.FlagSet, command string, o *options) {
	defineAdminEndpointFlags(fs, o)
	if command != "cluster" {
		fs.StringVar(&o.tenant, "tenant", "", "tenant `name` whose locks to show; empty means \"default\", the tenant of clients that send no HELLO")
	}
	fs.BoolVar(&o.asJSON, "json", false, "print the server's JSON answer as it came")
	if command == "list" {
		fs.IntVar(&o.limit, "limit", defaultListLimit, "list at most `n` keys, 1..1000")
	}
}

// defineAdminEndpointFlags defines the flags that reach the admin
// endpoint: its address, token and certificates.
func defineAdminEndpointFlags(fs *flag.FlagSet, o *options) {
	fs.StringVar(&o.admin, "admin", defaultAdmin, "`HOST:PORT` of lockd's admin endpoint (lockd --admin)")
	fs.StringVar(&o.adminTokenFile, "admin-token-file", "", "`file` holding the admin endpoint's bearer token (lockd --admin-token-file)")
	fs.StringVar(&o.adminCA, "admin-ca", "", "speak HTTPS to the admin endpoint, verifying it against the PEM CA certificates in this `file` (without it, the system's roots when --admin-cert turns HTTPS on)")
	fs.StringVar(&o.adminCert, "admin-cert", "", "PEM client certificate `file` for an admin endpoint that takes them (lockd --admin-tls-client-ca); turns HTTPS on")
	fs.StringVar(&o.adminKey, "admin-key", "", "PEM private key `file` of --admin-cert (mode 0600: refused when the group or others can read it)")
}

// checkAdmin refuses admin flag values the server would refuse.
func (o *options) checkAdmin(command string) error {
	if _, _, err := net.SplitHostPort(o.admin); err != nil {
		return fmt.Errorf("--admin %q: want HOST:PORT", o.admin)
	}
	if (o.adminCert == "") != (o.adminKey == "") {
		return errors.New("--admin-cert and --admin-key go together")
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

func runStatus(ctx context.Context, o *options, key string, p proc) int {
	if !codec.ValidClientKey(key) {
		fmt.Fprintf(p.err, "lockctl status: key %q: want 1..%d bytes of UTF-8 without spaces or line breaks\n", key, codec.MaxKeyLen)
		return exitUsage
	}
	path := "/v1/locks/" + url.PathEscape(o.inspectedTenant()) + "/" + url.PathEscape(key)
	var one adminjson.LockStatus
	return askAdmin(ctx, o, "status", adminRequest{method: http.MethodGet, path: path, timeout: adminTimeout}, &one, p, func(w io.Writer) { printLocks(w, []adminjson.LockStatus{one}, time.Now()) })
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
	var list []adminjson.LockStatus
	return askAdmin(ctx, o, "list", adminRequest{method: http.MethodGet, path: path, timeout: adminTimeout}, &list, p, func(w io.Writer) { printLocks(w, list, time.Now()) })
}

// adminRequest is one request to the admin endpoint.
type adminRequest struct {
	method, path string
	body         []byte // JSON, or nil
	timeout      time.Duration
}

// askAdmin sends req to the admin endpoint, decodes the answer into v and
// prints it with print, or as it came with --json. A signal ends the
// request.
func askAdmin(ctx context.Context, o *options, command string, req adminRequest, v any, p proc, print func(io.Writer)) int {
	ctx, interrupted := untilSignal(ctx, p.signals)
	defer interrupted()
	body, err := o.askAdminOnce(ctx, req)
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

// askAdminOnce sends req to the admin endpoint with the token and
// certificates the flags name, and returns the body of a 200 answer.
func (o *options) askAdminOnce(ctx context.Context, req adminRequest) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, req.timeout)
	defer cancel()
	var token []byte
	if o.adminTokenFile != "" {
		var err error
		if token, err = privatefile.ReadToken(o.adminTokenFile, 1); err != nil {
			return nil, err
		}
	}
	hc, scheme, err := o.adminClient()
	if err != nil {
		return nil, err
	}
	return callAdmin(ctx, hc, req.method, scheme+"://"+o.admin+req.path, req.body, token)
}

// adminClient is the HTTP client for the admin endpoint and its scheme:
// HTTPS, with the CA and client certificate given, when any of
// --admin-ca, --admin-cert, --admin-key is.
func (o *options) adminClient() (*http.Client, string, error) {
	if o.adminCA == "" && o.adminCert == "" && o.adminKey == "" {
		return http.DefaultClient, "http", nil
	}
	cfg, err := client.LoadTLSConfig(o.adminCA, o.adminCert, o.adminKey, "")
	if err != nil {
		return nil, "", fmt.Errorf("--admin-ca, --admin-cert, --admin-key: %w", err)
	}
	// No keep-alive: lockctl makes one request, and no connection outlives it.
	return &http.Client{Transport: &http.Transport{TLSClientConfig: cfg, DisableKeepAlives: true}}, "https", nil
}

// callAdmin returns the body of a 200 answer, or an error with the
// server's own message; a token, when given, is sent as the bearer token.
func callAdmin(ctx context.Context, hc *http.Client, method, u string, reqBody, token []byte) ([]byte, error) {
	var rd io.Reader
	if reqBody != nil {
		rd = bytes.NewReader(reqBody)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return nil, err
	}
	if reqBody != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != nil {
		req.Header.Set("Authorization", "Bearer "+string(token))
	}
	resp, err := hc.Do(req)
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

// printLocks writes locks as a table. HELD SINCE is on lockctl's clock:
// the server tells how long ago, not when. GRANT NODE is the cluster id
// of the node whose client got the token (- in single mode) and REMOTE
// the address of the connection the grant went to, or the node that
// knows it.
func printLocks(w io.Writer, locks []adminjson.LockStatus, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tHELD\tTOKEN\tHELD SINCE\tHELD FOR\tLEASE LEFT\tWAITERS\tNODE\tGRANT NODE\tREMOTE")
	for _, l := range locks {
		held, token, since, heldFor, left, grantNode, remote := "no", "-", "-", "-", "-", "-", "-"
		if l.Held {
			held, token, left = "yes", strconv.FormatUint(l.Token, 10), (time.Duration(l.LeaseRemainingMs) * time.Millisecond).String()
			remote = remoteOf(l)
			if l.GrantNode != 0 {
				grantNode = strconv.FormatUint(l.GrantNode, 10)
			}
		}
		if l.Held && l.HeldForMs > 0 {
			d := time.Duration(l.HeldForMs) * time.Millisecond
			heldFor, since = d.String(), now.Add(-d).UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", l.Key, held, token, since, heldFor, left, l.Waiters, l.Node, grantNode, remote)
	}
	_ = tw.Flush()
}

// remoteOf is where a held lock's grant went: the address when the
// answering server knows it, the node that would know it when another
// node delivered it, and unknown otherwise (a grant from before the
// server started, or one whose record a later grant overwrote).
func remoteOf(l adminjson.LockStatus) string {
	switch {
	case l.RemoteAddr != "":
		return l.RemoteAddr
	case l.GrantNode != 0 && l.GrantNode != l.NodeID:
		return "known at node " + strconv.FormatUint(l.GrantNode, 10)
	}
	return "unknown"
}
