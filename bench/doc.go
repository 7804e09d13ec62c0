// Package bench is lockbench's engine: it drives a lock service with the
// workloads of the benchmark suite (uncontended, contended, admission,
// timeouts, keepalive), in closed loop (N callers back to back) or open loop (a fixed
// arrival rate, latency measured from each request's scheduled instant, so
// a slow answer cannot hide the requests it delayed), and reports
// per-outcome latency percentiles from its own log-linear histogram, lock
// cycles per second, what lockbench and the server processes spent per
// cycle (CPU time, read and write syscalls, context switches, from /proc),
// the admission gate's behaviour over time, the timeouts workload's
// outcomes by kind, what a lease renewal costs, a text table, a JSON file and an HTML page with SVG
// charts. Its baseline gate (gate.go) tells whether this build's runs are
// slower than a saved baseline's, with a Mann-Whitney U test over every
// sample of both sides. Each workload is one entry of the workload table
// (workload.go).
//
// Targets sit behind one small interface: lockd through the official
// client or through bare frames (--raw); Redis's single-instance lock (SET
// NX with the lease, compare-and-delete script by EVALSHA) through the two
// client libraries Go services use, rueidis auto-pipelined and go-redis's
// connection pool; and etcd's concurrency.Mutex. The package talks to
// lockd only over the wire; it may start an in-process server for tests
// and smoke runs, but never reaches into the server, the engine or the
// client's internals, and it changes nothing outside its own runs' keys.
package bench
