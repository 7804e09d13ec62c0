package server

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"fmt"
	"io"
	"strings"

	"github.com/lockd/lockd/codec"
	"github.com/lockd/lockd/internal/privatefile"
)

// MinSecretLen is the shortest tenant secret accepted: failed handshakes
// are cheap to repeat, so a short secret could be guessed online.
const MinSecretLen = 16

// makeSecret is how the errors about a secret say to make a good one.
const makeSecret = "make one with `openssl rand -hex 32`"

// LoadAuthFile reads tenants and secrets from lines "tenant:hex-secret",
// spaces allowed around the colon. Blank lines and lines starting with #
// are ignored. Errors name the file and the line. A file the group or
// others may access is refused (the fix is chmod 600): its secrets would
// authenticate anyone on the machine.
func LoadAuthFile(path string) (map[string][]byte, error) {
	data, err := privatefile.ReadFile(path)
	if err != nil {
		return nil, err
	}
	tenants, err := ParseAuth(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
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
			return nil, fmt.Errorf("line %d: want tenant:hex-secret (%s)", line, makeSecret)
		}
		tenant, hexSecret = strings.TrimSpace(tenant), strings.TrimSpace(hexSecret)
		if !codec.ValidTenant([]byte(tenant)) {
			return nil, fmt.Errorf("line %d: tenant %q is not 1..32 bytes of [A-Za-z0-9._-]", line, tenant)
		}
		secret, err := hex.DecodeString(hexSecret)
		if err != nil {
			return nil, fmt.Errorf("line %d: the secret of %q is not hex; %s", line, tenant, makeSecret)
		}
		if len(secret) < MinSecretLen {
			return nil, fmt.Errorf("line %d: the secret of %q has %d bytes, at least %d are needed against online guessing; %s",
				line, tenant, len(secret), MinSecretLen, makeSecret)
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
		return nil, fmt.Errorf("no tenants: add tenant:hex-secret lines (%s)", makeSecret)
	}
	return tenants, nil
}
