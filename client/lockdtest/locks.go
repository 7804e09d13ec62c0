package lockdtest

import (
	"sync"
	"time"

	"github.com/lockd/lockd/codec"
)

// Locks is a Script backed by an in-memory lock table shared by all
// connections. It never queues: an ACQUIRE on a free or expired key is
// granted at once and one on a held key is answered TIMEOUT whatever its
// wait, so answers are immediate. KEEP renews the current token's
// lease. It ignores tenants. Answers to the
// requests of one read are sent in one write, and the hot path does not
// allocate, so the client can be benchmarked against it.
type Locks struct {
	// Secrets maps tenant to secret; nil turns auth off.
	Secrets map[string][]byte

	mu        sync.Mutex
	keys      map[string]*lockState
	lastToken uint64
}

type lockState struct {
	token   uint64
	expires time.Time
}

// Serve is the Script.
func (l *Locks) Serve(c *Conn) {
	if c.Handshake(l.Secrets) != nil {
		return
	}
	c.Serve(l.answer)
}

func (l *Locks) answer(c *Conn, req *codec.Request) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	st := l.keys[string(req.Key)]
	switch req.Op {
	case codec.OpAcquire:
		if st != nil && st.token != 0 && now.Before(st.expires) {
			c.QueueReply(codec.OpTimeout, req.Owner)
			return
		}
		if st == nil {
			if l.keys == nil {
				l.keys = make(map[string]*lockState)
			}
			st = &lockState{}
			l.keys[string(req.Key)] = st
		}
		l.lastToken++
		st.token = l.lastToken
		st.expires = now.Add(time.Duration(req.LeaseSeconds) * time.Second)
		c.QueueAcquired(req.Owner, st.token, 0)
	case codec.OpRelease:
		if st == nil || st.token != req.Token || !now.Before(st.expires) {
			c.QueueReply(codec.OpNotHeld, req.Owner)
			return
		}
		st.token = 0
		c.QueueReply(codec.OpReleased, req.Owner)
	case codec.OpKeep:
		if st == nil || st.token != req.Token || !now.Before(st.expires) {
			c.QueueReply(codec.OpNotHeld, req.Owner)
			return
		}
		st.expires = now.Add(time.Duration(req.LeaseSeconds) * time.Second)
		c.QueueAcquired(req.Owner, st.token, 0)
	case codec.OpPing:
		c.QueueReply(codec.OpPong, req.Owner)
	}
}
