package client

import "time"

// clock is the time source of operation deadlines and lease validity. It is
// an interface so that tests move time instead of sleeping into a deadline;
// production uses the runtime clock, whose readings carry the monotonic
// clock.
type clock interface {
	Now() time.Time
	// NewTimer returns a stopped timer.
	NewTimer() timer
	AfterFunc(d time.Duration, f func()) timer
}

// timer is reusable: Reset re-arms it and discards an expiry not yet
// received, Stop disarms it. These are the semantics of time.Timer since
// Go 1.23, which lets one timer per pooled request serve every call.
type timer interface {
	C() <-chan time.Time
	Reset(d time.Duration)
	Stop()
}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

func (systemClock) NewTimer() timer {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return systemTimer{t}
}

func (systemClock) AfterFunc(d time.Duration, f func()) timer {
	return systemTimer{time.AfterFunc(d, f)}
}

type systemTimer struct{ t *time.Timer }

func (s systemTimer) C() <-chan time.Time   { return s.t.C }
func (s systemTimer) Reset(d time.Duration) { s.t.Reset(d) }
func (s systemTimer) Stop()                 { s.t.Stop() }
