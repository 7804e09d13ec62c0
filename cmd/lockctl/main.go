// Command lockctl takes, releases and holds lockd locks from the shell,
// like flock(1), `etcdctl lock` or `consul lock`, and shows them (status,
// list) from lockd's admin endpoint.
package main

import (
	"context"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/lockd/lockd/client"
	"github.com/lockd/lockd/cmd/internal/envflag"
	"github.com/lockd/lockd/cmd/internal/version"
	"github.com/lockd/lockd/codec"
	"github.com/lockd/lockd/internal/privatefile"
	"golang.org/x/sys/unix"
)

const usage = `usage:
  lockctl acquire [flags] KEY             take KEY and print its fencing token
  lockctl acquire --hold [flags] KEY      take KEY and keep it until SIGINT or SIGTERM
  lockctl release [flags] KEY TOKEN       release the grant TOKEN of KEY
  lockctl exec [flags] KEY -- CMD [ARG…]  run CMD while holding KEY
  lockctl elect [flags] NAME -- CMD [ARG…]  run CMD while leader of NAME
  lockctl elect --listen [flags] NAME     print NAME's leader's term at every change
  lockctl status [flags] KEY              show KEY: held, token, held for, lease left, waiters, node, remote
  lockctl list [flags] [PREFIX]           the held or waited-for keys, sorted
  lockctl cluster [flags] list            a cluster's nodes, per Raft group
  lockctl cluster [flags] add ID ADDR     add node ID (Raft address ADDR) to every group
  lockctl cluster [flags] remove ID       remove node ID from every group
  lockctl --version

Flags may come before, between or after the arguments; "--" ends them,
and for exec and elect so does the command. lockctl COMMAND --help shows
one command's help and flags.

status and list ask lockd's admin endpoint (--admin), which needs no
tenant secret, but the admin token when lockd has one
(--admin-token-file) or a client certificate when lockd takes them
(--admin-cert, --admin-key; with --admin-ca, or either, over HTTPS);
--tenant names the tenant whose locks to show. In cluster mode the
node asked answers from its replica of the keys' groups and says so in
the NODE column.

cluster asks a cluster node's admin endpoint too. To add a node, start it
first with lockd serve --cluster --join and an empty --data-dir, then add
it; to replace a dead node, remove it and add a new one with a new id (a
removed id never comes back). A change that stops half-way (a group
without a leader for a minute) is finished by the same command again.

exec runs CMD in its own process group with the fencing token in
LOCKD_TOKEN and the key in LOCKD_KEY, and relays SIGINT, SIGTERM, SIGHUP
and SIGQUIT to it. While CMD runs, exec renews the lease (KEEP) every third
of --lease, so CMD may run as long as it needs; --keepalive=false holds the
lock for one lease only. It sends the group SIGTERM --grace before the
latest confirmed lease may lapse and SIGKILL when it may have — with
keep-alive, only when renewals could not be confirmed in time, or the
server said the lock was no longer held. When CMD exits, whatever it left
running in its process group is killed and reaped before the lock is
released, so nothing it started runs without the lock.

elect campaigns for leadership of NAME — a lock on NAME queued for in
bounded rounds and held with KEEP, its fencing token the term — until it
wins or --wait (default 255s; 0: one attempt) runs out, then runs CMD
like exec with the term in LOCKD_TERM and NAME in LOCKD_KEY. When
leadership can no longer be confirmed, --grace before the lease could
lapse, CMD's group is sent SIGTERM, and SIGKILL --grace later; when CMD
exits lockctl resigns, so the next candidate wins at once.

A lock that stays held reads as one plain line, "lockctl: KEY is held;
not acquired within 2s", with exit status 75; --verbose adds the client's
full answer.

Exit status:
  0      done (exec: CMD exited 0)
  1      failure: connection, authentication, an outcome lockctl cannot know
  2      usage
  3      release: NOT HELD, the token was no longer current;
         acquire --hold: the lock was lost before a signal came
  75     not acquired: timeout, busy, unavailable, or --wait ran out on a
         lock that stayed held (elect: not elected within --wait);
         nothing is held by lockctl
  124    exec: lockctl had to signal CMD because the lease was ending
         (elect: leadership was lost), whatever status CMD then exited with
  126    exec: CMD could not be run
  127    exec: CMD was not found
  128+N  a signal N came before the lock was held (130 for Ctrl-C): not
         acquired; exec: CMD was ended by signal N
  other  exec: CMD's exit status

Every flag can also be set with LOCKD_<NAME> (--secret-file as
LOCKD_SECRET_FILE); a flag on the command line wins. The tenant's secret,
in hex as in lockd's auth file (make one with openssl rand -hex 32), is
read from --secret-file, or else from LOCKD_SECRET. Any --tls flag
connects over TLS, to lockd's --tls-listen port.
`

