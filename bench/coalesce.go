package bench

import (
	"net"
	"sync"
)

// coalescingWriter lets many callers share one connection without a writer
// goroutine: a caller appends its bytes, and whoever finds no write in
// progress writes everything queued, what others appended meanwhile
// included: the lockd raw target's pipelining, one write for whatever the
// callers queued while the last write was under way.
type coalescingWriter struct {
	nc       net.Conn
	out      []byte
	spare    []byte
	flushing bool
}

// queue appends b and, unless a write is in progress, writes until nothing
// is queued. mu guards the writer together with the caller's own
// bookkeeping: it is held on entry and on return, and released around each
// write. A failed write closes the connection, so its reader fails every
// pending request and each caller still gets exactly one signal.
func (w *coalescingWriter) queue(mu *sync.Mutex, b []byte) {
	w.out = append(w.out, b...)
	if w.flushing {
		return
	}
	w.flushing = true
	for len(w.out) > 0 {
		batch := w.out
		w.out, w.spare = w.spare[:0], batch
		mu.Unlock()
		_, err := w.nc.Write(batch)
		mu.Lock()
		if err != nil {
			w.nc.Close()
			w.out = w.out[:0]
			break
		}
	}
	w.flushing = false
}
