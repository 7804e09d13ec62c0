// Package tlsflags defines the client TLS flags lockctl and lockbench
// share (--tls-ca, --tls-cert, --tls-key, --tls-server-name) and turns
// them into a client.Config.TLS through client.LoadTLSConfig.
package tlsflags

import (
	"crypto/tls"
	"flag"
	"fmt"

	"github.com/lockd/lockd/client"
)

// Flags are the values of the TLS flags.
type Flags struct {
	CA, Cert, Key, ServerName string
}

// Register defines the flags on fs.
func (f *Flags) Register(fs *flag.FlagSet) {
	fs.StringVar(&f.CA, "tls-ca", "", "connect over TLS, verifying the server against the PEM CA certificates in this `file` (without it, the system's roots when another --tls flag turns TLS on)")
	fs.StringVar(&f.Cert, "tls-cert", "", "PEM client certificate `file`, for a server that requires one (lockd --tls-client-ca); turns TLS on")
	fs.StringVar(&f.Key, "tls-key", "", "PEM private key `file` of --tls-cert (mode 0600: refused when the group or others can read it)")
	fs.StringVar(&f.ServerName, "tls-server-name", "", "`name` the server's certificate must carry (default: the host of each --addr); turns TLS on")
}

// Enabled reports whether any TLS flag was given.
func (f *Flags) Enabled() bool {
	return f.CA != "" || f.Cert != "" || f.Key != "" || f.ServerName != ""
}

// Config is the client's TLS configuration: nil, plain TCP, when no TLS
// flag was given.
func (f *Flags) Config() (*tls.Config, error) {
	if !f.Enabled() {
		return nil, nil
	}
	cfg, err := client.LoadTLSConfig(f.CA, f.Cert, f.Key, f.ServerName)
	if err != nil {
		return nil, fmt.Errorf("--tls-ca, --tls-cert, --tls-key: %w", err)
	}
	return cfg, nil
}