const (
	exitOK          = 0
	exitFailure     = 1
	exitUsage       = 2
	exitNotHeld     = 3
	exitNotAcquired = 75 // EX_TEMPFAIL
	// exitLeaseEnded is timeout(1)'s status for a command it had to stop.
	exitLeaseEnded = 124
	// exitCannotRun and exitNotFound are the shell's statuses for a
	// command that could not be started.
	exitCannotRun = 126
	exitNotFound  = 127
	// exitSignalBase plus the signal's number is the shell's status for
	// a process ended by a signal.
	exitSignalBase = 128
)

// relayedSignals end a wait for the lock, and are passed on to exec's
// command once it runs.
var relayedSignals = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT}

func main() {
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, relayedSignals...)
	os.Exit(run(context.Background(), os.Args[1:], os.LookupEnv, proc{in: os.Stdin, out: os.Stdout, err: os.Stderr, signals: signals}))
}

// proc is what one run of lockctl talks to: its streams, and the signals
// it was sent.
type proc struct {
	in       io.Reader
	out, err io.Writer
	signals  <-chan os.Signal
}

// commandArgs is how many arguments each command takes after its flags,
// at least; optionalArgs how many more it may take.
var (
	commandArgs  = map[string]int{"acquire": 1, "release": 2, "exec": 2, "elect": 2, "status": 1, "list": 0, "cluster": 1}
	optionalArgs = map[string]int{"list": 1, "cluster": 2}
)

func run(ctx context.Context, args []string, lookupEnv func(string) (string, bool), p proc) int {
	command, args := splitCommand(args)
	switch command {
	case "":
		fmt.Fprint(p.err, usage)
		return exitUsage
	case "help", "-h", "-help", "--help":
		printHelp(p.out)
		return exitOK
	case "version", "-version", "--version":
		fmt.Fprint(p.out, version.String("lockctl"))
		return exitOK
	}
	minArgs, known := commandArgs[command]
	if !known {
		fmt.Fprintf(p.err, "lockctl: unknown command %q; run 'lockctl --help' for the commands\n", command)
		return exitUsage
	}
	o, fs, rest, err := parseFlags(command, args, lookupEnv)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprintf(p.out, "%s\nFlags of lockctl %s:\n", commandHelp[command], command)
		envflag.PrintFlags(p.out, fs)
		fmt.Fprintf(p.out, "\nlockctl --help describes every command and the exit statuses.\n")
		return exitOK
	}
	listen := err == nil && command == "elect" && o.listen
	if listen {
		minArgs = 1
		if len(rest) > 1 {
			err = fmt.Errorf("--listen takes NAME alone, no command: %q", rest[1:])
		}
	}
	if err == nil && len(rest) < minArgs {
		err = fmt.Errorf("%s needs %s", command, argumentCount(minArgs))
	}
	if maxArgs := minArgs + optionalArgs[command]; err == nil && !takesCommand(command) && len(rest) > maxArgs {
		err = fmt.Errorf("unexpected arguments: %q", rest[maxArgs:])
	}
	if err != nil {
		fmt.Fprintf(p.err, "lockctl %s: %v\nRun 'lockctl %s --help' for the flags.\n", command, err, command)
		return exitUsage
	}
	if command != "cluster" && command != "list" {
		if err := checkKey(rest[0]); err != nil {
			fmt.Fprintf(p.err, "lockctl %s: %v\n", command, err)
			return exitUsage
		}
	}
	switch command {
	case "acquire":
		if o.hold {
			return runHold(ctx, o, rest[0], p)
		}
		return runAcquire(ctx, o, rest[0], p)
	case "release":
		return runRelease(ctx, o, rest[0], rest[1], p)
	case "status":
		return runStatus(ctx, o, rest[0], p)
	case "list":
		prefix := ""
		if len(rest) == 1 {
			prefix = rest[0]
		}
		return runList(ctx, o, prefix, p)
	case "cluster":
		return runCluster(ctx, o, rest, p)
	}
	if listen {
		return runListen(ctx, o, rest[0], p)
	}
	if command == "elect" {
		return runElect(ctx, o, rest[0], rest[1:], p)
	}
	return runExec(ctx, o, rest[0], rest[1:], p)
}

