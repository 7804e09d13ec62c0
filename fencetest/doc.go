// Package fencetest holds the process-level pause tests of fencing: lockd
// and lockctl built from the tree, a real PostgreSQL, and lock holders in
// processes of their own, so that SIGSTOP pauses one past its lease the
// way a GC pause or a stopped VM does. A paused holder's write must be
// refused by the fence — client/fence's SQL check, its HTTP middleware in
// Go and in Python, or the README's psql recipe under lockctl exec — and
// the newer holder's write must stand. The package has no code of its
// own outside its tests.
package fencetest
