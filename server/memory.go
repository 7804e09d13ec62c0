package server

import (
	"context"
	"runtime/debug"
	"time"
)

// After a flood — a burst of keys, waiters or connections that then went
// away — the Go runtime keeps the freed heap for a while before it gives
// the pages back, so the resident set stays near its peak. The server
// watches the size of what it holds and, once that has fallen to a quarter
// of its peak, runs a collection and returns the free pages at once.
const (
	memoryCheckInterval = time.Second
	// memoryFloodItems is the peak below which nothing is returned: small
	// swings are the runtime's to manage.
	memoryFloodItems = 16384
)

// heldItems is what the server holds that costs memory per item: live
// keys, queued waiters and open connections.
func (s *Server) heldItems() int {
	st := s.backend.Stats()
	return st.Keys + st.Waiters + int(s.conns.Load())
}

// returnMemory runs until ctx is done.
func (s *Server) returnMemory(ctx context.Context) {
	t := time.NewTicker(memoryCheckInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		items := int64(s.heldItems())
		peak := max(s.itemsPeak.Load(), items)
		s.itemsPeak.Store(peak)
		if peak >= memoryFloodItems && items < peak/4 {
			debug.FreeOSMemory()
			s.metrics.memoryReturns.Add(1)
			s.log.Info().Int64("peak_items", peak).Int64("items", items).Msg("returned the memory of a flood to the OS")
			s.itemsPeak.Store(items)
		}
	}
}
