package server

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/lockd/lockd/codec"
	"github.com/lockd/lockd/engine"
	"github.com/lockd/lockd/internal/privatefile"
)

// MinSecretLen is the shortest tenant secret accepted: failed handshakes
// are cheap to repeat, so a short secret could be guessed online.
const MinSecretLen = 16

// makeSecret is how the errors about a secret say to make a good one.
const makeSecret = "make one with `openssl rand -hex 32`"

// AuthFile is what an auth file says: each tenant's secret, and the
// limits its line sets.
type AuthFile struct {
	Secrets map[string][]byte
	// Limits holds the fields a tenant's line sets (keys=N, waiters=N,
	// inflight=N); the others are 0, a fair share (TenantLimits).
	Limits map[string]engine.TenantLimits
	// Conns holds the connection shares the lines set (conns=N); a
	// tenant without one gets a fair share (Config.TenantConns).
	Conns map[string]int
}

// LoadAuthFile reads tenants and secrets from lines "tenant:hex-secret",
// spaces allowed around the colon, optionally followed by the tenant's
// own limits: "keys=N waiters=N inflight=N conns=N", any of them. Blank lines and
// lines starting with # are ignored. Errors name the file and the line. A
// file the group or others may access is refused (the fix is chmod 600):
// its secrets would authenticate anyone on the machine.
func LoadAuthFile(path string) (AuthFile, error) {
	data, err := privatefile.ReadFile(path)
	if err != nil {
		return AuthFile{}, err
	}
	auth, err := ParseAuth(bytes.NewReader(data))
	if err != nil {
		return AuthFile{}, fmt.Errorf("%s: %w", path, err)
	}
	return auth, nil
}

// ParseAuth parses the auth file format; see LoadAuthFile.
func ParseAuth(r io.Reader) (AuthFile, error) {
	auth := AuthFile{Secrets: make(map[string][]byte), Limits: make(map[string]engine.TenantLimits), Conns: make(map[string]int)}
	sc := bufio.NewScanner(r)
	for line := 1; sc.Scan(); line++ {
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		tenant, rest, ok := strings.Cut(text, ":")
		if !ok {
			return AuthFile{}, fmt.Errorf("line %d: want tenant:hex-secret (%s)", line, makeSecret)
		}
		tenant = strings.TrimSpace(tenant)
		fields := strings.Fields(rest)
		if !codec.ValidTenant([]byte(tenant)) {
			return AuthFile{}, fmt.Errorf("line %d: tenant %q is not 1..32 bytes of [A-Za-z0-9._-]", line, tenant)
		}
		if len(fields) == 0 {
			return AuthFile{}, fmt.Errorf("line %d: tenant %q has no secret; %s", line, tenant, makeSecret)
		}
		secret, err := hex.DecodeString(fields[0])
		if err != nil {
			return AuthFile{}, fmt.Errorf("line %d: the secret of %q is not hex; %s", line, tenant, makeSecret)
		}
		if len(secret) < MinSecretLen {
			return AuthFile{}, fmt.Errorf("line %d: the secret of %q has %d bytes, at least %d are needed against online guessing; %s",
				line, tenant, len(secret), MinSecretLen, makeSecret)
		}
		if _, dup := auth.Secrets[tenant]; dup {
			return AuthFile{}, fmt.Errorf("line %d: tenant %q appears twice", line, tenant)
		}
		limits, conns, err := parseTenantLimits(fields[1:])
		if err != nil {
			return AuthFile{}, fmt.Errorf("line %d: tenant %q: %w", line, tenant, err)
		}
		auth.Secrets[tenant] = secret
		auth.Limits[tenant] = limits
		if conns > 0 {
			auth.Conns[tenant] = conns
		}
	}
	if err := sc.Err(); err != nil {
		return AuthFile{}, err
	}
	if len(auth.Secrets) == 0 {
		return AuthFile{}, fmt.Errorf("no tenants: add tenant:hex-secret lines (%s)", makeSecret)
	}
	return auth, nil
}

// parseTenantLimits reads "keys=N waiters=N inflight=N conns=N", N >= 1.
func parseTenantLimits(fields []string) (l engine.TenantLimits, conns int, err error) {
	const want = "want keys=N, waiters=N, inflight=N or conns=N with N >= 1"
	for _, f := range fields {
		name, value, _ := strings.Cut(f, "=")
		n, err := strconv.Atoi(value)
		if err != nil || n < 1 {
			return l, 0, fmt.Errorf("%q: %s", f, want)
		}
		switch name {
		case "keys":
			l.Keys = n
		case "waiters":
			l.Waiters = n
		case "inflight":
			l.Inflight = n
		case "conns":
			conns = n
		default:
			return l, 0, fmt.Errorf("%q: %s", f, want)
		}
	}
	return l, conns, nil
}

// TenantConns is Config.TenantConns of the file: the conns=N of a
// tenant's line, 0 (a fair share) without one.
func (a AuthFile) TenantConns(tenant string) int { return a.Conns[tenant] }

// TenantLimits gives each tenant of the file its share of the global
// limits (keys, waiters, inflight): what its line sets, and for what it
// does not, a fair share — the limit divided by the number of tenants,
// rounded up — so that no tenant can take what the others are owed. A
// file of one tenant sets no shares of its own: the global gates are that
// tenant's. Tenants not in the file cannot authenticate and get none.
func (a AuthFile) TenantLimits(keys, waiters, inflight int) func(tenant string) engine.TenantLimits {
	n := len(a.Secrets)
	share := func(set, limit int) int {
		switch {
		case set > 0:
			return set
		case n < 2:
			return 0
		}
		return (limit + n - 1) / n
	}
	return func(tenant string) engine.TenantLimits {
		l, ok := a.Limits[tenant]
		if !ok {
			return engine.TenantLimits{}
		}
		return engine.TenantLimits{Keys: share(l.Keys, keys), Waiters: share(l.Waiters, waiters), Inflight: share(l.Inflight, inflight)}
	}
}
