package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/lockd/lockd/client"
	"github.com/lockd/lockd/cmd/internal/envflag"
	"github.com/lockd/lockd/cmd/internal/tlsflags"
	"github.com/lockd/lockd/codec"
)

// This file owns lockctl's command line: where the command is among the
// arguments, each command's flags, and the checks of their values.

// options are the flag values of one run of lockctl.
type options struct {
	addrs       addrList
	tenant      string
	secretFile  string
	envSecret   string
	lease, wait time.Duration
	budget      time.Duration
	grace       time.Duration
	keepalive   bool
	hold        bool
	listen      bool
	verbose     bool
	tls         tlsflags.Flags
	// status, list, cluster and elect --listen:
	admin          string
	adminTokenFile string
	// adminCA, adminCert and adminKey: any of them speaks HTTPS to the
	// admin endpoint.
	adminCA, adminCert, adminKey string
	asJSON                       bool
	limit                        int
}

// newFlagSet defines the flags of command over o.
func newFlagSet(command string, o *options) *flag.FlagSet {
	o.addrs = addrList{addrs: []string{"127.0.0.1:7420"}, replace: true}
	fs := flag.NewFlagSet("lockctl "+command, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are returned, help is printed by run
	if usesAdmin(command) {
		defineAdminFlags(fs, command, o)
		return fs
	}
	fs.Var(&o.addrs, "addr", "server address `HOST:PORT`; repeat or separate with commas for several")
	fs.StringVar(&o.tenant, "tenant", "", "tenant `name`; required with a secret")
	fs.StringVar(&o.secretFile, "secret-file", "", "`file` holding the tenant's secret in hex")
	o.tls.Register(fs)
	switch command {
	case "acquire", "exec":
		envflag.DurationVar(fs, &o.lease, "lease", client.DefaultLease, "lease, rounded up to seconds, 1s..3600s")
		envflag.DurationVar(fs, &o.wait, "wait", 0, "how long to wait for the lock, rounded up to seconds, 0s..255s; 0 (the default) makes one attempt")
		envflag.DurationVar(fs, &o.budget, "budget", 0, "validity the lock must have left when granted, else it is released again; 0s..250s, default 0s")
	case "elect":
		envflag.DurationVar(fs, &o.lease, "lease", client.DefaultElectionLease, "lease of the leadership, renewed every third of it; a dead leader is replaced within it; 2s..3600s")
		envflag.DurationVar(fs, &o.wait, "wait", defaultElectWait, "how long to campaign before giving up, rounded up to seconds, 0s..255s; 0 makes one attempt (queued for at most 1s)")
	}
	if command == "elect" {
		fs.BoolVar(&o.listen, "listen", false, "campaign for nothing: print the leader's term at the start and at every change (\"term N\", or \"no leader\") until SIGINT or SIGTERM, from lockd's admin endpoint (--admin); needs no secret, and takes no command")
		defineAdminEndpointFlags(fs, o)
	}
	if takesCommand(command) {
		envflag.DurationVar(fs, &o.grace, "grace", 0, fmt.Sprintf("SIGTERM the command this long before the lease may lapse, SIGKILL when it may have (default a tenth of --lease, at most %v)", maxDefaultGrace))
	}
	if command == "acquire" {
		fs.BoolVar(&o.hold, "hold", false, "keep the lock, renewing its lease every third of --lease, until SIGINT or SIGTERM, then release it (like etcdctl lock NAME)")
	}
	if command == "exec" {
		fs.BoolVar(&o.keepalive, "keepalive", true, "renew the lease every third of --lease while the command runs; false stops the command at the lease")
	}
	if command != "release" {
		fs.BoolVar(&o.verbose, "verbose", false, "when the lock is not acquired, print the client's full answer too")
	}
	return fs
}

// parseFlags reads the flags of command, with LOCKD_<NAME> environment
// variables as their defaults, and returns the options, the flag set and
// the arguments after the flags. It returns flag.ErrHelp for --help.
func parseFlags(command string, args []string, lookupEnv func(string) (string, bool)) (*options, *flag.FlagSet, []string, error) {
	o := &options{}
	fs := newFlagSet(command, o)
	if err := envflag.Apply(fs, lookupEnv); err != nil {
		return nil, fs, nil, err
	}
	o.addrs.replace = true
	o.envSecret, _ = lookupEnv("LOCKD_SECRET")
	positional, err := parseInterleaved(fs, args, takesCommand(command))
	if err != nil {
		return nil, fs, nil, err
	}
	graceSet := false
	fs.Visit(func(f *flag.Flag) { graceSet = graceSet || f.Name == "grace" })
	if takesCommand(command) && !graceSet {
		o.grace = min(o.lease/10, maxDefaultGrace)
	}
	if err := o.check(command); err != nil {
		return nil, fs, nil, err
	}
	return o, fs, positional, nil
}

// defaultElectWait is elect's --wait: the longest wait there is, as a
// candidate usually waits for its turn.
const defaultElectWait = codec.MaxWaitSeconds * time.Second

// maxDefaultGrace caps the default --grace of a long lease.
const maxDefaultGrace = 2 * time.Second

// parseInterleaved parses args with flags anywhere among the positional
// arguments, which it returns in order. "--" ends the flags; with
// command, so does the first argument after the key, which starts the
// command to run: everything from there on is the command's.
func parseInterleaved(fs *flag.FlagSet, args []string, command bool) ([]string, error) {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		ended := len(rest) < len(args) && args[len(args)-len(rest)-1] == "--"
		if ended || len(rest) == 0 || (command && len(positional) == 1) {
			return append(positional, rest...), nil
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
}

// check refuses, before anything is sent, the flag values the client or
// the server would refuse, naming the flag.
func (o *options) check(command string) error {
	if o.tenant != "" && !codec.ValidTenant([]byte(o.tenant)) {
		return fmt.Errorf("--tenant %q: want 1..32 bytes of [A-Za-z0-9._-]", o.tenant)
	}
	if usesAdmin(command) {
		return o.checkAdmin(command)
	}
	if len(o.addrs.addrs) == 0 {
		return errors.New("--addr: no address")
	}
	if o.tenant == "" && (o.secretFile != "" || o.envSecret != "") {
		return errors.New("a secret (--secret-file or LOCKD_SECRET) needs --tenant (LOCKD_TENANT)")
	}
	switch command {
	case "release":
		return nil
	case "elect":
		if o.listen {
			return o.checkAdmin(command)
		}
		return o.checkElect()
	}
	lease, err := wholeSeconds("--lease", o.lease, 1, codec.MaxLeaseSeconds)
	if err != nil {
		return err
	}
	if _, err := wholeSeconds("--wait", o.wait, 0, codec.MaxWaitSeconds); err != nil {
		return err
	}
	budget, err := wholeSeconds("--budget", o.budget, 0, int64(client.MaxWorkBudget/time.Second))
	if err != nil {
		return err
	}
	if budget > lease {
		return fmt.Errorf("--budget %v exceeds --lease %v", o.budget, o.lease)
	}
	if command == "exec" && (o.grace < 0 || o.grace >= o.lease) {
		return fmt.Errorf("--grace %v must be at least 0 and shorter than --lease %v", o.grace, o.lease)
	}
	return nil
}

// checkElect checks elect's durations as client.Campaign would, naming
// the flags.
func (o *options) checkElect() error {
	lease, err := wholeSeconds("--lease", o.lease, 2, codec.MaxLeaseSeconds)
	if err != nil {
		return err
	}
	if _, err := wholeSeconds("--wait", o.wait, 0, codec.MaxWaitSeconds); err != nil {
		return err
	}
	leaseRounded := time.Duration(lease) * time.Second
	if o.grace < 0 || o.grace+leaseRounded/3 > leaseRounded-time.Second {
		return fmt.Errorf("--grace %v must be at least 0 and leave a renewal room: at most --lease %v less a third of it less 1s", o.grace, o.lease)
	}
	return nil
}

// wholeSeconds rounds d up to whole seconds, as the client does, and
// checks that the result is within lo..hi seconds.
func wholeSeconds(flagName string, d time.Duration, lo, hi int64) (int64, error) {
	s := int64((d + time.Second - 1) / time.Second)
	if d < 0 || s < lo || s > hi {
		return 0, fmt.Errorf("%s %s: want %ds..%ds, rounded up to whole seconds", flagName, envflag.Seconds(d), lo, hi)
	}
	return s, nil
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

// argumentCount is "1 argument", "2 arguments".
func argumentCount(n int) string {
	if n == 1 {
		return "1 argument"
	}
	return fmt.Sprintf("%d arguments", n)
}

// splitCommand finds the command among args, which may follow flags
// ("lockctl --addr HOST:PORT acquire KEY"), and returns it and the other
// arguments in order. A flag that takes a value is skipped with its
// value, as any command's flag set would read it; "--" ends the search.
// The command is "" when there is none.
func splitCommand(args []string) (string, []string) {
	for i := 0; i < len(args); i++ {
		arg := args[i]
		if arg == "--" {
			break
		}
		if !strings.HasPrefix(arg, "-") || arg == "-" {
			return arg, append(slices.Clone(args[:i]), args[i+1:]...)
		}
		name, _, inline := strings.Cut(strings.TrimLeft(arg, "-"), "=")
		if arg == "-version" || arg == "--version" || isHelpFlag(arg) {
			return arg, append(slices.Clone(args[:i]), args[i+1:]...)
		}
		if !inline && flagTakesValue(name) {
			i++
		}
	}
	return "", args
}

func isHelpFlag(arg string) bool { return arg == "-h" || arg == "-help" || arg == "--help" }

// flagTakesValue reports whether name is a flag of some command that is
// not a boolean, so that its value follows it.
func flagTakesValue(name string) bool {
	for command := range commandArgs {
		if f := newFlagSet(command, &options{}).Lookup(name); f != nil {
			b, ok := f.Value.(interface{ IsBoolFlag() bool })
			return !ok || !b.IsBoolFlag()
		}
	}
	return false
}
