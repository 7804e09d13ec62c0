package bench

// Outcome classifies one answer the same way for every target, so that the
// workloads and the tables never look at a target's own errors.
type Outcome uint8

// The outcomes are lockd's answers (SPEC §3) and the two kinds of
// indeterminate outcome the official client reports (SPEC §6); a peer's
// answers map onto the same letters where they mean the same thing.
const (
	Acquired Outcome = iota // A: the lock is held
	TimedOut                // T: the wait elapsed without the lock
	Busy                    // B: admission refused, the lock is not held
	Released                // R: the release was accepted
	NotHeld                 // N: the release found the lock gone
	// WaitElapsed (W) is an acquire of the lockd client that ended
	// indeterminate because its own wait ran out after the request may
	// have reached the server (client.ErrWaitElapsed): the caller's own
	// timeout, in the form SPEC §6 gives it.
	WaitElapsed
	// Indeterminate (I) is any other indeterminate outcome
	// (client.ErrIndeterminate without ErrWaitElapsed): an acquire or a
	// release in flight on a session that closed under it, collateral of
	// another request's failure or timeout.
	Indeterminate
	Failed // E: an error no other outcome describes
	numOutcomes
)

var outcomeLetters = [numOutcomes]string{"A", "T", "B", "R", "N", "W", "I", "E"}

func (o Outcome) String() string { return outcomeLetters[o] }

// endsCycle reports whether a release outcome completes a lock cycle: the
// server answered it, whether or not the lock was still there.
func (o Outcome) endsCycle() bool { return o == Released || o == NotHeld }
