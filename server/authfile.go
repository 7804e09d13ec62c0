package server

import (
	"bufio"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/lockd/lockd/codec"
)

// MinSecretLen is the shortest tenant secret accepted: failed handshakes
// are cheap to repeat, so a short secret could be guessed online.
const MinSecretLen = 16

// LoadAuthFile reads tenants and secrets from lines "tenant:hex-secret".
// Blank lines and lines starting with # are ignored.
func LoadAuthFile(path string) (map[string][]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("server: auth file: %w", err)
	}
	defer f.Close()
	tenants, err := ParseAuth(f)
	if err != nil {
		return nil, fmt.Errorf("server: auth file %s: %w", path, err)
	}
	return tenants, nil
}

// ParseAuth parses the auth file format; see LoadAuthFile.
func ParseAuth(r io.Reader) (map[string][]byte, error) {
	tenants := make(map[string][]byte)
	sc := bufio.NewScanner(r)
	for line := 1; sc.Scan(); line++ {
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		tenant, hexSecret, ok := strings.Cut(text, ":")
		if !ok {
			return nil, fmt.Errorf("line %d: want tenant:hex-secret", line)
		}
		if !codec.ValidTenant([]byte(tenant)) {
			return nil, fmt.Errorf("line %d: tenant %q is not 1..32 bytes of [A-Za-z0-9._-]", line, tenant)
		}
		secret, err := hex.DecodeString(hexSecret)
		if err != nil {
			return nil, fmt.Errorf("line %d: secret is not hex", line)
		}
		if len(secret) < MinSecretLen {
			return nil, fmt.Errorf("line %d: secret of %d bytes; at least %d are needed against online guessing", line, len(secret), MinSecretLen)
		}
		if _, dup := tenants[tenant]; dup {
			return nil, fmt.Errorf("line %d: tenant %q appears twice", line, tenant)
		}
		tenants[tenant] = secret
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(tenants) == 0 {
		return nil, fmt.Errorf("no tenants")
	}
	return tenants, nil
}
