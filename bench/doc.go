// Package bench is lockbench's engine: it drives a lock service with the
// workloads of the benchmark suite (uncontended, contended, admission), in
// closed loop (N callers back to back) or open loop (a fixed arrival rate,
// latency measured from each request's scheduled instant, so a slow answer
// cannot hide the requests it delayed), and reports per-outcome latency
// percentiles from its own log-linear histogram, lock cycles per second,
// the admission gate's behaviour over time, a text table, a JSON file and
// an HTML page with SVG charts.
//
// Targets sit behind one small interface: lockd through the official
// client or through bare frames (--raw), Redis's single-instance lock (SET
// NX PX, compare-and-delete by EVALSHA, over a minimal pipelined RESP
// client) and etcd's concurrency.Mutex. The package talks to lockd only
// over the wire; it may start an in-process server for tests and smoke
// runs, but never reaches into the server, the engine or the client's
// internals, and it changes nothing outside its own runs' keys.
package bench
