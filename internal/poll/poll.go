// Package poll is the tests' one wait for a condition of something
// running (a server, a node, a process): it looks again at a fixed pace
// until the condition holds or the time is up. Tests wait for the event
// that shows what they assert, never for a fixed sleep; this package
// knows nothing of what it waits for.
package poll

import "time"

// Until looks at cond every interval until it holds, for at most within,
// and reports whether it held.
func Until(within, every time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(every)
	}
	return true
}
