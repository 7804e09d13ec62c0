// Package servertest holds what the tests of every package that runs a
// lockd server in-process share. Only test code imports it.
package servertest

import "go.uber.org/goleak"

// IgnoreGnetWorkers is the goleak options for gnet's shared worker pool,
// which is started once per process and outlives any one server by design.
// Nothing else is ignored: a server, client or node left running still
// fails the check.
func IgnoreGnetWorkers() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreTopFunction("github.com/panjf2000/ants/v2.(*poolCommon).purgeStaleWorkers"),
		goleak.IgnoreTopFunction("github.com/panjf2000/ants/v2.(*poolCommon).ticktock"),
		goleak.IgnoreAnyFunction("github.com/panjf2000/ants/v2.(*goWorker).run.func1"),
	}
}