// takesCommand reports whether command runs a command given after its key.
func takesCommand(command string) bool { return command == "exec" || command == "elect" }

// checkKey refuses a key the client would refuse, stating the rule.
func checkKey(key string) error {
	if !codec.ValidClientKey(key) {
		return fmt.Errorf("key %q: want 1..%d bytes of UTF-8 without spaces or line breaks", key, codec.MaxKeyLen)
	}
	return nil
}

// commandHelp is the head of lockctl COMMAND --help.
var commandHelp = map[string]string{
	"acquire": `usage: lockctl acquire [flags] KEY

Takes KEY and prints its fencing token. The lock stays held until
lockctl release KEY TOKEN, or until its --lease runs out. Exit status 0
when held, 75 when not acquired (KEY is held, the server is busy).

With --hold, like etcdctl lock NAME, lockctl keeps the lock, renewing
its lease every third of --lease, until SIGINT or SIGTERM, then releases
it and exits 0; 3 when the lock was lost first.
`,
	"release": `usage: lockctl release [flags] KEY TOKEN

Releases the grant TOKEN of KEY. Exit status 0 when released, 3 when the
grant was no longer held (NOT HELD: its lease ran out, or the token is
not current).
`,
	"exec": `usage: lockctl exec [flags] KEY -- CMD [ARG…]

Runs CMD while holding KEY, like flock(1), with the fencing token in
LOCKD_TOKEN and the key in LOCKD_KEY, renewing the lease (KEEP) every
third of --lease while CMD runs. CMD's process group gets SIGTERM --grace
before the lease may lapse and SIGKILL when it may have; what CMD left
running is killed before the lock is released. Exit status: CMD's, 75
when not acquired, 124 when lockctl had to signal CMD.
`,
	"elect": `usage: lockctl elect [flags] NAME -- CMD [ARG…]

Campaigns for leadership of NAME until it wins (or --wait runs out),
then runs CMD while leader, with the term (the fencing token; a later
leader's is always higher) in LOCKD_TERM and NAME in LOCKD_KEY. When
leadership can no longer be confirmed, CMD's process group gets SIGTERM,
and SIGKILL --grace later, before the lease could lapse. When CMD exits,
lockctl resigns so that the next candidate wins at once. Exit status:
CMD's, 75 when not elected within --wait, 124 when leadership was lost.

       lockctl elect --listen [flags] NAME

Like etcdctl elect --listen: campaigns for nothing, and prints the
leader's term at the start and at every change ("term N", or "no
leader"), from lockd's admin endpoint (--admin, --tenant), until SIGINT
or SIGTERM; exit status 0.
`,
	"status": `usage: lockctl status [flags] KEY

Shows KEY from lockd's admin endpoint (--admin): held, token, since when
and how long the token has been held, lease left, waiters, the node that
answered, the node whose client got the token (cluster mode) and the
remote address the grant went to (or the node that knows it). Needs no
secret.
`,
	"list": `usage: lockctl list [flags] [PREFIX]

Lists the held or waited-for keys (starting with PREFIX), sorted, from
lockd's admin endpoint (--admin). Needs no secret.
`,
	"cluster": `usage: lockctl cluster [flags] list
       lockctl cluster [flags] add ID ADDR
       lockctl cluster [flags] remove ID

Shows or changes a cluster's membership through one node's admin
endpoint (--admin). list shows each node's Raft address, whether the
node asked can reach it and how long since it last heard from it, its
groups and the groups it leads. To add a node, start it with lockd serve
--cluster --join and an empty --data-dir, then add it; to replace a dead
node, remove it and add a new one with a new id.
`,
}

