// Command lockd runs the lockd lock server. `lockd serve` starts single
// mode on 127.0.0.1:7420 with the admin endpoint on 127.0.0.1:7421.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/lockd/lockd/cluster"
	"github.com/lockd/lockd/cluster/raftnet"
	"github.com/lockd/lockd/cmd/internal/envflag"
	"github.com/lockd/lockd/cmd/internal/version"
	"github.com/lockd/lockd/engine"
	"github.com/lockd/lockd/internal/netaddr"
	"github.com/lockd/lockd/server"
	"github.com/rs/zerolog"
)

const usage = `usage: lockd serve [flags]
       lockd serve --check-config [flags]
       lockd serve --cluster --node-id N --raft-addr HOST:PORT --peers 1=HOST:PORT,2=...,3=... --data-dir DIR [--groups G] [flags]
       lockd --version

Every flag can also be set with the environment variable LOCKD_<NAME>
(for example --max-keys as LOCKD_MAX_KEYS); a flag on the command line wins.

Exit status: 0 after a clean shutdown (SIGTERM or SIGINT drains the
server), 1 when the server cannot start or fails, 2 for a usage error.
`

// Exit statuses besides 0.
const (
	exitFailure = 1
	exitUsage   = 2
)

func main() {
	os.Exit(run(os.Args[1:], os.LookupEnv, os.Stdout, os.Stderr))
}

// run is lockd given its arguments, environment and output streams; it
// returns the exit status.
func run(args []string, lookupEnv func(string) (string, bool), stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	switch args[0] {
	case "serve":
	case "help", "-h", "-help", "--help":
		// serve is the only command, so its help is lockd's.
		args = []string{"serve", "--help"}
	case "version", "-version", "--version":
		fmt.Fprint(stdout, version.String("lockd"))
		return 0
	default:
		fmt.Fprintf(stderr, "lockd: unknown command %q\n\n%s", args[0], usage)
		return exitUsage
	}
	opts, err := parseServeOptions(args[1:], lookupEnv)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprintf(stdout, "%s\nFlags of lockd serve:\n", usage)
		envflag.PrintFlags(stdout, opts.flags)
		return 0
	}
	var level zerolog.Level
	if err == nil {
		if level, err = zerolog.ParseLevel(opts.logLevel); err != nil {
			err = fmt.Errorf("--log-level %q: want trace, debug, info, warn or error", opts.logLevel)
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "lockd serve: %v\nRun 'lockd serve --help' for the flags.\n", err)
		return exitUsage
	}
	if opts.checkOnly {
		return checkConfig(opts, stdout, stderr)
	}
	if err := serve(opts, level); err != nil {
		fmt.Fprintln(stderr, "lockd:", err)
		return exitFailure
	}
	return 0
}

