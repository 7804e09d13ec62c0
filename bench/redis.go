package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	mrand "math/rand/v2"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// releaseScript is the standard compare-and-delete of Redis's
// single-instance lock: delete the key only if it still holds our value.
const releaseScript = `if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("del", KEYS[1]) else return 0 end`

// redisClient is one Redis client library's way of sending the two
// commands of the lock recipe. Both libraries are used as their users use
// them: the library's own connection handling, its own script helper.
type redisClient interface {
	// setNX runs SET key value NX with the lease as expiry; it reports
	// whether the key was set.
	setNX(ctx context.Context, key, value string, lease time.Duration) (bool, error)
	// compareAndDelete runs releaseScript by EVALSHA, loading it again by
	// EVAL when Redis answers NOSCRIPT; it returns the script's answer, 1
	// when it deleted the key and 0 when the key held another value or
	// none.
	compareAndDelete(ctx context.Context, key, value string) (int64, error)
	// clientList runs CLIENT LIST.
	clientList(ctx context.Context) (string, error)
	close()
}

// redisTarget is Redis's standard single-instance lock: SET key value NX
// with the lease as expiry to acquire, the compare-and-delete script to
// release. Redis has no waiters, so a caller that may wait polls with SET
// NX at a jittered interval, as lock libraries for Redis do.
type redisTarget struct {
	kind      string
	transport string
	client    redisClient
	// name is the CLIENT SETNAME of every connection of this target, so
	// that CLIENT LIST can count them.
	name  string
	lease time.Duration
	retry time.Duration
	// values and valuePrefix make every lock value unique: within the
	// target by the counter, across targets and runs by the prefix.
	values      atomic.Uint64
	valuePrefix string
}

func newRedisTarget(kind, name string, opts TargetOptions) *redisTarget {
	t := &redisTarget{
		kind:        kind,
		name:        name,
		lease:       opts.Lease,
		retry:       opts.RedisRetry,
		valuePrefix: name + "-",
	}
	if t.retry <= 0 {
		t.retry = time.Millisecond
	}
	return t
}

// redisClientName makes a fresh CLIENT SETNAME for one target.
func redisClientName() string {
	var b [4]byte
	rand.Read(b[:])
	return "lockbench-" + hex.EncodeToString(b[:])
}

func (t *redisTarget) Kind() string { return t.kind }

func (t *redisTarget) Transport() string { return t.transport }

// Conns counts the connections Redis lists under the target's client name.
func (t *redisTarget) Conns(ctx context.Context) (int, error) {
	list, err := t.client.clientList(ctx)
	if err != nil {
		return 0, fmt.Errorf("redis CLIENT LIST: %w", err)
	}
	return countNamedClients(list, t.name), nil
}

// countNamedClients counts the lines of a CLIENT LIST answer whose name
// field is name.
func countNamedClients(list, name string) int {
	n := 0
	for line := range strings.Lines(list) {
		for _, field := range strings.Fields(line) {
			if field == "name="+name {
				n++
				break
			}
		}
	}
	return n
}

func (t *redisTarget) NewCaller(_ context.Context, id int) (Caller, error) {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	return &redisCaller{t: t, rng: mrand.New(mrand.NewPCG(uint64(id), 0x5eed)), timer: timer}, nil
}

func (t *redisTarget) Close() error {
	t.client.close()
	return nil
}

type redisCaller struct {
	t     *redisTarget
	rng   *mrand.Rand
	timer *time.Timer
	key   string
	value string // the value of the lock held or being acquired
}

func (c *redisCaller) Acquire(ctx context.Context, key string, wait time.Duration) (Outcome, error) {
	deadline := time.Now().Add(wait)
	c.key = key
	c.value = c.t.valuePrefix + strconv.FormatUint(c.t.values.Add(1), 36)
	for {
		set, err := c.t.client.setNX(ctx, key, c.value, c.t.lease)
		if err != nil {
			return Failed, fmt.Errorf("redis SET NX: %w", err)
		}
		if set {
			return Acquired, nil
		}
		left := time.Until(deadline)
		if left <= 0 {
			return TimedOut, nil
		}
		// Uniform in [retry/2, 3*retry/2): polls of many callers spread out.
		pause := c.t.retry/2 + time.Duration(c.rng.Int64N(int64(c.t.retry)))
		c.timer.Reset(min(pause, left))
		select {
		case <-c.timer.C:
		case <-ctx.Done():
			c.timer.Stop()
			return Failed, context.Cause(ctx)
		}
	}
}

func (c *redisCaller) Release(ctx context.Context) (Outcome, error) {
	deleted, err := c.t.client.compareAndDelete(ctx, c.key, c.value)
	switch {
	case err != nil:
		return Failed, fmt.Errorf("redis compare-and-delete: %w", err)
	case deleted == 1:
		return Released, nil
	case deleted == 0:
		return NotHeld, nil
	}
	return Failed, fmt.Errorf("redis compare-and-delete answered %d", deleted)
}

func (c *redisCaller) Close() error { return nil }
