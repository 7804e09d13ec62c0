package server

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/rs/zerolog"

	"github.com/lockd/lockd/codec"
)

// testClientID is the client_id of the §6a tests' sessions.
var testClientID = [codec.ClientIDLen]byte{'c', 'l', 'i', 'e', 'n', 't', '-', 'a'}

// session sends SESSION with id and checks its P.
func (c *testConn) session(owner uint64, id [codec.ClientIDLen]byte) {
	c.t.Helper()
	c.send(codec.AppendSession(nil, owner, id))
	c.expect(codec.OpPong, owner)
}

func TestGreetingAdvertisesAbandonOnlyWhenServed(t *testing.T) {
	local := startServer(t, nil)
	if c := dial(t, local); c.greeting.Flags&codec.GreetingAbandon == 0 {
		t.Errorf("single mode's greeting flags %#x lack bit1", c.greeting.Flags)
	}
	other := startServer(t, func(cfg *Config) { cfg.Backend = new(grantingBackend) })
	c := dial(t, other)
	if c.greeting.Flags&codec.GreetingAbandon != 0 {
		t.Errorf("a backend without §6a advertises it: flags %#x", c.greeting.Flags)
	}
	// There SESSION is an unknown op.
	c.send(codec.AppendSession(nil, 1, testClientID))
	c.expectError(1, codec.BadRequest)
	c.expectClosed()
}

// laterAbandonBackend starts serving §6a after the server started, as a
// cluster node does once its groups' log format has risen.
type laterAbandonBackend struct {
	grantingBackend
	serves atomic.Bool
}

func (b *laterAbandonBackend) ServesAbandon() bool { return b.serves.Load() }

// Each connection's GREETING says whether the backend serves §6a then,
// and the connection keeps to what it was told.
func TestGreetingAdvertisesAbandonOnceTheBackendServesIt(t *testing.T) {
	b := new(laterAbandonBackend)
	s := startServer(t, func(cfg *Config) { cfg.Backend = b })
	before := dial(t, s)
	if before.greeting.Flags&codec.GreetingAbandon != 0 {
		t.Fatalf("bit1 set before the backend serves §6a: flags %#x", before.greeting.Flags)
	}
	b.serves.Store(true)
	after := dial(t, s)
	if after.greeting.Flags&codec.GreetingAbandon == 0 {
		t.Fatalf("bit1 missing once the backend serves §6a: flags %#x", after.greeting.Flags)
	}
	after.session(1, testClientID)
	after.send(codec.AppendAbandon(nil, 2, 7, "k"))
	after.expect(codec.OpNotHeld, 2)
	// The earlier connection was told §6a is not served: SESSION is still
	// an unknown op there.
	before.send(codec.AppendSession(nil, 1, testClientID))
	before.expectError(1, codec.BadRequest)
	before.expectClosed()
}

// An ACQUIRE whose answer its client never saw: the client abandons it
// from another connection of the same client_id, and the head waiter is
// granted at once; the same ACQUIRE arriving later is refused.
func TestAbandonReleasesTheGrantAndRefusesTheAcquireAfter(t *testing.T) {
	s := startServer(t, nil)
	lost := dial(t, s)
	lost.session(1, testClientID)
	lost.acquire(7, 30, 0, "k")
	lost.expect(codec.OpAcquired, 7)

	other := dial(t, s)
	other.acquire(20, 30, 60, "k")

	again := dial(t, s)
	again.session(1, testClientID)
	again.send(codec.AppendAbandon(nil, 2, 7, "k"))
	again.expect(codec.OpReleased, 2)
	other.expect(codec.OpAcquired, 20)

	// The same request again (the late copy of the ACQUIRE) is refused,
	// on any connection of the session, with any wait.
	again.acquire(7, 30, 60, "k")
	again.expect(codec.OpTimeout, 7)
	// Another owner of the session is not.
	again.acquire(8, 30, 0, "free")
	again.expect(codec.OpAcquired, 8)

	// A second ABANDON of the same request finds nothing.
	again.send(codec.AppendAbandon(nil, 3, 7, "k"))
	again.expect(codec.OpNotHeld, 3)
	st := s.backend.Stats()
	if st.AbandonsReleased != 1 || st.AbandonsNothing != 1 || st.TombstoneRefusals != 1 || st.Tombstones != 1 {
		t.Fatalf("stats: released %d nothing %d refusals %d tombstones %d", st.AbandonsReleased, st.AbandonsNothing, st.TombstoneRefusals, st.Tombstones)
	}
}

