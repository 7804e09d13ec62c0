// Command lockctl takes, releases and holds lockd locks from the shell,
// like flock(1), `etcdctl lock` or `consul lock`.
package main

import (
	"context"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/lockd/lockd/client"
	"github.com/lockd/lockd/cmd/internal/envflag"
)

const usage = `usage:
  lockctl acquire [flags] KEY             take KEY and print its fencing token
  lockctl release [flags] KEY TOKEN       release the grant TOKEN of KEY
  lockctl exec [flags] KEY -- CMD [ARG…]  run CMD while holding KEY

exec runs CMD in its own process group with the fencing token in
LOCKD_TOKEN and the key in LOCKD_KEY, relays SIGINT, SIGTERM, SIGHUP and
SIGQUIT to it, sends it SIGTERM --grace before the lease may lapse and
SIGKILL when it may have, releases the lock when CMD exits, and exits with
CMD's status (128+N when a signal N ended it).

lockctl's own exit status: 0 done; 1 failure (connection, authentication,
outcome unknown); 2 usage; 3 release answered NOT HELD; 75 not acquired
(timeout, busy, unavailable, or --wait ran out on a lock that stayed held:
nothing is held by lockctl).

Every flag can also be set with LOCKD_<NAME> (--secret-file as
LOCKD_SECRET_FILE); a flag on the command line wins. The tenant's secret,
in hex as in lockd's auth file, is read from --secret-file, or else from
LOCKD_SECRET.

`

const (
	exitOK          = 0
	exitFailure     = 1
	exitUsage       = 2
	exitNotHeld     = 3
	exitNotAcquired = 75 // EX_TEMPFAIL
	// exitCannotRun and exitNotFound are the shell's statuses for a
	// command that could not be started.
	exitCannotRun = 126
	exitNotFound  = 127
)

// relayedSignals are passed on to exec's command.
var relayedSignals = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT}

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.LookupEnv, os.Stdin, os.Stdout, os.Stderr))
}

// stdio bundles the streams of one run.
type stdio struct {
	in       io.Reader
	out, err io.Writer
}

func run(ctx context.Context, args []string, lookupEnv func(string) (string, bool), stdin io.Reader, stdout, stderr io.Writer) int {
	streams := stdio{in: stdin, out: stdout, err: stderr}
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	command, args := args[0], args[1:]
	var minArgs int
	switch command {
	case "acquire":
		minArgs = 1
	case "release":
		minArgs = 2
	case "exec":
		minArgs = 2
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return exitOK
	default:
		fmt.Fprintf(stderr, "lockctl: unknown command %q\n\n%s", command, usage)
		return exitUsage
	}
	o, rest, err := parseFlags(command, args, lookupEnv, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err == nil && len(rest) < minArgs {
		err = fmt.Errorf("%s needs %d arguments", command, minArgs)
	}
	if err == nil && command != "exec" && len(rest) > minArgs {
		err = fmt.Errorf("unexpected arguments: %q", rest[minArgs:])
	}
	if err != nil {
		fmt.Fprintf(stderr, "lockctl %s: %v\n", command, err)
		return exitUsage
	}
	switch command {
	case "acquire":
		return runAcquire(ctx, o, rest[0], streams)
	case "release":
		return runRelease(ctx, o, rest[0], rest[1], streams)
	}
	argv := rest[1:]
	if argv[0] == "--" {
		argv = argv[1:]
	}
	if len(argv) == 0 {
		fmt.Fprintln(stderr, "lockctl exec: no command to run")
		return exitUsage
	}
	return runExec(ctx, o, rest[0], argv, streams)
}

type options struct {
	addrs       addrList
	tenant      string
	secretFile  string
	envSecret   string
	lease, wait time.Duration
	budget      time.Duration
	grace       time.Duration
}

// parseFlags reads the flags of command, with LOCKD_<NAME> environment
// variables as their defaults, and returns the arguments after them.
func parseFlags(command string, args []string, lookupEnv func(string) (string, bool), stderr io.Writer) (*options, []string, error) {
	o := &options{addrs: addrList{addrs: []string{"127.0.0.1:7420"}, replace: true}}
	fs := flag.NewFlagSet("lockctl "+command, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usage); fs.PrintDefaults() }
	fs.Var(&o.addrs, "addr", "server address host:port; repeat or separate with commas for several (default 127.0.0.1:7420)")
	fs.StringVar(&o.tenant, "tenant", "", "tenant name; required with a secret")
	fs.StringVar(&o.secretFile, "secret-file", "", "file holding the tenant's secret in hex")
	if command != "release" {
		fs.DurationVar(&o.lease, "lease", client.DefaultLease, "lease, rounded up to seconds, 1s..1h")
		fs.DurationVar(&o.wait, "wait", 0, "how long to wait for the lock, 0s..255s; 0 tries once")
		fs.DurationVar(&o.budget, "budget", 0, "validity the lock must have left when granted, else it is released again; 0s..250s")
	}
	if command == "exec" {
		fs.DurationVar(&o.grace, "grace", 2*time.Second, "SIGTERM the command this long before the lease may lapse, SIGKILL when it may have")
	}
	if err := envflag.Apply(fs, lookupEnv); err != nil {
		return nil, nil, err
	}
	o.addrs.replace = true
	o.envSecret, _ = lookupEnv("LOCKD_SECRET")
	if err := fs.Parse(args); err != nil {
		return nil, nil, err
	}
	if len(o.addrs.addrs) == 0 {
		return nil, nil, errors.New("--addr: no address")
	}
	if command == "exec" && (o.grace < 0 || o.grace >= o.lease) {
		return nil, nil, fmt.Errorf("--grace %v must be at least 0 and shorter than --lease %v", o.grace, o.lease)
	}
	return o, fs.Args(), nil
}

