package bench

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// releaseScript is the standard compare-and-delete of Redis's
// single-instance lock: delete the key only if it still holds our value.
const releaseScript = `if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("del", KEYS[1]) else return 0 end`

// redisTarget is Redis's standard single-instance lock: SET key value NX
// PX lease to acquire, the compare-and-delete script by EVALSHA to release.
// Redis has no waiters, so a caller that may wait polls with SET NX at a
// jittered interval, as lock libraries for Redis do.
type redisTarget struct {
	conns   []*respConn
	leaseMs []byte
	retry   time.Duration
	sha     atomic.Pointer[[]byte]
	wg      sync.WaitGroup
}

func openRedis(ctx context.Context, addr string, opts TargetOptions) (*redisTarget, error) {
	t := &redisTarget{
		leaseMs: strconv.AppendInt(nil, opts.Lease.Milliseconds(), 10),
		retry:   opts.RedisRetry,
	}
	if t.retry <= 0 {
		t.retry = time.Millisecond
	}
	for range opts.Conns {
		rc, err := dialResp(ctx, addr)
		if err != nil {
			t.Close()
			return nil, fmt.Errorf("redis %s: %w", addr, err)
		}
		t.conns = append(t.conns, rc)
		t.wg.Go(rc.readLoop)
	}
	if err := t.loadScript(ctx, t.conns[0], newRespCall()); err != nil {
		t.Close()
		return nil, err
	}
	return t, nil
}

// loadScript (re)loads the release script, after a start or a SCRIPT
// FLUSH, and keeps its SHA.
func (t *redisTarget) loadScript(ctx context.Context, rc *respConn, call *respCall) error {
	cmd := appendCommand(nil, []byte("SCRIPT"), []byte("LOAD"), []byte(releaseScript))
	if err := rc.do(ctx, cmd, call); err != nil {
		return fmt.Errorf("redis SCRIPT LOAD: %w", err)
	}
	if call.reply.kind != replyBulk {
		return fmt.Errorf("redis SCRIPT LOAD answered %q %s", call.reply.kind, call.reply.text)
	}
	sha := bytes.Clone(call.reply.text)
	t.sha.Store(&sha)
	return nil
}

func (t *redisTarget) Kind() string { return SchemeRedis }

func (t *redisTarget) NewCaller(_ context.Context, id int) (Caller, error) {
	return &redisCaller{
		t:      t,
		conn:   t.conns[id%len(t.conns)],
		call:   newRespCall(),
		prefix: strconv.AppendInt(nil, int64(id), 36),
		rng:    rand.New(rand.NewPCG(uint64(id), 0x5eed)),
	}, nil
}

func (t *redisTarget) Close() error {
	for _, rc := range t.conns {
		rc.nc.Close()
	}
	t.wg.Wait()
	return nil
}

type redisCaller struct {
	t      *redisTarget
	conn   *respConn
	call   *respCall
	prefix []byte // makes values unique across callers
	seq    uint64
	rng    *rand.Rand
	cmd    []byte
	key    []byte
	value  []byte // the value of the lock held or being acquired
}

var (
	cmdSET     = []byte("SET")
	cmdNX      = []byte("NX")
	cmdPX      = []byte("PX")
	cmdEVALSHA = []byte("EVALSHA")
	oneKey     = []byte("1")
)

func (c *redisCaller) Acquire(ctx context.Context, key string, wait time.Duration) (Outcome, error) {
	deadline := time.Now().Add(wait)
	c.key = append(c.key[:0], key...)
	c.seq++
	c.value = strconv.AppendUint(append(append(c.value[:0], c.prefix...), '-'), c.seq, 36)
	c.cmd = appendCommand(c.cmd[:0], cmdSET, c.key, c.value, cmdNX, cmdPX, c.t.leaseMs)
	for {
		if err := c.conn.do(ctx, c.cmd, c.call); err != nil {
			return Failed, err
		}
		switch r := &c.call.reply; {
		case r.kind == replySimple:
			return Acquired, nil
		case r.kind != replyNull:
			return Failed, fmt.Errorf("redis SET answered %q %s", r.kind, r.text)
		}
		left := time.Until(deadline)
		if left <= 0 {
			return TimedOut, nil
		}
		// Uniform in [retry/2, 3*retry/2): polls of many callers spread out.
		pause := c.t.retry/2 + time.Duration(c.rng.Int64N(int64(c.t.retry)))
		c.call.timer.Reset(min(pause, left))
		select {
		case <-c.call.timer.C:
		case <-ctx.Done():
			c.call.timer.Stop()
			return Failed, context.Cause(ctx)
		}
	}
}

func (c *redisCaller) Release(ctx context.Context) (Outcome, error) {
	r := &c.call.reply
	// A second attempt only follows a NOSCRIPT: the server lost its
	// scripts (a restart, SCRIPT FLUSH) and the script is loaded again.
	for attempt := 0; ; attempt++ {
		c.cmd = appendCommand(c.cmd[:0], cmdEVALSHA, *c.t.sha.Load(), oneKey, c.key, c.value)
		if err := c.conn.do(ctx, c.cmd, c.call); err != nil {
			return Failed, err
		}
		if r.kind != replyError || !bytes.HasPrefix(r.text, []byte("NOSCRIPT")) || attempt > 0 {
			break
		}
		if err := c.t.loadScript(ctx, c.conn, c.call); err != nil {
			return Failed, err
		}
	}
	switch {
	case r.kind == replyInteger && r.integer == 1:
		return Released, nil
	case r.kind == replyInteger && r.integer == 0:
		return NotHeld, nil
	}
	return Failed, fmt.Errorf("redis EVALSHA answered %q %s %d", r.kind, r.text, r.integer)
}

func (c *redisCaller) Close() error { return nil }
