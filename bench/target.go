package bench

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"strings"
	"time"
)

// Target is one lock service under test. The workloads see only this
// interface, so the same load reaches lockd, Redis and etcd.
type Target interface {
	// Kind names the implementation: "lockd", "lockd-raw",
	// "redis/rueidis", "redis/go-redis" or "etcd".
	Kind() string
	// Transport says how the target's connections are configured, in the
	// terms of its client library ("go-redis PoolSize 4").
	Transport() string
	// Conns counts the connections the target has open to the server
	// now, as the server or the client library sees them.
	Conns(ctx context.Context) (int, error)
	// NewCaller returns the state of one concurrent caller. Workloads
	// create every caller before the clock starts.
	NewCaller(ctx context.Context, id int) (Caller, error)
	Close() error
}

// Caller takes and gives back one lock at a time, as one thread of an
// application would. It is used by one goroutine only.
type Caller interface {
	// Acquire tries to take key, waiting at most wait for it (zero: one
	// immediate attempt). Only Acquired means the caller now holds it; any
	// other outcome leaves nothing held. err explains a Failed outcome.
	Acquire(ctx context.Context, key string, wait time.Duration) (Outcome, error)
	// Release gives back the lock of the last Acquired; it answers
	// Released, NotHeld or Failed.
	Release(ctx context.Context) (Outcome, error)
	Close() error
}

// answerSlack is how long a caller waits for an answer beyond the wait it
// asked the server for, before it counts the request as failed: loopback
// answers take microseconds, so only a stuck server or connection reaches
// it.
const answerSlack = 5 * time.Second

// TargetOptions are the settings every target shares.
type TargetOptions struct {
	// Conns is the number of connections the callers share, in each
	// target's own terms: the lockd client's Sessions, bare-frame
	// connections, rueidis's pipelined connections (a power of two), the
	// go-redis PoolSize, etcd clients. 0 keeps each target's default: the
	// library's own for the lockd client, rueidis and go-redis, and
	// defaultConns for the bare-frame and etcd targets.
	Conns int
	// Lease is how long a lock lives without a release.
	Lease time.Duration
	// MaxInFlight is the most requests the callers may have outstanding at
	// once, so that a target can size its client-side queues and refuse
	// nothing a server would have taken.
	MaxInFlight int
	// Raw drives lockd with bare protocol frames instead of the client.
	Raw bool
	// Tenant and Secret authenticate to lockd when its auth is on.
	Tenant string
	Secret []byte
	// TLS, when set, connects the official client to lockd over TLS
	// (client.Config.TLS).
	TLS *tls.Config
	// RedisRetry is the mean pause between the SET NX attempts of a Redis
	// caller that waits for a held lock.
	RedisRetry time.Duration
	// acquireDelay, set by tests only, makes the target slower: every
	// acquire first spins this long, inside its measured latency, as a
	// slower server would make it wait. It is how the baseline gate's
	// tests inject a regression.
	acquireDelay time.Duration
}

// defaultConns is the connections of the targets whose library has no
// default of its own to keep: lockd in bare frames, and etcd clients.
const defaultConns = 4

// Scheme prefixes of --target.
const (
	SchemeLockd = "lockd"
	// SchemeRedis drives Redis through rueidis, auto-pipelined.
	SchemeRedis = "redis"
	// SchemeGoRedis drives Redis through go-redis's connection pool.
	SchemeGoRedis = "goredis"
	SchemeEtcd    = "etcd"
)

// TargetSpec is a parsed --target: a scheme and a loopback or remote
// address.
type TargetSpec struct {
	Scheme string
	Addr   string
}

func (s TargetSpec) String() string { return s.Scheme + "://" + s.Addr }

// ParseTarget parses "lockd://HOST:PORT", "redis://HOST:PORT",
// "goredis://HOST:PORT" or "etcd://HOST:PORT"; a bare HOST:PORT means
// lockd.
func ParseTarget(s string) (TargetSpec, error) {
	scheme, addr, found := strings.Cut(s, "://")
	if !found {
		scheme, addr = SchemeLockd, s
	}
	switch scheme {
	case SchemeLockd, SchemeRedis, SchemeGoRedis, SchemeEtcd:
	default:
		return TargetSpec{}, fmt.Errorf("target %q: scheme must be lockd, redis (rueidis), goredis (go-redis) or etcd", s)
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return TargetSpec{}, fmt.Errorf("target %q: %w", s, err)
	}
	return TargetSpec{Scheme: scheme, Addr: addr}, nil
}

// Open connects to the target the spec names.
func Open(ctx context.Context, spec TargetSpec, opts TargetOptions) (Target, error) {
	target, err := open(ctx, spec, opts)
	if err != nil || opts.acquireDelay <= 0 {
		return target, err
	}
	return slowTarget{target, opts.acquireDelay}, nil
}

func open(ctx context.Context, spec TargetSpec, opts TargetOptions) (Target, error) {
	if opts.Conns < 0 {
		return nil, fmt.Errorf("%d connections", opts.Conns)
	}
	switch spec.Scheme {
	case SchemeRedis:
		return openRueidis(spec.Addr, opts)
	case SchemeGoRedis:
		return openGoRedis(ctx, spec.Addr, opts)
	case SchemeEtcd:
		return openEtcd(ctx, spec.Addr, opts)
	}
	if opts.TLS != nil && opts.TLS.ServerName == "" {
		// What the client does for each address, for the bare frames too.
		host, _, err := net.SplitHostPort(spec.Addr)
		if err != nil {
			return nil, err
		}
		opts.TLS = opts.TLS.Clone()
		opts.TLS.ServerName = host
	}
	if opts.Raw {
		return openRaw(ctx, spec.Addr, opts)
	}
	return openLockd(ctx, spec.Addr, opts)
}

// wholeSeconds rounds d up to whole seconds, the unit of lockd's lease and
// wait fields and of an etcd lease's TTL.
func wholeSeconds(d time.Duration) int64 {
	return int64((d + time.Second - 1) / time.Second)
}

// slowTarget is a target whose acquires each first spin for delay (see
// TargetOptions.acquireDelay).
type slowTarget struct {
	Target
	delay time.Duration
}

func (t slowTarget) NewCaller(ctx context.Context, id int) (Caller, error) {
	c, err := t.Target.NewCaller(ctx, id)
	if err != nil {
		return nil, err
	}
	return slowCaller{c, t.delay}, nil
}

type slowCaller struct {
	Caller
	delay time.Duration
}

// Acquire spins rather than sleeps: a timer's wake-up on a busy machine
// is late by more than the delays injected, and a slower server costs
// CPU time too.
func (c slowCaller) Acquire(ctx context.Context, key string, wait time.Duration) (Outcome, error) {
	for start := time.Now(); time.Since(start) < c.delay; {
	}
	return c.Caller.Acquire(ctx, key, wait)
}
