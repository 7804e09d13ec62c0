// Package raftnet is the Raft transport between lockd's cluster nodes: a
// dragonboat raftio.ITransport (Factory) that sends each message batch as
// one checksummed frame in one write, over plain TCP or mutual TLS.
//
// It owns, by file:
//
//   - transport.go: the frame format, the listener and its connection
//     limits, the reader of frames (ReadFrame, fuzzed by
//     FuzzRaftFrameReader), the dialer (Dial) and the senders; the
//     frames of kind FrameLockd it hands to Factory.OnPeer unread.
//   - raft_sources.go: the check of where a frame says it comes from,
//     against the groups' memberships (Sources), and the repair of
//     dragonboat's address-registry conflict (Panicf).
//   - framebudget.go: the node-wide budget for large frame bodies
//     (FrameBudget), members' part kept from guests.
//   - raft_tls.go: the mutual-TLS configuration from PEM files (LoadTLS).
//
// It must not touch locks, the groups' state machines, proposals or the
// client protocol: it carries Raft's messages and lockd's own peer
// messages (whose meaning is the cluster package's) and decides only
// whether a frame may reach dragonboat. It reads the memberships through
// the NodeHost it is attached to (Sources.Attach), never writes them.
package raftnet
