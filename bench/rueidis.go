package bench

import (
	"context"
	"fmt"
	"math/bits"
	"time"

	"github.com/redis/rueidis"
)

// rueidisClient sends the lock recipe through rueidis. Its commands from
// concurrent callers are auto-pipelined: they share a few connections and
// go out together in one write, answers come back in one read.
type rueidisClient struct {
	c       rueidis.Client
	release *rueidis.Lua
}

// openRueidis connects through rueidis. With opts.Conns 0 it keeps
// rueidis's own choice of pipelined connections for a single Redis:
// 2^min(2, log2 GOMAXPROCS), so one on one core, two on two, four from
// four. A Conns given is set as PipelineMultiplex, rueidis's setting for
// how many connections it pipelines over, which it takes as a power of
// two: log2(Conns), Conns 1 through -1 (rueidis reads 0 as its default).
func openRueidis(addr string, opts TargetOptions) (*redisTarget, error) {
	name := redisClientName()
	option := rueidis.ClientOption{InitAddress: []string{addr}, ClientName: name}
	t := newRedisTarget(SchemeRedis+"/rueidis", name, opts)
	t.transport = "rueidis auto-pipelining, its default PipelineMultiplex"
	if opts.Conns > 0 {
		multiplex, err := rueidisMultiplex(opts.Conns)
		if err != nil {
			return nil, err
		}
		option.PipelineMultiplex = multiplex
		t.transport = fmt.Sprintf("rueidis auto-pipelining, PipelineMultiplex %d", multiplex)
	}
	c, err := rueidis.NewClient(option)
	if err != nil {
		return nil, fmt.Errorf("redis %s through rueidis: %w", addr, err)
	}
	t.client = &rueidisClient{c: c, release: rueidis.NewLuaScript(releaseScript)}
	return t, nil
}

// rueidisMultiplex is the PipelineMultiplex that makes rueidis pipeline
// over conns connections.
func rueidisMultiplex(conns int) (int, error) {
	if conns&(conns-1) != 0 || conns > 1<<rueidis.MaxPipelineMultiplex {
		return 0, fmt.Errorf("rueidis pipelines over a power of two of connections, at most %d: --conns %d is not one", 1<<rueidis.MaxPipelineMultiplex, conns)
	}
	if conns == 1 {
		return -1, nil
	}
	return bits.TrailingZeros(uint(conns)), nil
}

func (r *rueidisClient) setNX(ctx context.Context, key, value string, lease time.Duration) (bool, error) {
	err := r.c.Do(ctx, r.c.B().Set().Key(key).Value(value).Nx().Px(lease).Build()).Error()
	switch {
	case err == nil:
		return true, nil
	case rueidis.IsRedisNil(err):
		return false, nil
	}
	return false, err
}

func (r *rueidisClient) compareAndDelete(ctx context.Context, key, value string) (int64, error) {
	return r.release.Exec(ctx, r.c, []string{key}, []string{value}).AsInt64()
}

func (r *rueidisClient) clientList(ctx context.Context) (string, error) {
	return r.c.Do(ctx, r.c.B().ClientList().Build()).ToString()
}

func (r *rueidisClient) close() { r.c.Close() }