// printHelp is lockctl --help: the usage, then every flag, once.
func printHelp(w io.Writer) {
	fmt.Fprintf(w, "%s\nFlags (release takes only --addr, --tenant, --secret-file and the --tls ones; --grace is exec's and elect's, --keepalive and --budget exec's, --hold acquire's, --listen elect's (with the --admin ones), and elect's --lease and --wait mean its own; status and list take only --admin, --admin-token-file, the --admin-ca, --admin-cert and --admin-key ones, --tenant and --json, and list --limit; cluster only the --admin ones and --json):\n", usage)
	exec := newFlagSet("exec", &options{})
	envflag.PrintFlags(w, exec)
	// Then every other command's flags exec has not: --hold, --listen,
	// the admin endpoint's.
	others := flag.NewFlagSet("others", flag.ContinueOnError)
	for _, command := range []string{"acquire", "elect", "list"} {
		newFlagSet(command, &options{}).VisitAll(func(f *flag.Flag) {
			if exec.Lookup(f.Name) == nil && others.Lookup(f.Name) == nil {
				others.Var(f.Value, f.Name, f.Usage)
			}
		})
	}
	envflag.PrintFlags(w, others)
}

func (o *options) secret() ([]byte, error) {
	text, source := o.envSecret, "LOCKD_SECRET"
	if o.secretFile != "" {
		b, err := privatefile.ReadFile(o.secretFile)
		if err != nil {
			return nil, fmt.Errorf("--secret-file: %w", err)
		}
		text, source = string(b), "--secret-file "+o.secretFile
	}
	secret, err := hex.DecodeString(strings.TrimSpace(text))
	if err != nil {
		return nil, fmt.Errorf("the secret from %s is not hex (make one with `openssl rand -hex 32`): %w", source, err)
	}
	return secret, nil
}

// dial connects to the servers. Its errors say which flags to fix.
func (o *options) dial(ctx context.Context) (*client.Client, error) {
	secret, err := o.secret()
	if err != nil {
		return nil, err
	}
	tlsCfg, err := o.tls.Config()
	if err != nil {
		return nil, err
	}
	// One call per process: no spare wait session is worth connecting ahead.
	c, err := client.Dial(ctx, client.Config{Addrs: o.addrs.addrs, Tenant: o.tenant, Secret: secret, Sessions: 1, WaitSpares: -1, TLS: tlsCfg})
	switch {
	case err == nil:
		return c, nil
	case errors.Is(err, client.ErrTLS):
		return nil, fmt.Errorf("TLS with %s failed; check --tls-ca, --tls-cert, --tls-key and --tls-server-name: %w", o.addrs.String(), err)
	case errors.Is(err, client.ErrAuth) && len(secret) == 0:
		return nil, fmt.Errorf("%s requires authentication: give --tenant and the tenant's secret in --secret-file or LOCKD_SECRET", o.addrs.String())
	case errors.Is(err, client.ErrAuth):
		return nil, fmt.Errorf("authentication as --tenant %q failed; check the secret in --secret-file or LOCKD_SECRET: %w", o.tenant, err)
	}
	return nil, err
}

func (o *options) acquireOptions() client.AcquireOptions {
	return client.AcquireOptions{Lease: o.lease, Wait: o.wait, MinWorkBudget: client.Budget(o.budget)}
}

// reportAcquireError prints why an acquire of key failed and returns the
// exit status. A lock that stayed held reads as one plain line, as flock
// -w users expect: the client's answer is indeterminate by design when a
// wait runs out (the server may grant at the last instant, and that grant
// lapses with its lease), but nobody who runs lockctl holds the lock.
// --verbose adds that answer.
func reportAcquireError(w io.Writer, o *options, cmd, key string, err error) int {
	// A bare ErrTimeout is the server's TIMEOUT; wrapped, the client's own
	// deadline came before the request left.
	held := err == client.ErrTimeout || errors.Is(err, client.ErrWaitElapsed)
	switch {
	case held && o.wait > 0:
		fmt.Fprintf(w, "lockctl: %s is held; not acquired within %v\n", key, o.wait)
	case held:
		fmt.Fprintf(w, "lockctl: %s is held; not acquired\n", key)
	case errors.Is(err, client.ErrBusy):
		fmt.Fprintf(w, "lockctl: %s: the server is busy (admission refused); not acquired, try again later\n", key)
	default:
		fmt.Fprintf(w, "lockctl %s: %v\n", cmd, err)
		return acquireExit(err)
	}
	if o.verbose {
		fmt.Fprintf(w, "lockctl %s: %v\n", cmd, err)
	}
	return acquireExit(err)
}

