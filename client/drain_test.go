package client

import (
	"errors"
	"testing"
	"time"

	"github.com/lockd/lockd/client/lockdtest"
	"github.com/lockd/lockd/codec"
)

// A caller whose waiting acquire a draining server refused (E
// shutting_down, which closes the session) and that calls again at once
// goes to another session, never into the one about to close: there its
// next acquire would have been sent and then ended lost, an indeterminate
// outcome from a drain. The session's reader is held between delivering
// the refusal and closing the session, the window the next call fell in.
func TestRefusalThatClosesTheSessionTakesNoNextCall(t *testing.T) {
	clk := newFakeClock()
	p := startPeer(t, func(p *peer, c *lockdtest.Conn, f frame) {
		if f.key == "refused" {
			c.Error(f.owner, codec.ShuttingDown)
			return
		}
		grant(p, c, f)
	})
	c := newClient(t, p, clk, func(cfg *Config) { cfg.WaitSpares = 1 })
	eventually(t, "the spare is connected", func() bool { return c.Stats().WaitSessionsIdle == 1 })
	c.waits.mu.Lock()
	refusing := c.waits.idle[0]
	c.waits.mu.Unlock()
	nextDone := make(chan struct{})
	hook := func() {
		select {
		case <-nextDone:
		case <-time.After(5 * time.Second): // the next call is stuck in this session
		}
	}
	refusing.testHookClosingAnswer.Store(&hook)

	if r := await(t, goAcquire(c, "refused", waitFor(10*time.Second))); !errors.Is(r.Err, ErrShuttingDown) || errors.Is(r.Err, ErrIndeterminate) {
		t.Fatalf("the refused acquire: %v, want ErrShuttingDown", r.Err)
	}
	r := await(t, goAcquire(c, "next", waitFor(10*time.Second)))
	close(nextDone)
	if r.Err != nil {
		t.Fatalf("the next acquire: %v, want it granted on another session", r.Err)
	}
	sent := p.seen(codec.OpAcquire)
	if len(sent) != 2 || sent[1].key != "next" || sent[1].conn == sent[0].conn {
		t.Errorf("acquires sent %+v: want the next one once, on another connection than the refused one", sent)
	}
}