// serve runs the server until SIGTERM or SIGINT.
func serve(opts serveOptions, level zerolog.Level) error {
	if problems := loadFiles(&opts); len(problems) > 0 {
		return problems[0]
	}
	cfg := opts.server
	cfg.Logger = zerolog.New(os.Stderr).Level(level).With().Timestamp().Logger()

	_, gomaxprocsSet := os.LookupEnv("GOMAXPROCS")
	var procs int
	cfg.Loops, procs, opts.clusterCfg.MonitorAnchor = processorsFor(opts, gomaxprocsSet)
	if procs != runtime.GOMAXPROCS(0) {
		// Only when it changes: setting it at all stops the runtime from
		// following a change of the container's CPU limit.
		runtime.GOMAXPROCS(procs)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	var node *cluster.Node
	if opts.cluster {
		cc := opts.clusterCfg
		cc.MaxKeys, cc.MaxWaiters, cc.MaxInflight = cfg.Engine.MaxKeys, cfg.Engine.MaxWaiters, cfg.Engine.MaxInflight
		cc.TenantLimits = cfg.Engine.TenantLimits
		cc.Logger = cfg.Logger
		cc.Build = strings.ReplaceAll(strings.TrimSpace(version.String("lockd")), "\n", ", ")
		if wallClockHook != nil {
			cc.WallClock = wallClockHook(cc.DataDir)
		}
		if opts.raftListen != "" {
			ln, err := net.Listen("tcp", opts.raftListen)
			if err != nil {
				return fmt.Errorf("--raft-listen: %w", err)
			}
			cc.RaftListener = ln
		}
		var err error
		if node, err = cluster.Start(cc); err != nil {
			if cc.RaftListener != nil {
				cc.RaftListener.Close()
			}
			return err
		}
		defer node.Close()
		cfg.Backend = node
		cfg.AdminRoutes = map[string]http.Handler{cluster.AdminPrefix: node.MembersHandler()}
	} else {
		cfg.AdminRoutes = map[string]http.Handler{cluster.AdminPrefix: cluster.SingleModeHandler()}
	}
	srv, err := server.Start(cfg)
	if err != nil {
		return err
	}
	select {
	case <-ctx.Done():
		cfg.Logger.Info().Msg("signal received, draining")
		return srv.Close()
	case <-srv.Failed():
		// Already logged; exiting non-zero lets a supervisor restart it.
		return srv.Close()
	}
}

// loadFiles reads every file the flags name into opts: the auth file,
// the admin token and the TLS files of each port. It returns one error
// per flag group whose files cannot be used, each naming its flags.
func loadFiles(opts *serveOptions) []error {
	cfg := &opts.server
	var problems []error
	if opts.authFile != "" {
		if auth, err := server.LoadAuthFile(opts.authFile); err != nil {
			problems = append(problems, fmt.Errorf("--auth-file: %w", err))
		} else {
			cfg.Auth = auth.Secrets
			cfg.TenantConns = auth.TenantConns
			cfg.Engine.TenantLimits = auth.TenantLimits(cfg.Engine.MaxKeys, cfg.Engine.MaxWaiters, cfg.Engine.MaxInflight)
		}
	}
	var err error
	if opts.adminTokenFile != "" {
		if cfg.AdminToken, err = server.LoadAdminToken(opts.adminTokenFile); err != nil {
			problems = append(problems, fmt.Errorf("--admin-token-file: %w", err))
		}
	}
	if opts.tlsCert != "" {
		if cfg.TLS, err = server.LoadTLSConfig(opts.tlsCert, opts.tlsKey, opts.tlsClientCA); err != nil {
			problems = append(problems, fmt.Errorf("--tls-cert, --tls-key, --tls-client-ca: %w", err))
		}
	}
	if opts.adminTLS[0] != "" {
		if cfg.AdminTLS, err = server.LoadAdminTLSConfig(opts.adminTLS[0], opts.adminTLS[1], opts.adminTLS[2]); err != nil {
			problems = append(problems, fmt.Errorf("--admin-tls-cert, --admin-tls-key, --admin-tls-client-ca: %w", err))
		}
	}
	if opts.raftTLS[0] != "" {
		if opts.clusterCfg.RaftTLS, err = raftnet.LoadTLS(opts.raftTLS[0], opts.raftTLS[1], opts.raftTLS[2]); err != nil {
			problems = append(problems, fmt.Errorf("--raft-tls-cert, --raft-tls-key, --raft-tls-ca: %w", err))
		}
	}
	return problems
}

// processorsFor returns the event loops and the Go processors (P) a
// server runs with, and whether a cluster node runs its monitor anchor,
// given the flags and whether the GOMAXPROCS environment variable set the
// process's GOMAXPROCS.
//
// Single mode serving only the plain port runs as many Ps as loops. Every
// loop that finds nothing more to read calls runtime.Gosched inside gnet,
// and with a P idle beside it the runtime wakes a thread for that P, which
// finds nothing and sleeps again: two context switches per read that the
// loop's own wait does not need (docs/operations.md, Event loops). With no
// idle P there is nothing to wake, and what else the process runs —
// timers, the admin endpoint — gets a P back from the loop's blocking wait
// through the runtime's monitor thread. Cluster mode (Raft's goroutines)
// and the TLS port (a goroutine per connection) keep every P: their
// goroutines need Ps of their own; a cluster node adds one for its
// monitor anchor (cluster.Config.MonitorAnchor). An explicit GOMAXPROCS is
// the operator's and is kept as given, without an anchor, which would take
// one of those Ps.
func processorsFor(o serveOptions, gomaxprocsSet bool) (loops, gomaxprocs int, anchor bool) {
	procs := runtime.GOMAXPROCS(0)
	loops = o.server.Loops
	if loops <= 0 {
		loops = server.DefaultLoops()
	}
	switch {
	case gomaxprocsSet:
		return loops, procs, false
	case o.cluster:
		return loops, procs + 1, true
	case o.server.TLSListen != "" || loops >= procs:
		return loops, procs, false
	}
	return loops, loops, false
}

// serveOptions is everything `lockd serve` reads from flags.
type serveOptions struct {
	server   server.Config
	logLevel string
	authFile string
	// adminTokenFile holds the admin endpoint's bearer token; empty for
	// none.
	adminTokenFile string
	// The TLS port's files; all empty without --tls-listen.
	tlsCert, tlsKey, tlsClientCA string
	// adminTLS is --admin-tls-cert, --admin-tls-key and
	// --admin-tls-client-ca: the admin endpoint's HTTPS files, the first
	// two together, the CA only with them.
	adminTLS [3]string
	// raftTLS is --raft-tls-cert, --raft-tls-key and --raft-tls-ca: all
	// three or none.
	raftTLS [3]string
	// raftListen is --raft-listen: where the Raft port binds when its
	// peers reach it at --raft-addr through a relay; empty: --raft-addr.
	raftListen string
	cluster    bool
	clusterCfg cluster.Config
	// checkOnly is --check-config: check, start nothing.
	checkOnly bool
	flags     *flag.FlagSet // what they were read from, for --help
}

// parseServeOptions reads flags, with LOCKD_<NAME> environment variables
// as their defaults. It returns flag.ErrHelp for --help and -h.
func parseServeOptions(args []string, lookupEnv func(string) (string, bool)) (serveOptions, error) {
	var o serveOptions
	cfg := &o.server
	logLevel, authFile := &o.logLevel, &o.authFile
	cc := &o.clusterCfg
	var peers string
	var rttMs, frameBudgetMiB int
	fs := flag.NewFlagSet("lockd serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are returned, help is printed by run
	o.flags = fs
	fs.StringVar(&cfg.Listen, "listen", server.DefaultListen, "client protocol address")
	fs.StringVar(&cfg.Admin, "admin", server.DefaultAdmin, "admin HTTP address (/healthz, /metrics, /v1/locks/); empty for none")
	fs.StringVar(authFile, "auth-file", "", "file of tenant:hex-secret lines, each optionally with the tenant's keys=N waiters=N inflight=N conns=N (make a secret with openssl rand -hex 32); turns authentication on, and with two or more tenants, per-tenant quotas")
	fs.StringVar(&cfg.TLSListen, "tls-listen", "", "TLS client protocol address, beside --listen; needs --tls-cert and --tls-key")
	fs.StringVar(&o.tlsCert, "tls-cert", "", "PEM certificate chain of the TLS port")
	fs.StringVar(&o.tlsKey, "tls-key", "", "PEM private key of --tls-cert (mode 0600: refused when the group or others can read it)")
	fs.StringVar(&o.tlsClientCA, "tls-client-ca", "", "PEM CA certificates; turns mutual TLS on: TLS clients must present a certificate they signed")
	fs.BoolVar(&cfg.InsecureNoAuth, "insecure-no-auth", false, "allow auth off on a non-loopback address")
	fs.StringVar(&o.adminTokenFile, "admin-token-file", "", "file holding the admin endpoint's bearer token (mode 0600; make one with openssl rand -hex 32): every admin route but /healthz and /metrics then needs 'Authorization: Bearer TOKEN', and --admin may be on a non-loopback address")
	fs.StringVar(&o.adminTLS[0], "admin-tls-cert", "", "PEM certificate chain of the admin endpoint, which then serves HTTPS; needs --admin-tls-key")
	fs.StringVar(&o.adminTLS[1], "admin-tls-key", "", "PEM private key of --admin-tls-cert (mode 0600: refused when the group or others can read it)")
	fs.StringVar(&o.adminTLS[2], "admin-tls-client-ca", "", "PEM CA certificates; a client certificate they signed then authenticates for every admin route but /healthz and /metrics (as the --admin-token-file token does), and --admin may be on a non-loopback address; needs --admin-tls-cert")
	fs.BoolVar(&cfg.InsecureAdmin, "insecure-admin", false, "allow --admin without --admin-token-file or --admin-tls-client-ca on a non-loopback address")
	fs.IntVar(&cfg.AdminMaxConns, "admin-max-conns", server.DefaultAdminMaxConns, "admin connections served at once; more wait to be accepted")
	envflag.DurationVar(fs, &cfg.DrainGrace, "drain-grace", server.DefaultDrainGrace, "on SIGTERM, how long /healthz answers 503 before the ports close, for load balancers to notice (a start that fails exits at once)")
	fs.StringVar(&cfg.NodeName, "node-name", hostname(), "node name sent in the greeting (at most 64 bytes)")
	fs.IntVar(&cfg.Engine.MaxKeys, "max-keys", engine.DefaultMaxKeys, "hard limit of live keys")
	fs.IntVar(&cfg.Engine.MaxWaiters, "max-waiters", engine.DefaultMaxWaiters, "hard limit of queued waiters")
	fs.IntVar(&cfg.Engine.MaxInflight, "max-inflight", engine.DefaultMaxInflight, "hard limit of in-flight acquires")
	fs.Uint64Var(&cfg.Engine.FirstToken, "first-token", 0, "first fencing token, for a move to a new data dir: above the old process's lockd_token_highest_issued; refused below the data dir's mark (default: continue above the mark, 1 on a first start)")
	fs.IntVar(&cfg.MaxConns, "max-conns", server.DefaultMaxConns, "hard limit of client connections")
	fs.IntVar(&cfg.MaxHandshakes, "max-handshakes", 0, "with auth on, connections open before their HELLO is accepted, within --max-conns (0: an eighth of --max-conns, at most 1024); each must send HELLO within 2 s")
	fs.IntVar(&cfg.MaxConnInflight, "max-conn-inflight", server.DefaultMaxConnInflight, "hard limit of in-flight requests per connection")
	fs.IntVar(&cfg.MaxOpenTenants, "max-open-tenants", server.DefaultMaxOpenTenants, "with auth off, how many tenants besides \"default\" HELLO may name")
	fs.IntVar(&cfg.Loops, "loops", 0, "event loops (0 = GOMAXPROCS − 1, at least 1); single mode without --tls-listen then runs as many Go processors as loops unless GOMAXPROCS is set")
	fs.BoolVar(&o.checkOnly, "check-config", false, "check the flags, the files they name, the addresses and the data dir as serve would, print one line per problem, and exit (0: serve would start; 1: it would not) without starting anything; for an init container")
	fs.StringVar(logLevel, "log-level", "info", "trace, debug, info, warn or error")
	fs.BoolVar(&o.cluster, "cluster", false, "run as a node of a Raft-replicated cluster")
	fs.Uint64Var(&cc.NodeID, "node-id", 0, "cluster: this node's id, a key of --peers")
	fs.StringVar(&cc.RaftAddr, "raft-addr", "", "cluster: this node's Raft address (default: its --peers entry)")
	fs.StringVar(&o.raftListen, "raft-listen", "", "cluster: the address the Raft port binds when its peers reach it at --raft-addr through a relay, proxy or NAT (default: --raft-addr); plain TCP Raft binds only loopback without --raft-tls-cert, --raft-tls-key and --raft-tls-ca or --insecure-raft")
	fs.StringVar(&peers, "peers", "", "cluster: every node as id=host:port, comma-separated (3 or 5 nodes); with --join, this node's entry is enough")
	fs.BoolVar(&cc.Join, "join", false, "cluster: this node is new to a running cluster: start empty and wait until a member adds it (lockctl cluster add)")
	fs.StringVar(&cfg.DataDir, "data-dir", server.DefaultDataDir, "single mode: keeps the fencing-token mark, so tokens grow across restarts ('' runs volatile); cluster: the Raft log and snapshots, restarting with it rejoins; cluster mode needs it given explicitly")
	fs.IntVar(&cc.Groups, "groups", 0, fmt.Sprintf("cluster: Raft groups, fixed at bootstrap (0: the data dir's count, %d for a new one; a node joining a cluster needs the cluster's)", cluster.DefaultGroups))
	fs.IntVar(&rttMs, "rtt-ms", int(cluster.DefaultRTT/time.Millisecond), "cluster: Raft tick in ms (election timeout is 4-8 ticks, heartbeat every tick)")
	fs.BoolVar(&cc.FixedLeaders, "fixed-leaders", false, "cluster: never move a group's leadership, neither to the node proposing most of its requests nor, idle, to group 0's leader")
	fs.StringVar(&o.raftTLS[0], "raft-tls-cert", "", "cluster: PEM certificate of this node for mutual TLS between nodes, naming the host of its Raft address; with --raft-tls-key and --raft-tls-ca")
	fs.StringVar(&o.raftTLS[1], "raft-tls-key", "", "cluster: PEM private key of --raft-tls-cert (mode 0600)")
	fs.StringVar(&o.raftTLS[2], "raft-tls-ca", "", "cluster: PEM CA certificates every node's certificate must verify against")
	fs.BoolVar(&cc.InsecureRaft, "insecure-raft", false, "cluster: allow plain TCP Raft on a non-loopback --raft-addr (anyone who reaches it can disrupt the cluster); without it such an address needs --raft-tls-cert, --raft-tls-key and --raft-tls-ca")
	fs.IntVar(&frameBudgetMiB, "raft-frame-budget-mib", raftnet.DefaultFrameBudget>>20, fmt.Sprintf("cluster: MiB of Raft frame bodies past 64 KiB that peers' connections hold at once (at least %d); a frame waits for its share rather than grow the node past it", raftnet.MinFrameBudget>>20))
	envflag.DurationVar(fs, &cc.ProposeTimeout, "propose-timeout", cluster.DefaultProposeTimeout, "cluster: answer E unavailable when a group has not committed a request in this time")

	if err := envflag.Apply(fs, lookupEnv); err != nil {
		return o, err
	}
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	if cfg.TLSListen == "" && (o.tlsCert != "" || o.tlsKey != "" || o.tlsClientCA != "") {
		return o, errors.New("--tls-cert, --tls-key and --tls-client-ca need --tls-listen")
	}
	if cfg.TLSListen != "" && (o.tlsCert == "" || o.tlsKey == "") {
		return o, errors.New("--tls-listen needs --tls-cert and --tls-key")
	}
	if cfg.Admin == "" && o.adminTLS != [3]string{} {
		return o, errors.New("--admin-tls-cert, --admin-tls-key and --admin-tls-client-ca need --admin")
	}
	if (o.adminTLS[0] == "") != (o.adminTLS[1] == "") || (o.adminTLS[2] != "" && o.adminTLS[0] == "") {
		return o, errors.New("--admin-tls-cert and --admin-tls-key go together, and --admin-tls-client-ca needs them")
	}
	raftTLSFlags := 0
	for _, f := range o.raftTLS {
		if f != "" {
			raftTLSFlags++
		}
	}
	if raftTLSFlags != 0 && raftTLSFlags != len(o.raftTLS) {
		return o, errors.New("--raft-tls-cert, --raft-tls-key and --raft-tls-ca go together: give all three or none")
	}
	if !o.cluster {
		if o.raftListen != "" {
			return o, errors.New("--raft-listen needs --cluster")
		}
		if raftTLSFlags != 0 {
			return o, errors.New("--raft-tls-cert, --raft-tls-key and --raft-tls-ca need --cluster")
		}
		if cc.Join {
			return o, errors.New("--join needs --cluster")
		}
		return o, nil
	}
	// A node's Raft state is never put in the single-mode default.
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "data-dir" {
			cc.DataDir = cfg.DataDir
		}
	})
	if peers == "" || cc.NodeID == 0 || cc.DataDir == "" {
		return o, errors.New("--cluster needs --node-id, --peers and --data-dir")
	}
	p, err := cluster.ParsePeers(peers)
	if err != nil {
		return o, err
	}
	cc.Peers = p
	if o.raftListen != "" && raftTLSFlags == 0 && !cc.InsecureRaft {
		// The Raft port's exposure rule (cluster.CheckConfig) for where it binds.
		if loopback, err := netaddr.IsLoopback(o.raftListen); err != nil || !loopback {
			return o, fmt.Errorf("--raft-listen %s: plain TCP Raft binds only a loopback address; give --raft-tls-cert, --raft-tls-key and --raft-tls-ca, or --insecure-raft on a network only the nodes reach", o.raftListen)
		}
	}
	cc.RaftFrameBudget = frameBudgetMiB << 20
	if rttMs > 0 {
		cc.RTT = time.Duration(rttMs) * time.Millisecond
	}
	return o, nil
}

func hostname() string {
	h, err := os.Hostname()
	if err != nil {
		return "lockd"
	}
	return h
}
