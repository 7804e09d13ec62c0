package cluster

import (
	"crypto/tls"
	"fmt"

	"github.com/lockd/lockd/internal/netaddr"
	"github.com/lockd/lockd/internal/tlsfiles"
)

// LoadRaftTLS builds Config.RaftTLS from PEM files: this node's
// certificate and key (the key refused when the group or others can read
// it) and the CA that signed every node's certificate. Each connection
// between nodes is then mutual TLS: both ends present their certificate
// and verify the other's against the CA, and a node dialling a peer also
// checks that the peer's certificate names the host of its Raft address
// (an IP or DNS subject alternative name). Every node runs the same build,
// so the transport asks for TLS 1.3.
func LoadRaftTLS(certFile, keyFile, caFile string) (*tls.Config, error) {
	pair, err := tlsfiles.LoadKeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("cluster: raft TLS %w", err)
	}
	pool, err := tlsfiles.LoadCAPool(caFile)
	if err != nil {
		return nil, fmt.Errorf("cluster: raft TLS %w", err)
	}
	return &tls.Config{
		Certificates: []tls.Certificate{pair},
		RootCAs:      pool,
		ClientCAs:    pool,
		ClientAuth:   tls.RequireAndVerifyClientCert,
		MinVersion:   tls.VersionTLS13,
	}, nil
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