// acquireExit is the exit status of a failed acquire.
func acquireExit(err error) int {
	switch {
	case errors.Is(err, client.ErrWaitElapsed), errors.Is(err, client.ErrTimeout), errors.Is(err, client.ErrBusy), errors.Is(err, client.ErrUnavailable),
		errors.Is(err, client.ErrShuttingDown), errors.Is(err, client.ErrTokenExhausted):
		return exitNotAcquired
	case errors.Is(err, client.ErrBadKey), errors.Is(err, client.ErrUnsupportedDuration), errors.Is(err, client.ErrInsufficientLease):
		return exitUsage
	}
	return exitFailure
}

// untilSignal returns a context that ends when one of signals arrives,
// and a function that stops watching and returns that signal, or nil.
func untilSignal(ctx context.Context, signals <-chan os.Signal) (context.Context, func() os.Signal) {
	ctx, cancel := context.WithCancel(ctx)
	stop := make(chan struct{})
	got := make(chan os.Signal, 1)
	var watcher sync.WaitGroup
	watcher.Go(func() {
		select {
		case sig := <-signals:
			got <- sig
			cancel()
		case <-stop:
		}
	})
	return ctx, func() os.Signal {
		close(stop)
		watcher.Wait()
		cancel()
		select {
		case sig := <-got:
			return sig
		default:
			return nil
		}
	}
}

// signalExit is the status for signal sig: 128+N, as the shell reports it.
func signalExit(sig os.Signal) int {
	if s, ok := sig.(syscall.Signal); ok {
		return exitSignalBase + int(s)
	}
	return exitFailure
}

// signalName is SIGINT for syscall.SIGINT.
func signalName(sig os.Signal) string {
	if s, ok := sig.(syscall.Signal); ok {
		if name := unix.SignalName(s); name != "" {
			return name
		}
	}
	return sig.String()
}

// takeLock dials and acquires key for command. Until the lock is held a
// signal is meant for lockctl: it ends the wait, and a grant that raced
// it is released again. On failure it reports why and returns the exit
// status.
func takeLock(ctx context.Context, o *options, key, command string, p proc) (*client.Client, client.Ticket, int) {
	ctx, interrupted := untilSignal(ctx, p.signals)
	c, err := o.dial(ctx)
	var ticket client.Ticket
	if err == nil {
		ticket, err = c.Acquire(ctx, key, o.acquireOptions())
	}
	sig := interrupted()
	switch {
	case sig != nil:
		if err == nil {
			release(c, ticket, command, leaseBound(time.Now(), o.lease), p)
		}
		if c != nil {
			c.Close()
		}
		fmt.Fprintf(p.err, "lockctl %s: %s before %q was held: not acquired\n", command, signalName(sig), key)
		return nil, client.Ticket{}, signalExit(sig)
	case c == nil:
		fmt.Fprintf(p.err, "lockctl %s: %v\n", command, err)
		return nil, client.Ticket{}, exitFailure
	case err != nil:
		c.Close()
		return nil, client.Ticket{}, reportAcquireError(p.err, o, command, key, err)
	}
	return c, ticket, exitOK
}

func runAcquire(ctx context.Context, o *options, key string, p proc) int {
	c, ticket, code := takeLock(ctx, o, key, "acquire", p)
	if c == nil {
		return code
	}
	defer c.Close()
	fmt.Fprintln(p.out, ticket.Token())
	return exitOK
}

func runRelease(ctx context.Context, o *options, key, tokenText string, p proc) int {
	token, err := strconv.ParseUint(tokenText, 10, 64)
	if err != nil || token == 0 {
		fmt.Fprintf(p.err, "lockctl release: token %q: want the number lockctl acquire printed (1..%d)\n", tokenText, uint64(math.MaxUint64))
		return exitUsage
	}
	ctx, interrupted := untilSignal(ctx, p.signals)
	defer interrupted()
	c, err := o.dial(ctx)
	if err != nil {
		fmt.Fprintln(p.err, "lockctl release:", err)
		return exitFailure
	}
	defer c.Close()
	switch err := c.ReleaseToken(ctx, key, token); {
	case err == nil:
		return exitOK
	case errors.Is(err, client.ErrNotHeld):
		fmt.Fprintln(p.err, "lockctl release:", err)
		return exitNotHeld
	case errors.Is(err, client.ErrBadKey):
		fmt.Fprintln(p.err, "lockctl release:", err)
		return exitUsage
	default:
		fmt.Fprintln(p.err, "lockctl release:", err)
		return exitFailure
	}
}