// addrList is a repeatable, comma-separated flag. Its defaults — the
// built-in one, or LOCKD_ADDR — are replaced by the first --addr given,
// not added to.
type addrList struct {
	addrs   []string
	replace bool
}

func (a *addrList) String() string { return strings.Join(a.addrs, ",") }

func (a *addrList) Set(v string) error {
	if a.replace {
		a.addrs, a.replace = nil, false
	}
	for _, addr := range strings.Split(v, ",") {
		if addr = strings.TrimSpace(addr); addr != "" {
			a.addrs = append(a.addrs, addr)
		}
	}
	return nil
}

func (o *options) secret() ([]byte, error) {
	text, source := o.envSecret, "LOCKD_SECRET"
	if o.secretFile != "" {
		b, err := os.ReadFile(o.secretFile)
		if err != nil {
			return nil, fmt.Errorf("secret: %w", err)
		}
		text, source = string(b), o.secretFile
	}
	secret, err := hex.DecodeString(strings.TrimSpace(text))
	if err != nil {
		return nil, fmt.Errorf("secret from %s is not hex: %w", source, err)
	}
	return secret, nil
}

func (o *options) dial(ctx context.Context) (*client.Client, error) {
	secret, err := o.secret()
	if err != nil {
		return nil, err
	}
	// One call per process: no spare wait session is worth connecting ahead.
	return client.Dial(ctx, client.Config{Addrs: o.addrs.addrs, Tenant: o.tenant, Secret: secret, Sessions: 1, WaitSpares: -1})
}

func (o *options) acquireOptions() client.AcquireOptions {
	return client.AcquireOptions{Lease: o.lease, Wait: o.wait, MinWorkBudget: client.Budget(o.budget)}
}

// waitElapsedNote is what lockctl adds when --wait ran out on a lock that
// stayed held: the client's answer is indeterminate by design (the server
// may grant at the last instant), but nobody who runs lockctl holds it.
const waitElapsedNote = "not acquired within --wait; a grant at the last instant would lapse with its lease"

// reportAcquireError prints why an acquire failed and returns the exit
// status.
func reportAcquireError(w io.Writer, cmd string, err error) int {
	if errors.Is(err, client.ErrWaitElapsed) {
		fmt.Fprintf(w, "lockctl %s: %s (%v)\n", cmd, waitElapsedNote, err)
	} else {
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

func runAcquire(ctx context.Context, o *options, key string, streams stdio) int {
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	c, err := o.dial(ctx)
	if err != nil {
		fmt.Fprintln(streams.err, "lockctl acquire:", err)
		return exitFailure
	}
	defer c.Close()
	ticket, err := c.Acquire(ctx, key, o.acquireOptions())
	if err != nil {
		return reportAcquireError(streams.err, "acquire", err)
	}
	fmt.Fprintln(streams.out, ticket.Token())
	return exitOK
}

func runRelease(ctx context.Context, o *options, key, tokenText string, streams stdio) int {
	token, err := strconv.ParseUint(tokenText, 10, 64)
	if err != nil {
		fmt.Fprintf(streams.err, "lockctl release: token %q: %v\n", tokenText, err)
		return exitUsage
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	c, err := o.dial(ctx)
	if err != nil {
		fmt.Fprintln(streams.err, "lockctl release:", err)
		return exitFailure
	}
	defer c.Close()
	switch err := c.ReleaseToken(ctx, key, token); {
	case err == nil:
		return exitOK
	case errors.Is(err, client.ErrNotHeld):
		fmt.Fprintln(streams.err, "lockctl release:", err)
		return exitNotHeld
	case errors.Is(err, client.ErrBadKey):
		fmt.Fprintln(streams.err, "lockctl release:", err)
		return exitUsage
	default:
		fmt.Fprintln(streams.err, "lockctl release:", err)
		return exitFailure
	}
}