func TestAbandonDropsAQueuedWaiter(t *testing.T) {
	s := startServer(t, nil)
	holder := dial(t, s)
	token := holder.mustAcquire(1, "k")

	waiting := dial(t, s)
	waiting.session(1, testClientID)
	waiting.acquire(5, 30, 60, "k")
	behind := dial(t, s)
	behind.acquire(6, 30, 60, "k")
	waitFor(t, func() bool { return s.backend.Stats().Waiters == 2 })

	again := dial(t, s)
	again.session(1, testClientID)
	again.send(codec.AppendAbandon(nil, 2, 5, "k"))
	again.expect(codec.OpNotHeld, 2)
	// The waiter's own connection, were it still read, hears T.
	waiting.expect(codec.OpTimeout, 5)

	holder.send(codec.AppendRelease(nil, 2, token, "k"))
	holder.expect(codec.OpReleased, 2)
	behind.expect(codec.OpAcquired, 6)
	if st := s.backend.Stats(); st.AbandonsDroppedWaiter != 1 {
		t.Fatalf("waiters dropped: %d, want 1", st.AbandonsDroppedWaiter)
	}
}

// Another client_id, or a connection of another tenant, abandons nothing
// of the session's.
func TestAbandonTouchesOnlyItsOwnSessionsRequests(t *testing.T) {
	s := startServer(t, nil)
	c := dial(t, s)
	c.session(1, testClientID)
	c.mustAcquire(7, "k")

	stranger := dial(t, s)
	stranger.session(1, [codec.ClientIDLen]byte{'c', 'l', 'i', 'e', 'n', 't', '-', 'b'})
	stranger.send(codec.AppendAbandon(nil, 2, 7, "k"))
	stranger.expect(codec.OpNotHeld, 2)

	otherTenant := dial(t, s)
	otherTenant.send(codec.AppendHello(nil, [16]byte{}, [32]byte{}, "t2"))
	otherTenant.expect(codec.OpWelcome, 0)
	otherTenant.session(1, testClientID)
	otherTenant.send(codec.AppendAbandon(nil, 2, 7, "k"))
	otherTenant.expect(codec.OpNotHeld, 2)

	probe := dial(t, s)
	probe.acquire(3, 30, 0, "k")
	probe.expect(codec.OpTimeout, 3)
}

// ABANDON, like RELEASE, passes no admission limit: a connection at its
// --max-conn-inflight still has it answered.
func TestAbandonPassesNoAdmissionLimit(t *testing.T) {
	s := startServer(t, func(cfg *Config) { cfg.MaxConnInflight = 1 })
	holder := dial(t, s)
	holder.mustAcquire(1, "busy")

	c := dial(t, s)
	c.session(1, testClientID)
	c.acquire(2, 30, 60, "busy") // queued: the connection's one slot
	c.acquire(3, 30, 0, "free")
	c.expect(codec.OpBusy, 3)
	c.send(codec.AppendAbandon(nil, 4, 9, "free"))
	c.expect(codec.OpNotHeld, 4)
}

// lockedBuffer collects the server's log lines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// The client_id is a bearer secret (SPEC §6a): a distinctive one never
// shows in the server's logs at their most verbose, in /metrics, /healthz
// or the lock inspection, in any encoding a person or a tool would print
// it in.
func TestClientIDNeverShows(t *testing.T) {
	id := [codec.ClientIDLen]byte{0x5e, 0xc7, 0xe7, 0x1d, 'S', 'E', 'C', 'R', 'E', 'T', 0xa1, 0xb2, 0xc3, 0xd4, 0xe5, 0xf6}
	var logs lockedBuffer
	s := startServer(t, func(cfg *Config) {
		cfg.Admin = "127.0.0.1:0"
		cfg.Logger = zerolog.New(&logs).Level(zerolog.TraceLevel)
	})
	c := dial(t, s)
	c.session(1, id)
	c.mustAcquire(2, "k")
	c.acquire(3, 30, 60, "k")
	c.send(codec.AppendAbandon(nil, 4, 3, "k"))
	c.expect(codec.OpNotHeld, 4) // answered in the pass, the dropped waiter after it
	c.expect(codec.OpTimeout, 3)
	c.send(codec.AppendSession(nil, 5, id)) // a second SESSION: logged?
	c.expectError(5, codec.BadRequest)
	c.expectClosed()

	base := "http://" + s.AdminAddr()
	var seen strings.Builder
	for _, path := range []string{"/metrics", "/healthz", "/v1/locks/default/k", "/v1/locks/default"} {
		code, body := scrape(t, base+path)
		if code != http.StatusOK {
			t.Fatalf("%s: %d %s", path, code, body)
		}
		fmt.Fprintf(&seen, "%s\n%s\n", path, body)
	}
	if !strings.Contains(seen.String(), `lockd_requests_total{op="session"} 2`) {
		t.Fatal("/metrics does not count the sessions: the scrape is not of this server")
	}
	seen.WriteString(logs.String())
	forms := map[string]string{
		"raw":        string(id[:]),
		"text part":  "SECRET",
		"hex":        hex.EncodeToString(id[:]),
		"HEX":        strings.ToUpper(hex.EncodeToString(id[:])),
		"base64":     base64.StdEncoding.EncodeToString(id[:]),
		"base64 url": base64.RawURLEncoding.EncodeToString(id[:]),
		"Go bytes":   fmt.Sprint(id),
	}
	for name, form := range forms {
		if strings.Contains(seen.String(), form) {
			t.Errorf("the client_id shows (%s %q)", name, form)
		}
	}
}

