package engine

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// HighWaterMark keeps the token high-water mark durable, so that tokens
// keep growing across restarts, crashes included (SPEC §4). The engine
// issues no token at or above the mark it last recorded, records the next
// one a block ahead of its grants, and a new engine starts at Reserved.
// The engine calls it from one goroutine at a time, never from a grant.
type HighWaterMark interface {
	// Reserved is the mark recorded last: every token issued so far, by
	// this process or an earlier one, is below it. 0 when none is recorded.
	Reserved() uint64
	// Reserve records mark, which is above Reserved, and returns once the
	// record would survive a crash. After an error Reserved is unchanged
	// and a restart finds the old mark or the new one.
	Reserve(mark uint64) error
}

// DefaultTokenBlock is how many tokens one reservation adds. A restart
// skips at most one and a half blocks (25 million tokens: 2^63 is more
// than 10^11 restarts away), and a grant finds the next block recorded
// unless the busiest shard issues half a block — 8 million tokens, about a
// second at the engine's own single-shard rate and over ten at the
// server's — before a write and two fsyncs complete.
const DefaultTokenBlock = 1 << 24

// reserveRetry is how long Run waits before it tries again to record a
// mark that could not be recorded. Grants go on from what is reserved
// meanwhile; once that runs out they are answered Busy.
const reserveRetry = time.Second

// tokenReserve bounds the shards' counters by what is recorded. limit and
// refillAt are read on every grant and written only by a reservation.
type tokenReserve struct {
	// limit is the highest token a shard may issue now. Without a
	// HighWaterMark it is math.MaxUint64 for good.
	limit atomic.Uint64
	// refillAt is the token from which a grant asks for the next block:
	// half a block below limit.
	refillAt atomic.Uint64

	hw      HighWaterMark // nil: tokens last for the engine's lifetime
	block   uint64
	ceiling uint64        // the highest limit there can be
	wanted  chan struct{} // wakes reserveAhead; never blocks a grant

	mu         sync.Mutex    // serializes reservations
	mark       atomic.Uint64 // the mark recorded last, for Stats
	unreserved atomic.Uint64 // grants refused while the reservation was behind
	failures   atomic.Uint64 // marks that could not be recorded
}

// init sets the bounds from cfg and returns the first token of every
// shard. With a HighWaterMark nothing is reserved yet: no token is
// issued until ReserveTokens records a mark above the first token.
func (t *tokenReserve) init(cfg Config) (first uint64) {
	first = max(cfg.FirstToken, 1)
	t.wanted = make(chan struct{}, 1)
	if cfg.HighWater == nil {
		t.ceiling = math.MaxUint64
		t.limit.Store(math.MaxUint64)
		t.refillAt.Store(math.MaxUint64)
		return first
	}
	t.hw = cfg.HighWater
	t.block = cmp.Or(cfg.TokenBlock, DefaultTokenBlock)
	// A recorded mark can be at most math.MaxUint64, and tokens stay
	// below it.
	t.ceiling = math.MaxUint64 - 1
	mark := t.hw.Reserved()
	t.mark.Store(mark)
	// Tokens below the recorded mark may have been issued before a
	// restart, whatever FirstToken says.
	first = max(first, mark)
	t.limit.Store(first - 1)
	return first
}

// want asks reserveAhead for the next block.
func (t *tokenReserve) want() {
	select {
	case t.wanted <- struct{}{}:
	default:
	}
}

// shortage is the answer to a grant that found its shard's counter at
// limit: TokenExhausted at the end of the range, Busy while the
// reservation has not caught up (the acquire is refused, never given a
// token that is not recorded).
func (t *tokenReserve) shortage(limit uint64) Outcome {
	if limit == t.ceiling {
		return TokenExhausted
	}
	t.unreserved.Add(1)
	t.want()
	return Busy
}

// ReserveTokens records a mark one block above the tokens reserved so far
// when the busiest shard has half a block or less of them left, and does
// nothing otherwise (nor without Config.HighWater). Run calls it in the
// background whenever a grant crosses that line; call it once before
// serving, so that the first grants find tokens reserved and a mark that
// cannot be recorded stops the start.
func (e *Engine) ReserveTokens() error {
	t := &e.tokens
	if t.hw == nil {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	limit := t.limit.Load()
	if limit == t.ceiling || e.highestToken() < t.refillAt.Load() {
		return nil
	}
	next := uint64(math.MaxUint64)
	if limit < math.MaxUint64-t.block {
		next = limit + 1 + t.block
	}
	if err := t.hw.Reserve(next); err != nil {
		t.failures.Add(1)
		return fmt.Errorf("engine: reserve the tokens below %d: %w", next, err)
	}
	t.mark.Store(next)
	t.refillAt.Store(next - 1 - min(t.block/2, next-1))
	t.limit.Store(next - 1)
	return nil
}

// highestToken is the last token of the busiest shard.
func (e *Engine) highestToken() uint64 {
	var high uint64
	for i := range e.shards {
		s := &e.shards[i]
		s.mu.Lock()
		high = max(high, s.tokens.Last)
		s.mu.Unlock()
	}
	return high
}

// reserveAhead keeps tokens reserved ahead of the grants until ctx is
// done: it reserves at once, then whenever a grant asks, and retries a
// failed record every reserveRetry (not at every ask, which under load
// would retry a failing disk in a busy loop).
func (e *Engine) reserveAhead(ctx context.Context) {
	for {
		if err := e.ReserveTokens(); err != nil {
			retry := time.NewTimer(reserveRetry)
			select {
			case <-ctx.Done():
				retry.Stop()
				return
			case <-retry.C:
			}
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-e.tokens.wanted:
		}
	}
}
