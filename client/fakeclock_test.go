package client

import (
	"sync"
	"time"
)

// fakeClock moves only when a test says so. Advance fires the timers that
// fall due; Jump moves time without firing them, like a timer goroutine
// that is scheduled late.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers map[*fakeTimer]struct{}
}

type fakeTimer struct {
	clk  *fakeClock
	ch   chan time.Time
	f    func()
	when time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Unix(1_000_000, 0), timers: make(map[*fakeTimer]struct{})}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) NewTimer() timer { return &fakeTimer{clk: c, ch: make(chan time.Time, 1)} }

func (c *fakeClock) AfterFunc(d time.Duration, f func()) timer {
	t := &fakeTimer{clk: c, f: f}
	t.Reset(d)
	return t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	for t := range c.timers {
		if !t.when.After(c.now) {
			t.fire()
		}
	}
}

func (c *fakeClock) Jump(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// dueIn reports whether a timer is armed to fire exactly d from now: that
// some goroutine is waiting d on the clock.
func (c *fakeClock) dueIn(d time.Duration) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for t := range c.timers {
		if t.when.Equal(c.now.Add(d)) {
			return true
		}
	}
	return false
}

// dueWithin reports whether a timer is armed to fire within d from now.
func (c *fakeClock) dueWithin(d time.Duration) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for t := range c.timers {
		if !t.when.After(c.now.Add(d)) {
			return true
		}
	}
	return false
}

func (t *fakeTimer) C() <-chan time.Time { return t.ch }

func (t *fakeTimer) Reset(d time.Duration) {
	c := t.clk
	c.mu.Lock()
	defer c.mu.Unlock()
	t.drain()
	t.when = c.now.Add(d)
	c.timers[t] = struct{}{}
	if d <= 0 {
		t.fire()
	}
}

func (t *fakeTimer) Stop() {
	c := t.clk
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.timers, t)
	t.drain()
}

// fire runs with the clock's mu held.
func (t *fakeTimer) fire() {
	delete(t.clk.timers, t)
	if t.f != nil {
		go t.f()
		return
	}
	select {
	case t.ch <- t.when:
	default:
	}
}

func (t *fakeTimer) drain() {
	if t.ch == nil {
		return
	}
	select {
	case <-t.ch:
	default:
	}
}