// With auth required SESSION comes after WELCOME (SPEC §6a): before it,
// auth_required closes the connection; after it, the session is the
// tenant's, and its ABANDON reaches only that tenant's locks.
func TestSessionAfterWelcome(t *testing.T) {
	secrets := map[string][]byte{"alpha": []byte("a-secret"), "beta": []byte("b-secret")}
	s := startServer(t, func(cfg *Config) { cfg.Auth = secrets })
	early := dial(t, s)
	if early.greeting.Flags != codec.GreetingAuthRequired|codec.GreetingAbandon {
		t.Fatalf("greeting flags %#x, want auth and §6a", early.greeting.Flags)
	}
	early.send(codec.AppendSession(nil, 1, testClientID))
	early.expectError(1, codec.AuthRequired)
	early.expectClosed()

	alpha := dial(t, s)
	alpha.hello("alpha", secrets["alpha"])
	alpha.session(1, testClientID)
	alpha.mustAcquire(7, "k")
	beta := dial(t, s)
	beta.hello("beta", secrets["beta"])
	beta.session(1, testClientID)
	beta.send(codec.AppendAbandon(nil, 2, 7, "k"))
	beta.expect(codec.OpNotHeld, 2)
	alpha2 := dial(t, s)
	alpha2.hello("alpha", secrets["alpha"])
	alpha2.session(1, testClientID)
	alpha2.send(codec.AppendAbandon(nil, 2, 7, "k"))
	alpha2.expect(codec.OpReleased, 2)
}

// SESSION comes before any ACQUIRE (SPEC §6a), an ACQUIRE refused for
// one of its fields included: after it, SESSION is E bad_request and the
// connection closes.
func TestSessionAfterARefusedAcquireClosesTheConnection(t *testing.T) {
	s := startServer(t, nil)
	for _, tc := range []struct {
		name   string
		frame  []byte
		owner  uint64
		reason codec.Reason
	}{
		{"bad key", codec.AppendAcquire(nil, 1, 30, 0, "a b"), 1, codec.BadKey},
		{"bad lease", codec.AppendAcquire(nil, 1, 0, 0, "k"), 1, codec.BadLease},
		{"owner 0", codec.AppendAcquire(nil, 0, 30, 0, "k"), 0, codec.BadOwner},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dial(t, s)
			c.send(tc.frame)
			c.expectError(tc.owner, tc.reason)
			c.send(codec.AppendSession(nil, 2, testClientID))
			c.expectError(2, codec.BadRequest)
			c.expectClosed()
		})
	}
}

// An ABANDON whose own owner is in flight on the connection is E
// dup_owner, the connection open, and does nothing: no tombstone
// refuses the request it named.
func TestAbandonWithAnOwnerInFlightIsDupOwner(t *testing.T) {
	s := startServer(t, nil)
	holder := dial(t, s)
	holder.mustAcquire(1, "k")

	c := dial(t, s)
	c.session(1, testClientID)
	c.acquire(5, 30, 10, "k") // queued: owner 5 is in flight
	c.send(codec.AppendAbandon(nil, 5, 9, "other"))
	c.expectError(5, codec.DupOwner)
	c.expectOpen()
	c.acquire(9, 30, 0, "other")
	c.expect(codec.OpAcquired, 9)
}
