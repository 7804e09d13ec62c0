package bench

import (
	"github.com/lockd/lockd/engine"
	"github.com/lockd/lockd/server"
	"github.com/rs/zerolog"
)

// StartServer starts a single-mode lockd in this process on a free
// loopback port, with auth off and no admin endpoint: the target of
// --target inproc, of the CI smoke and of the tests. maxInflight sets its
// in-flight limit, where the admission workload puts its gate; 0 keeps the
// default.
func StartServer(maxInflight int) (*server.Server, error) {
	return server.Start(server.Config{
		Listen: "127.0.0.1:0",
		Logger: zerolog.Nop(),
		Engine: engine.Config{MaxInflight: maxInflight},
	})
}
