package client

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/lockd/lockd/client/lockdtest"
	"github.com/lockd/lockd/codec"
)

// downOnCutPeer offers SPEC §6a and goes down at the first ACQUIRE of the
// key "cut": it closes that connection and stops accepting, a node killed
// after the request may have reached it. It grants the other keys and
// answers ABANDON RELEASED.
func downOnCutPeer(t *testing.T) *peer {
	return startAbandonPeer(t, func(p *peer, c *lockdtest.Conn, f frame) {
		switch {
		case f.op == codec.OpAcquire && f.key == "cut":
			c.Close()
			// Close waits for the scripts, this one included.
			go p.srv.Close()
		case f.op == codec.OpAbandon:
			c.Reply(codec.OpReleased, f.owner)
		default:
			grant(p, c, f)
		}
	})
}

// The ABANDON of an acquire whose node went down goes to another node of
// the client (SPEC §6a: "to another node when one is down"), with a fresh
// owner, naming the acquire's owner and key.
func TestAbandonGoesToAnotherNodeWhenOneIsDown(t *testing.T) {
	clk := newFakeClock()
	a, b := downOnCutPeer(t), downOnCutPeer(t)
	c := newClient(t, a, clk, func(cfg *Config) {
		cfg.Addrs = []string{a.srv.Addr(), b.srv.Addr()}
		cfg.Sessions = 2
	})

	_, err := c.Acquire(context.Background(), "cut", waitFor(0))
	if !errors.Is(err, ErrIndeterminate) || !strings.Contains(err.Error(), "ABANDON is queued") {
		t.Fatalf("got %v, want ErrIndeterminate with an ABANDON queued", err)
	}
	eventually(t, "the ABANDON is answered", func() bool { return c.Stats().AbandonsReleased == 1 })
	down, up := a, b
	if len(b.seen(codec.OpAcquire)) == 1 {
		down, up = b, a
	}
	acq := down.seen(codec.OpAcquire)
	if len(acq) != 1 || len(up.seen(codec.OpAcquire)) != 0 {
		t.Fatalf("acquires %+v on one node, %+v on the other; want one in all", acq, up.seen(codec.OpAcquire))
	}
	ab := up.seen(codec.OpAbandon)
	if len(ab) != 1 || len(down.seen(codec.OpAbandon)) != 0 {
		t.Fatalf("abandons %+v on the node up, %+v on the node down; want one, on the node up", ab, down.seen(codec.OpAbandon))
	}
	if ab[0].target != acq[0].owner || ab[0].key != "cut" || ab[0].owner == acq[0].owner {
		t.Fatalf("abandon %+v for acquire %+v: want its owner and key as target, a fresh owner", ab[0], acq[0])
	}
}

// In a pool where one server offers SPEC §6a and another does not (a
// rolling upgrade), an ABANDON is sent only where GREETING bit1 was set:
// on the other server it is an unknown op that would close a session
// other calls share.
func TestAbandonIsSentOnlyToAServerThatOffersIt(t *testing.T) {
	clk := newFakeClock()
	offers := startCutPeer(t)
	without := startFlagsPeer(t, grant, nil, 0)
	c := newClient(t, offers.peer, clk, func(cfg *Config) {
		cfg.Addrs = []string{offers.srv.Addr(), without.srv.Addr()}
		cfg.Sessions = 2
	})

	// Sessions are picked round-robin: the first acquire to reach the
	// server that offers §6a is cut and abandoned; the other server grants.
	for range 10 {
		_, err := c.Acquire(context.Background(), "cut", waitFor(0))
		if err == nil {
			continue
		}
		if !errors.Is(err, ErrIndeterminate) || !strings.Contains(err.Error(), "ABANDON is queued") {
			t.Fatalf("got %v, want ErrIndeterminate with an ABANDON queued", err)
		}
		break
	}
	eventually(t, "the ABANDON is answered or reaches the wrong server", func() bool {
		return c.Stats().AbandonsReleased == 1 || len(without.seen(codec.OpAbandon)) != 0
	})
	if n := len(without.seen(codec.OpSession)) + len(without.seen(codec.OpAbandon)); n != 0 {
		t.Fatalf("%d SESSION or ABANDON frames sent to the server without §6a", n)
	}
	if n := len(offers.seen(codec.OpAbandon)); n != 1 {
		t.Fatalf("%d ABANDONs reached the server that offers them, want 1", n)
	}
}

// The client_id is a bearer secret (SPEC §6a): printing a Client, as a
// debugging caller might, shows none of its bytes in any verb.
func TestPrintingAClientDoesNotShowItsClientID(t *testing.T) {
	p := startAbandonPeer(t, grant)
	c := newClient(t, p, newFakeClock(), nil)
	id := *c.clientID
	printed := fmt.Sprintf("%v %+v %#v", c, c, c)
	for name, form := range map[string]string{
		"decimal bytes": strings.Trim(fmt.Sprint(id), "[]"),
		"Go syntax":     strings.TrimPrefix(fmt.Sprintf("%#v", id), "[16]uint8"),
		"hex":           hex.EncodeToString(id[:]),
		"HEX":           strings.ToUpper(hex.EncodeToString(id[:])),
		"raw":           string(id[:]),
	} {
		if strings.Contains(printed, form) {
			t.Errorf("printing the client shows its client_id (%s)", name)
		}
	}
}
