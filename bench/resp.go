package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"
)

// A minimal RESP2 client: just what the Redis lock needs (SET, SCRIPT
// LOAD, EVALSHA), pipelined like the lockd client so both peers get the
// same transport shape. Commands share a connection; Redis answers each
// connection in order, so replies are matched to a FIFO of calls.

// Reply kinds, by their RESP type byte.
const (
	replySimple  = '+'
	replyError   = '-'
	replyInteger = ':'
	replyBulk    = '$'
	replyNull    = 0 // a null bulk string ($-1)
)

// respReply is one decoded reply. Text is owned by the call and reused.
type respReply struct {
	kind    byte
	integer int64
	text    []byte
}

// respCall is one command's place in the FIFO; a caller reuses its own.
type respCall struct {
	done  chan struct{}
	timer *time.Timer
	reply respReply
	err   error
}

func newRespCall() *respCall {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	return &respCall{done: make(chan struct{}, 1), timer: timer}
}

// respConn is one pipelined connection.
type respConn struct {
	nc net.Conn

	mu    sync.Mutex
	w     coalescingWriter
	calls callQueue
	err   error // set once the connection failed
}

func dialResp(ctx context.Context, addr string) (*respConn, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return &respConn{nc: nc, w: coalescingWriter{nc: nc}}, nil
}

// do sends the command cmd and waits for its reply into call.
func (rc *respConn) do(ctx context.Context, cmd []byte, call *respCall) error {
	rc.mu.Lock()
	if rc.err != nil {
		err := rc.err
		rc.mu.Unlock()
		return err
	}
	rc.calls.push(call)
	rc.w.queue(&rc.mu, cmd)
	rc.mu.Unlock()

	call.timer.Reset(answerSlack)
	defer call.timer.Stop()
	select {
	case <-call.done:
		return call.err
	case <-call.timer.C:
	case <-ctx.Done():
	}
	// The reply would be matched by position: a call cannot leave the
	// FIFO alone, so the connection goes, and with it every queued call.
	rc.nc.Close()
	<-call.done
	if call.err == nil {
		return nil
	}
	return fmt.Errorf("no reply in time: %w", call.err)
}

// readLoop matches each reply to the oldest call.
func (rc *respConn) readLoop() {
	r := bufio.NewReaderSize(rc.nc, 64<<10)
	var reply respReply
	for {
		err := readReply(r, &reply)
		var call *respCall
		if err == nil {
			rc.mu.Lock()
			call = rc.calls.pop()
			rc.mu.Unlock()
			if call == nil {
				err = errors.New("redis: a reply nobody asked for")
			}
		}
		if err != nil {
			rc.fail(err)
			return
		}
		call.reply.kind, call.reply.integer = reply.kind, reply.integer
		call.reply.text = append(call.reply.text[:0], reply.text...)
		call.err = nil
		call.done <- struct{}{}
	}
}

func (rc *respConn) fail(err error) {
	rc.nc.Close()
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.err = err
	for call := rc.calls.pop(); call != nil; call = rc.calls.pop() {
		call.err = err
		call.done <- struct{}{}
	}
}

// readReply decodes one RESP2 reply other than an array, which none of
// the commands used here returns.
func readReply(r *bufio.Reader, reply *respReply) error {
	line, err := r.ReadSlice('\n')
	if err != nil {
		return err
	}
	if len(line) < 3 || line[len(line)-2] != '\r' {
		return fmt.Errorf("redis: malformed reply line %q", line)
	}
	kind, body := line[0], line[1:len(line)-2]
	switch kind {
	case replySimple, replyError:
		reply.kind = kind
		reply.text = append(reply.text[:0], body...)
		return nil
	case replyInteger:
		reply.kind = kind
		reply.integer, err = strconv.ParseInt(string(body), 10, 64)
		return err
	case replyBulk:
		n, err := strconv.Atoi(string(body))
		switch {
		case err != nil:
			return fmt.Errorf("redis: bulk length %q: %w", body, err)
		case n == -1:
			reply.kind = replyNull
			return nil
		case n < 0 || n > 1<<20:
			return fmt.Errorf("redis: bulk length %d", n)
		}
		reply.kind = kind
		reply.text = append(reply.text[:0], make([]byte, n+2)...)
		if _, err := io.ReadFull(r, reply.text); err != nil {
			return err
		}
		reply.text = reply.text[:n]
		return nil
	}
	return fmt.Errorf("redis: unsupported reply type %q", kind)
}

// appendCommand encodes a command as a RESP array of bulk strings.
func appendCommand(dst []byte, args ...[]byte) []byte {
	dst = append(dst, '*')
	dst = strconv.AppendInt(dst, int64(len(args)), 10)
	dst = append(dst, '\r', '\n')
	for _, a := range args {
		dst = append(dst, '$')
		dst = strconv.AppendInt(dst, int64(len(a)), 10)
		dst = append(dst, '\r', '\n')
		dst = append(dst, a...)
		dst = append(dst, '\r', '\n')
	}
	return dst
}

// callQueue is a FIFO ring of calls that grows when full.
type callQueue struct {
	ring       []*respCall
	head, size int
}

func (q *callQueue) push(c *respCall) {
	if q.size == len(q.ring) {
		grown := make([]*respCall, max(2*len(q.ring), 64))
		for i := range q.size {
			grown[i] = q.ring[(q.head+i)%len(q.ring)]
		}
		q.ring, q.head = grown, 0
	}
	q.ring[(q.head+q.size)%len(q.ring)] = c
	q.size++
}

func (q *callQueue) peek() *respCall {
	if q.size == 0 {
		return nil
	}
	return q.ring[q.head]
}

func (q *callQueue) pop() *respCall {
	c := q.peek()
	if c != nil {
		q.ring[q.head] = nil
		q.head = (q.head + 1) % len(q.ring)
		q.size--
	}
	return c
}
