package client

import (
	"crypto/tls"
	"errors"
	"fmt"

	"github.com/lockd/lockd/internal/tlsfiles"
)

// LoadTLSConfig builds a Config.TLS from PEM files: caFile, the CA
// certificates the server's certificate must verify against (empty: the
// system's roots); certFile and keyFile, this client's certificate for a
// server that requires one (mutual TLS), both or neither, the key refused
// when the group or others can read it; serverName, the name the server's
// certificate must carry (empty: each address's host).
func LoadTLSConfig(caFile, certFile, keyFile, serverName string) (*tls.Config, error) {
	cfg := &tls.Config{ServerName: serverName, MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pool, err := tlsfiles.LoadCAPool(caFile)
		if err != nil {
			return nil, fmt.Errorf("%w: TLS %w", ErrConfig, err)
		}
		cfg.RootCAs = pool
	}
	if (certFile == "") != (keyFile == "") {
		return nil, fmt.Errorf("%w: %w", ErrConfig, errCertWithoutKey)
	}
	if certFile != "" {
		pair, err := tlsfiles.LoadKeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("%w: TLS %w", ErrConfig, err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

var errCertWithoutKey = errors.New("a TLS client certificate needs its key, and a key its certificate")
