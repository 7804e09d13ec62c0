package server

import "fmt"

// What the connection cap leaves of the descriptor limit besides the
// descriptors open at the start and the admin connections.
const (
	// acceptBacklog bounds the client port's accept queue. gnet accepts
	// everything queued in one pass and stops its whole reactor when an
	// accept fails (panjf2000/gnet#367), and a connection over the cap is
	// closed only once its event loop opens it; so up to this many
	// descriptors are in use beyond the cap for a moment, and the reserve
	// must hold them.
	acceptBacklog = 512
	// descriptorHeadroom is for what the process opens after the start:
	// a TLS handshake being refused, a log file, the data dir's writes.
	descriptorHeadroom = 64
	// backendHeadroom is added with a Backend (cluster mode), whose Raft
	// transport connects to every peer and whose LogDB opens files as it
	// compacts.
	backendHeadroom = 256
)

// connCapDerivation is how the effective connection cap came out of the
// descriptor limit; Start logs it.
type connCapDerivation struct {
	limit, before uint64 // RLIMIT_NOFILE after raising it, and before
	open          int    // descriptors open once the ports listen
	admin         int    // admin connections, served at once at most
	headroom      int
	configured    int // Config.MaxConns
	cap           int
}

// deriveConnCap raises the descriptor limit to the hard limit and fits
// Config.MaxConns under it, so that accepting a client never fails for
// want of a descriptor. Call it once the ports listen.
func (s *Server) deriveConnCap() (connCapDerivation, error) {
	d := connCapDerivation{configured: s.cfg.MaxConns, headroom: acceptBacklog + descriptorHeadroom}
	var err error
	if d.limit, d.before, err = raiseDescriptorLimit(); err != nil {
		return d, err
	}
	if d.open, err = openDescriptors(); err != nil {
		return d, err
	}
	if s.cfg.Admin != "" {
		d.admin = s.cfg.AdminMaxConns
	}
	if s.cfg.Backend != nil {
		d.headroom += backendHeadroom
	}
	room := int64(d.limit) - int64(d.open+d.admin+d.headroom)
	if room < 1 {
		return d, fmt.Errorf("server: the descriptor limit %d leaves no room for client connections: %d are open, %d are kept for admin connections and %d for the accept queue, logs and files; raise it (ulimit -n, systemd's LimitNOFILE)",
			d.limit, d.open, d.admin, d.headroom)
	}
	d.cap = int(min(room, int64(d.configured)))
	return d, nil
}
