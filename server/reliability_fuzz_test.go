package server

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockd/lockd/codec"
)

// FuzzReliabilityServerAnswers is a differential fuzz target: the server's
// frame loop (gnet's ring buffer, reads cut anywhere, batching, the outbox
// of queued grants) must answer an arbitrary stream exactly as a plain
// walk over the same bytes with codec.DecodeRequest and a small lock model
// predicts: the same answers in the same order (handoff grants may come
// any time after the release that caused them), with the same owners,
// reasons and tokens, and the close where the spec says. The engine has
// one shard, so tokens are one counter: a RELEASE's token field is read as
// relative to the counter at the start of the input (1 is the input's
// first grant), which lets the fuzzer release what it acquired. Each input
// runs in a fresh tenant (a HELLO is sent first), so inputs share no
// locks; the clock never moves, so no lease or wait ends.
func FuzzReliabilityServerAnswers(f *testing.F) {
	f.Add(codec.AppendAcquire(nil, 1, 30, 0, "k"))
	f.Add(append(codec.AppendAcquire(nil, 1, 30, 0, "k"), codec.AppendRelease(nil, 2, 1, "k")...))
	var handoff []byte
	handoff = codec.AppendAcquire(handoff, 1, 30, 0, "k")
	handoff = codec.AppendAcquire(handoff, 2, 30, 9, "k")
	handoff = codec.AppendAcquire(handoff, 2, 30, 0, "j")
	handoff = codec.AppendAcquire(handoff, 3, 30, 0, "k")
	handoff = codec.AppendRelease(handoff, 4, 1, "k")
	handoff = codec.AppendAcquire(handoff, 2, 30, 0, "i")
	handoff = codec.AppendRelease(handoff, 5, 2, "k")
	handoff = codec.AppendPing(handoff, 6)
	f.Add(handoff)
	f.Add(append(codec.AppendPing(nil, 0x0A0A), codec.AppendAcquire(nil, 5, 0, 0, "é")...))
	f.Add(append(codec.AppendPing(nil, 7), codec.AppendHello(nil, [16]byte{}, [32]byte{}, "t")...))
	f.Add(codec.AppendAcquire(nil, 1, 30, 0, "k")[:7])
	s := startServer(f, func(cfg *Config) { cfg.Engine.Shards = 1 })
	var tenants atomic.Uint64
	f.Fuzz(func(t *testing.T, stream []byte) {
		if len(stream) > 16<<10 {
			return // keeps queued acquires far below MaxConnInflight
		}
		nc, err := net.Dial("tcp", s.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		c := newTestConn(t, nc)
		if r := c.recv(); r.Op != codec.OpGreeting {
			t.Fatalf("first frame %q", r.Op)
		}
		// The previous input's connection is closed and answered: nothing
		// else issues tokens now.
		base := s.Engine().Stats().LastToken
		stream = relativeTokens(stream, base)
		tenant := fmt.Sprint("fuzz-", tenants.Add(1))
		_ = nc.SetWriteDeadline(time.Now().Add(ioTimeout))
		if _, err := nc.Write(append(codec.AppendHello(nil, [16]byte{}, [32]byte{}, tenant), stream...)); err != nil {
			return // the server may close mid-write after an error
		}
		_ = nc.(*net.TCPConn).CloseWrite()
		var got []codec.Response
		for {
			r, err := c.read()
			if err != nil {
				if !errors.Is(err, io.EOF) && !isReset(err) {
					t.Fatalf("after %d answers: %v", len(got), err)
				}
				break
			}
			got = append(got, r)
		}
		if len(got) == 0 || got[0].Op != codec.OpWelcome {
			t.Fatalf("HELLO not answered with WELCOME: %+v", got)
		}
		if err := predictAnswers(stream, got[1:], base); err != nil {
			t.Fatalf("stream %x (first token %d): %v", stream, base+1, err)
		}
	})
}

// relativeTokens returns a copy of stream with base added to the token of
// every RELEASE up to the first frame the server cannot delimit. Only the
// fixed part changes, so the framing is the same.
func relativeTokens(stream []byte, base uint64) []byte {
	out := slices.Clone(stream)
	var req codec.Request
	for off := 0; off < len(out); {
		n, _ := codec.DecodeRequest(out[off:], &req)
		if n == 0 {
			break
		}
		if req.Op == codec.OpRelease {
			tok := out[off+9 : off+17]
			binary.BigEndian.PutUint64(tok, binary.BigEndian.Uint64(tok)+base)
		}
		off += n
	}
	return out
}

// answerModel walks a stream the way the spec says the server handles it.
type answerModel struct {
	got      []codec.Response
	pos      int
	last     uint64              // the last token issued
	held     map[string]uint64   // key → token of its holder
	queues   map[string][]uint64 // key → owners queued, in order
	inflight map[uint64]bool     // owners queued on this connection
	granted  map[uint64]uint64   // owner granted by a handoff → token, answer not yet seen
}

// absorbGrants consumes the answers, at the current position, that are
// handoff grants already made.
func (m *answerModel) absorbGrants() {
	for m.pos < len(m.got) {
		r := m.got[m.pos]
		token, ok := m.granted[r.Owner]
		if r.Op != codec.OpAcquired || !ok || r.Token != token {
			return
		}
		delete(m.granted, r.Owner)
		m.pos++
	}
}

func (m *answerModel) expect(want codec.Response) error {
	m.absorbGrants()
	if m.pos >= len(m.got) {
		return fmt.Errorf("missing answer %q owner %d %v after %d answers", want.Op, want.Owner, want.Reason, m.pos)
	}
	r := m.got[m.pos]
	if r.Op != want.Op || r.Owner != want.Owner || r.Reason != want.Reason || r.Token != want.Token || r.WaitedMs != 0 {
		return fmt.Errorf("answer %d: %q owner %d token %d %v, want %q owner %d token %d %v",
			m.pos, r.Op, r.Owner, r.Token, r.Reason, want.Op, want.Owner, want.Token, want.Reason)
	}
	m.pos++
	return nil
}

func predictAnswers(stream []byte, got []codec.Response, base uint64) error {
	m := &answerModel{got: got, last: base, held: map[string]uint64{}, queues: map[string][]uint64{},
		inflight: map[uint64]bool{}, granted: map[uint64]uint64{}}
	if err := m.walk(stream); err != nil {
		return err
	}
	m.absorbGrants()
	if len(m.granted) != 0 {
		return fmt.Errorf("handoff grants never answered: %v", m.granted)
	}
	if m.pos != len(got) {
		r := got[m.pos]
		return fmt.Errorf("unexpected answer %d: %q owner %d %v", m.pos, r.Op, r.Owner, r.Reason)
	}
	return nil
}

func errorAnswer(owner uint64, reason codec.Reason) codec.Response {
	return codec.Response{Op: codec.OpError, Owner: owner, Reason: reason}
}

// walk predicts the answers to stream; it returns at the close.
func (m *answerModel) walk(buf []byte) error {
	var req codec.Request
	for len(buf) > 0 {
		n, err := codec.DecodeRequest(buf, &req)
		if err == codec.ErrIncomplete { // cut by EOF
			return m.expect(errorAnswer(0, codec.BadRequest))
		}
		if n == 0 { // structural: E and close
			return m.expect(errorAnswer(0, err.(codec.Reason)))
		}
		buf = buf[n:]
		if req.Op == codec.OpHello { // a HELLO was already accepted
			return m.expect(errorAnswer(0, codec.BadRequest))
		}
		if err != nil {
			if err := m.expect(errorAnswer(req.Owner, err.(codec.Reason))); err != nil {
				return err
			}
			continue
		}
		if m.inflight[req.Owner] {
			if err := m.expect(errorAnswer(req.Owner, codec.DupOwner)); err != nil {
				return err
			}
			continue
		}
		key := string(req.Key)
		switch req.Op {
		case codec.OpPing:
			err = m.expect(codec.Response{Op: codec.OpPong, Owner: req.Owner})
		case codec.OpAcquire:
			_, isHeld := m.held[key]
			switch {
			case !isHeld:
				m.last++
				m.held[key] = m.last
				err = m.expect(codec.Response{Op: codec.OpAcquired, Owner: req.Owner, Token: m.last})
			case req.WaitSeconds == 0:
				err = m.expect(codec.Response{Op: codec.OpTimeout, Owner: req.Owner})
			default:
				m.queues[key] = append(m.queues[key], req.Owner)
				m.inflight[req.Owner] = true
			}
		case codec.OpRelease:
			token, isHeld := m.held[key]
			if !isHeld || req.Token != token {
				err = m.expect(codec.Response{Op: codec.OpNotHeld, Owner: req.Owner})
				break
			}
			delete(m.held, key)
			if q := m.queues[key]; len(q) > 0 {
				head := q[0]
				m.queues[key] = q[1:]
				delete(m.inflight, head)
				m.last++
				m.held[key] = m.last
				m.granted[head] = m.last
			}
			err = m.expect(codec.Response{Op: codec.OpReleased, Owner: req.Owner})
		}
		if err != nil {
			return err
		}
	}
	return nil
}
