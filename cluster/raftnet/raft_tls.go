package raftnet

import (
	"crypto/tls"
	"fmt"

	"github.com/lockd/lockd/internal/tlsfiles"
)

// LoadTLS builds the transport's TLS configuration (Factory.TLS) from PEM files: this node's
// certificate and key (the key refused when the group or others can read
// it) and the CA that signed every node's certificate. Each connection
// between nodes is then mutual TLS: both ends present their certificate
// and verify the other's against the CA, and a node dialling a peer also
// checks that the peer's certificate names the host of its Raft address
// (an IP or DNS subject alternative name). Every node runs the same build,
// so the transport asks for TLS 1.3.
func LoadTLS(certFile, keyFile, caFile string) (*tls.Config, error) {
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
