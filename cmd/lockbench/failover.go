package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/lockd/lockd/bench"
)

// failoverOptions are the flags of the failover workload, which starts
// the clusters it measures instead of using --target.
type failoverOptions struct {
	clusters []string
	faults   []string
	victims  []string
	lockdBin string
	etcdBin  string
	dataDir  string
	stopFor  time.Duration
	// peerDelay and peerJitter delay every peer link (bench.FailoverConfig).
	peerDelay, peerJitter time.Duration
	nodeFlags             string
	// set names the flags given on the command line: the shared ones
	// (--duration, --callers, ...) replace the failover defaults only then.
	set map[string]bool
}

func (f *failoverOptions) register(fs *flag.FlagSet) func() error {
	clusters := fs.String("cluster", bench.FailoverLockd, "failover: comma-separated systems to start a 3-node cluster of and measure: lockd, etcd")
	faults := fs.String("fault", bench.FaultKill, "failover: comma-separated faults: kill (kill -9, started again 2 s later), term (SIGTERM, started again once it has exited, 2 s at the soonest), stop (SIGSTOP for --stop-for, then SIGCONT)")
	victims := fs.String("victim", bench.VictimLeader, "failover: comma-separated victims: leader (of the cluster's group), follower")
	fs.StringVar(&f.lockdBin, "lockd-bin", "", "failover: the lockd binary to start (default: lockd beside lockbench, else on the PATH)")
	fs.StringVar(&f.etcdBin, "etcd-bin", "etcd", "failover: the etcd binary to start")
	fs.DurationVar(&f.stopFor, "stop-for", bench.DefaultFailoverFrozen, "failover: how long the stop fault keeps the victim frozen (SIGSTOP to SIGCONT)")
	fs.DurationVar(&f.peerDelay, "peer-delay", 0, "failover: delay every byte between the nodes this long each way, through a relay on 127.0.0.1 in front of each node's peer port (0: none)")
	fs.DurationVar(&f.peerJitter, "peer-jitter", 0, "failover: with --peer-delay, vary each delay by up to this much either way (at most --peer-delay)")
	fs.StringVar(&f.nodeFlags, "node-flags", "", "failover: more flags for every node started, space-separated (with --peer-delay, a Raft tick that fits it: lockd --rtt-ms, etcd --heartbeat-interval and --election-timeout)")
	fs.StringVar(&f.dataDir, "data-dir", "", "failover: where the clusters' data directories go, on disk (default: $TMPDIR or /tmp)")
	return func() error {
		f.set = map[string]bool{}
		fs.Visit(func(fl *flag.Flag) { f.set[fl.Name] = true })
		f.clusters, f.faults, f.victims = splitList(*clusters), splitList(*faults), splitList(*victims)
		if len(f.clusters) == 0 || len(f.faults) == 0 || len(f.victims) == 0 {
			return usageError{errors.New("--cluster, --fault and --victim need at least one value each")}
		}
		if f.stopFor <= 0 {
			return usageError{fmt.Errorf("--stop-for %v: want a positive duration", f.stopFor)}
		}
		if f.peerDelay < 0 || f.peerJitter < 0 || f.peerJitter > f.peerDelay {
			return usageError{fmt.Errorf("--peer-delay %v --peer-jitter %v: want a delay of 0 or more and a jitter within it", f.peerDelay, f.peerJitter)}
		}
		return nil
	}
}

// binary is the server binary of system.
func (f *failoverOptions) binary(system string) (string, error) {
	if system == bench.FailoverEtcd {
		return exec.LookPath(f.etcdBin)
	}
	if f.lockdBin != "" {
		return f.lockdBin, nil
	}
	if self, err := os.Executable(); err == nil {
		beside := filepath.Join(filepath.Dir(self), "lockd")
		if _, err := os.Stat(beside); err == nil {
			return beside, nil
		}
	}
	path, err := exec.LookPath("lockd")
	if err != nil {
		return "", fmt.Errorf("no lockd binary beside lockbench or on the PATH: give --lockd-bin (make build puts one in bin/)")
	}
	return path, nil
}

// runFailovers runs the failover workload for every cluster, fault and
// victim given.
func runFailovers(ctx context.Context, o *options, stderr io.Writer) ([]*bench.Result, error) {
	f := &o.failover
	var results []*bench.Result
	for _, system := range f.clusters {
		bin, err := f.binary(system)
		if err != nil {
			return nil, err
		}
		for _, fault := range f.faults {
			for _, victim := range f.victims {
				if ctx.Err() != nil {
					return nil, ctx.Err()
				}
				cfg := bench.FailoverConfig{System: system, Bin: bin, Fault: fault, Victim: victim, Dir: f.dataDir, Frozen: f.stopFor,
					PeerDelay: f.peerDelay, PeerJitter: f.peerJitter, NodeFlags: strings.Fields(f.nodeFlags)}
				if f.set["duration"] {
					cfg.Duration = o.duration
				}
				if f.set["callers"] {
					cfg.Callers = o.callers[0]
				}
				if f.set["lease"] {
					cfg.Lease = o.target.Lease
				}
				cfg.Keys, cfg.Wait, cfg.Hold = o.keys, o.wait, o.hold
				if o.progress > 0 {
					cfg.Progress = stderr
				}
				fmt.Fprintf(stderr, "%s: failover, %s of the %s\n", system, fault, victim)
				res, err := bench.RunFailover(ctx, cfg)
				if err != nil {
					return nil, fmt.Errorf("%s failover %s %s: %w", system, fault, victim, err)
				}
				results = append(results, res)
			}
		}
	}
	return results, nil
}
