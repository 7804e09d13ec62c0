package fence

import (
	"context"
	"sync"
)

// Store keeps one mark per key: Fence raises key's mark to token, or
// returns a *StaleError when the mark is above it. SQL and Memory are
// Stores.
type Store interface {
	Fence(ctx context.Context, key string, token uint64) error
}

// Memory keeps the marks in this process's memory: for a resource that
// lives and dies with the process (a cache, an in-memory queue). They are
// lost on restart, so a resource that outlives the process needs SQL. A
// mark is kept for every key ever fenced. The zero value is ready; a
// Memory must not be copied after first use.
type Memory struct {
	mu    sync.Mutex
	marks map[string]uint64
}

// Fence raises key's mark to token, or returns a *StaleError when the
// mark is above it. It allocates only for a key it has not seen and for
// the error.
func (m *Memory) Fence(_ context.Context, key string, token uint64) error {
	if err := validate(key, token); err != nil {
		return err
	}
	m.mu.Lock()
	mark, seen := m.marks[key]
	if mark > token {
		m.mu.Unlock()
		return &StaleError{Key: key, Token: token, Mark: mark}
	}
	if !seen || mark < token {
		if m.marks == nil {
			m.marks = make(map[string]uint64)
		}
		m.marks[key] = token
	}
	m.mu.Unlock()
	return nil
}
