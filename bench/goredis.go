package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// goRedisClient sends the lock recipe through go-redis, the client most Go
// services use: each command takes a connection from the pool for its
// round trip, so concurrent callers need as many connections as they have
// commands in flight, up to PoolSize, and wait for one beyond it.
type goRedisClient struct {
	c       *redis.Client
	release *redis.Script
}

// openGoRedis connects through go-redis. opts.Conns is its PoolSize; 0
// keeps go-redis's default, 10 × GOMAXPROCS.
func openGoRedis(ctx context.Context, addr string, opts TargetOptions) (*redisTarget, error) {
	name := redisClientName()
	c := redis.NewClient(&redis.Options{Addr: addr, ClientName: name, PoolSize: opts.Conns})
	t := newRedisTarget(SchemeRedis+"/go-redis", name, opts)
	t.transport = fmt.Sprintf("go-redis pool, its default PoolSize (%d)", c.Options().PoolSize)
	if opts.Conns > 0 {
		t.transport = fmt.Sprintf("go-redis pool, PoolSize %d", opts.Conns)
	}
	// go-redis dials lazily: ask the server something.
	probe, cancel := context.WithTimeout(ctx, answerSlack)
	defer cancel()
	if err := c.Ping(probe).Err(); err != nil {
		c.Close()
		return nil, fmt.Errorf("redis %s through go-redis: %w", addr, err)
	}
	t.client = &goRedisClient{c: c, release: redis.NewScript(releaseScript)}
	return t, nil
}

// setNX is go-redis's SetNX: it sends the lease as EX when it is whole
// seconds and as PX otherwise, the same expiry to Redis.
func (g *goRedisClient) setNX(ctx context.Context, key, value string, lease time.Duration) (bool, error) {
	return g.c.SetNX(ctx, key, value, lease).Result()
}

func (g *goRedisClient) compareAndDelete(ctx context.Context, key, value string) (int64, error) {
	return g.release.Run(ctx, g.c, []string{key}, value).Int64()
}

func (g *goRedisClient) clientList(ctx context.Context) (string, error) {
	return g.c.ClientList(ctx).Result()
}

func (g *goRedisClient) close() { g.c.Close() }
