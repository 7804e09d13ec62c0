// Package tlsfiles loads the PEM files lockd's TLS ports and dialers use:
// a certificate with its private key, refused like any secret file when
// the key's mode lets the group or others in, and a bundle of CA
// certificates to verify the other side against.
package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"

	"github.com/lockd/lockd/internal/privatefile"
)

// LoadKeyPair reads a PEM certificate chain and its PEM private key.
func LoadKeyPair(certFile, keyFile string) (tls.Certificate, error) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("certificate: %w", err)
	}
	keyPEM, err := privatefile.ReadFile(keyFile)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("private key: %w", err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("%s and %s: %w", certFile, keyFile, err)
	}
	return pair, nil
}

// LoadCAPool reads a file of PEM CA certificates.
func LoadCAPool(path string) (*x509.CertPool, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("CA certificates: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, fmt.Errorf("CA certificates: %s: %w", path, errNoCertificate)
	}
	return pool, nil
}

var errNoCertificate = errors.New("no PEM certificate in the file")
