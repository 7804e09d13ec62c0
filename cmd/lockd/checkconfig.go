package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/lockd/lockd/cluster"
	"github.com/lockd/lockd/server"
	"golang.org/x/sys/unix"
)

// resolveTimeout bounds the lookup of one address's host name.
const resolveTimeout = 2 * time.Second

// checkConfig is `lockd serve --check-config`: it reads every file the
// flags name, checks every address and the data dir, and the exposure
// rules serve applies, and starts nothing: no port is bound and the data
// dir is not written. An init container runs it with the server's own
// arguments. It writes one line per problem and returns the exit status:
// 0 when serve would accept the configuration, 1 otherwise.
func checkConfig(opts serveOptions, stdout, stderr io.Writer) int {
	problems := loadFiles(&opts)
	problems = append(problems, checkAddresses(opts)...)
	problems = append(problems, checkExposure(opts)...)
	problems = append(problems, checkDataDir(opts.server.DataDir)...)
	if opts.cluster {
		cc := opts.clusterCfg
		if opts.raftTLS[0] != "" && cc.RaftTLS == nil {
			// Its files' problem is reported above; the exposure rule is
			// met once they load.
			cc.RaftTLS = &tls.Config{}
		}
		if err := cluster.CheckConfig(cc); err != nil {
			problems = append(problems, err)
		}
	}
	for _, p := range problems {
		fmt.Fprintf(stderr, "lockd serve --check-config: %v\n", p)
	}
	if len(problems) > 0 {
		return exitFailure
	}
	mode := "single mode"
	if opts.cluster {
		mode = fmt.Sprintf("cluster node %d", opts.clusterCfg.NodeID)
	}
	fmt.Fprintf(stdout, "lockd serve --check-config: ok (%s)\n", mode)
	return 0
}

// checkAddresses checks that every address is HOST:PORT with a port
// number, and that the host names this node binds resolve. Peers'
// names are checked for form only: in a StatefulSet a peer's name exists
// only once its pod does.
func checkAddresses(opts serveOptions) []error {
	type address struct{ flag, addr string }
	bound := []address{{"--listen", opts.server.Listen}, {"--admin", opts.server.Admin}, {"--tls-listen", opts.server.TLSListen}}
	var peers []address
	if opts.cluster {
		own := opts.clusterCfg.RaftAddr
		if own == "" {
			own = opts.clusterCfg.Peers[opts.clusterCfg.NodeID]
		}
		bound = append(bound, address{"--raft-addr", own}, address{"--raft-listen", opts.raftListen})
		for _, id := range slices.Sorted(maps.Keys(opts.clusterCfg.Peers)) {
			if id != opts.clusterCfg.NodeID {
				peers = append(peers, address{fmt.Sprintf("--peers %d", id), opts.clusterCfg.Peers[id]})
			}
		}
	}
	var problems []error
	check := func(a address, bound bool) {
		if a.addr == "" {
			return
		}
		host, port, err := net.SplitHostPort(a.addr)
		if err == nil {
			if n, perr := strconv.ParseUint(port, 10, 16); perr != nil || (n == 0 && !bound) {
				err = fmt.Errorf("port %q is not a number in 1..65535", port)
			}
		}
		if err == nil && bound && host != "" && net.ParseIP(host) == nil {
			ctx, cancel := context.WithTimeout(context.Background(), resolveTimeout)
			defer cancel()
			if _, lerr := net.DefaultResolver.LookupHost(ctx, host); lerr != nil {
				err = fmt.Errorf("host %q does not resolve: %w", host, lerr)
			}
		}
		if err != nil {
			problems = append(problems, fmt.Errorf("%s %s: %w", a.flag, a.addr, err))
		}
	}
	for _, a := range bound {
		check(a, true)
	}
	for _, a := range peers {
		check(a, false)
	}
	return problems
}

// checkExposure applies serve's rule for the client and admin ports
// (server.CheckExposure) to the configuration as it will be once its
// files load: a file named but unreadable is reported by loadFiles, and
// here counts as given.
func checkExposure(opts serveOptions) []error {
	cfg := opts.server
	if opts.authFile != "" && cfg.Auth == nil {
		cfg.Auth = map[string][]byte{}
	}
	if opts.adminTokenFile != "" && cfg.AdminToken == nil {
		cfg.AdminToken = []byte{}
	}
	if opts.adminTLS[2] != "" && (cfg.AdminTLS == nil || cfg.AdminTLS.ClientCAs == nil) {
		cfg.AdminTLS = &tls.Config{ClientCAs: x509.NewCertPool()}
	}
	return server.CheckExposure(cfg)
}

// checkDataDir checks that lockd can create or write dir, without
// writing it ("" runs volatile).
func checkDataDir(dir string) []error {
	if dir == "" {
		return nil
	}
	existing := dir
	for {
		info, err := os.Stat(existing)
		if errors.Is(err, os.ErrNotExist) && filepath.Dir(existing) != existing {
			existing = filepath.Dir(existing)
			continue
		}
		if err != nil {
			return []error{fmt.Errorf("--data-dir %s: %w", dir, err)}
		}
		if !info.IsDir() {
			return []error{fmt.Errorf("--data-dir %s: %s is not a directory", dir, existing)}
		}
		break
	}
	if err := unix.Access(existing, unix.W_OK|unix.X_OK); err != nil {
		return []error{fmt.Errorf("--data-dir %s: %s is not writable by this user (uid %d): %w", dir, existing, os.Getuid(), err)}
	}
	return nil
}
