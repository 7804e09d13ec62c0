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
//
// It serves SESSION and ABANDON (SPEC §6a) and says so in its GREETING
// unless NoAbandon is set: an ACQUIRE on a connection that declared its
// client_id is recorded with (client_id, owner); ABANDON of the request
// holding the key releases it (RELEASED), of anything else changes
// nothing (NOT HELD), and either way leaves a tombstone that answers that
// ACQUIRE TIMEOUT should it come later. A second SESSION, a SESSION after
// an ACQUIRE, or an ABANDON without SESSION is answered E bad_request and
// closes the connection.
type Locks struct {
	// Secrets maps tenant to secret; nil turns auth off.
	Secrets map[string][]byte
	// NoAbandon plays a server that does not serve SPEC §6a: GREETING
	// flag bit1 clear, SESSION and ABANDON refused as unknown requests.
	NoAbandon bool

	mu         sync.Mutex
	keys       map[string]*lockState
	lastToken  uint64
	tombstones map[requestID]string // the key of each abandoned request
	tombOrder  []requestID          // oldest first, for the bound
}

// maxTombstones bounds the tombstones; past it the oldest go first.
const maxTombstones = 4096

// requestID names an ACQUIRE across connections: the client_id its
// connection declared and its owner.
type requestID struct {
	clientID [codec.ClientIDLen]byte
	owner    uint64
}

type lockState struct {
	token   uint64
	expires time.Time
	// holder is the ACQUIRE the current grant was made for, when its
	// connection declared a SESSION.
	holder      requestID
	abandonable bool
}

// session is what one connection declared.
type session struct {
	declared bool
	clientID [codec.ClientIDLen]byte
	acquired bool // an ACQUIRE came: a SESSION is too late
}

// Serve is the Script.
func (l *Locks) Serve(c *Conn) {
	var flags uint8
	if !l.NoAbandon {
		flags = codec.GreetingAbandon
	}
	if c.HandshakeWith(l.Secrets, flags) != nil {
		return
	}
	var sess session
	c.Serve(func(c *Conn, req *codec.Request) { l.answer(c, &sess, req) })
}

func (l *Locks) answer(c *Conn, sess *session, req *codec.Request) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	st := l.keys[string(req.Key)]
	switch req.Op {
	case codec.OpSession, codec.OpAbandon:
		if l.NoAbandon || !l.sessionFrame(c, sess, req) {
			c.Flush()
			c.Error(0, codec.BadRequest)
			c.Close()
		}
	case codec.OpAcquire:
		sess.acquired = true
		id := requestID{clientID: sess.clientID, owner: req.Owner}
		if sess.declared && l.tombstones[id] == string(req.Key) {
			c.QueueReply(codec.OpTimeout, req.Owner)
			return
		}
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
		st.holder, st.abandonable = id, sess.declared
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

// sessionFrame answers SESSION or ABANDON; false means the frame breaks
// SPEC §6a's order and closes the connection. l.mu is held.
func (l *Locks) sessionFrame(c *Conn, sess *session, req *codec.Request) bool {
	if req.Op == codec.OpSession {
		if sess.declared || sess.acquired {
			return false
		}
		sess.declared, sess.clientID = true, req.ClientID
		c.QueueReply(codec.OpPong, req.Owner)
		return true
	}
	if !sess.declared {
		return false
	}
	id := requestID{clientID: sess.clientID, owner: req.Target}
	l.bury(id, string(req.Key))
	st := l.keys[string(req.Key)]
	if st != nil && st.token != 0 && st.abandonable && st.holder == id && time.Now().Before(st.expires) {
		st.token = 0
		c.QueueReply(codec.OpReleased, req.Owner)
		return true
	}
	c.QueueReply(codec.OpNotHeld, req.Owner)
	return true
}

// bury keeps a tombstone of the abandoned request; l.mu is held.
func (l *Locks) bury(id requestID, key string) {
	if l.tombstones == nil {
		l.tombstones = make(map[requestID]string)
	}
	if _, ok := l.tombstones[id]; !ok {
		if len(l.tombOrder) == maxTombstones {
			delete(l.tombstones, l.tombOrder[0])
			l.tombOrder = append(l.tombOrder[:0], l.tombOrder[1:]...)
		}
		l.tombOrder = append(l.tombOrder, id)
	}
	l.tombstones[id] = key
}
