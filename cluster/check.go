package cluster

import (
	"fmt"

	"github.com/lockd/lockd/internal/netaddr"
)

// CheckConfig answers whether Start would accept cfg's settings, without
// starting anything: the node's place in --peers and its Raft exposure
// (plain TCP on an address other machines reach needs --insecure-raft).
// It neither opens the data dir nor binds a port, so `lockd serve
// --check-config` can run it where the node is about to start.
func CheckConfig(cfg Config) error {
	if err := cfg.applyDefaults(); err != nil {
		return err
	}
	return checkRaftExposure(cfg)
}

// checkRaftExposure refuses plain TCP Raft on an address other machines
// can reach, unless cfg.InsecureRaft: whoever reaches a Raft port without
// TLS can speak for any member (forge votes and higher terms, keeping a
// group without a leader) and feed the groups entries of its own.
func checkRaftExposure(cfg Config) error {
	if cfg.RaftTLS != nil || cfg.InsecureRaft {
		return nil
	}
	loopback, err := netaddr.IsLoopback(cfg.RaftAddr)
	if err != nil {
		return fmt.Errorf("cluster: raft address %q: %w", cfg.RaftAddr, err)
	}
	if !loopback {
		return fmt.Errorf("cluster: refusing plain TCP Raft on non-loopback %q: anyone who reaches it can disrupt or rewrite the cluster; give --raft-tls-cert, --raft-tls-key and --raft-tls-ca (mutual TLS), or --insecure-raft on a network only the nodes reach", cfg.RaftAddr)
	}
	return nil
}
