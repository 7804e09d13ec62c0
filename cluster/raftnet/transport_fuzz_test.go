package raftnet

import (
	"bufio"
	"bytes"
	"net"
	"testing"
	"time"

	"github.com/lni/dragonboat/v4/raftio"
	pb "github.com/lni/dragonboat/v4/raftpb"
	"github.com/rs/zerolog"
)

// fuzzGroup and its members are the membership the fuzzed transport
// checks frames against.
const fuzzGroup = 1<<32 | 1

var fuzzMembers = map[uint64]string{1: "127.0.0.1:7001", 2: "127.0.0.1:7002", 3: "127.0.0.1:7003"}

// fuzzFrame is one frame of m as a peer's frameConn writes it.
func fuzzFrame(kind byte, m pb.Marshaler, size int) []byte {
	var out bytes.Buffer
	fc := &frameConn{conn: bufferConn{w: &out}}
	if err := fc.send(kind, m, size); err != nil {
		panic(err)
	}
	return out.Bytes()
}

// bufferConn is a connection whose writes go to w.
type bufferConn struct {
	net.Conn
	w *bytes.Buffer
}

func (c bufferConn) Write(b []byte) (int, error)    { return c.w.Write(b) }
func (bufferConn) SetWriteDeadline(time.Time) error { return nil }

// FuzzRaftFrameReader feeds arbitrary bytes to what serves an accepted
// Raft connection: the frame reader, the decoding and the source check.
// Whatever arrives, nothing panics, the buffer grows only with the bytes
// that arrived, every message dragonboat is handed is for the node's
// replica of its group, names a sender and is of a kind sent between
// nodes, and its address registry is never given an invalid address, two
// addresses for one sender, nor a member's at another address than the
// membership records.
func FuzzRaftFrameReader(f *testing.F) {
	good := pb.MessageBatch{DeploymentId: DeploymentID, BinVer: raftio.TransportBinVersion, SourceAddress: fuzzMembers[2],
		Requests: []pb.Message{{Type: pb.Heartbeat, ShardID: fuzzGroup, From: 2, To: 1, Term: 3}}}
	f.Add(fuzzFrame(FrameMessages, &good, good.SizeUpperLimit()))
	forged := good
	forged.SourceAddress = "127.0.0.1:1"
	f.Add(append(fuzzFrame(FrameMessages, &good, good.SizeUpperLimit()), fuzzFrame(FrameMessages, &forged, forged.SizeUpperLimit())...))
	chunk := pb.Chunk{DeploymentId: DeploymentID, BinVer: raftio.TransportBinVersion, ShardID: fuzzGroup, From: 3, ReplicaID: 1, Data: []byte("x")}
	f.Add(fuzzFrame(FrameChunk, &chunk, chunk.Size()))
	f.Add([]byte{0x4c, 0x52, 'M', 0x04, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3})

	view := &sourcesView{groups: map[uint64]uint64{fuzzGroup: 1}, addrs: make(map[raftio.NodeInfo]string)}
	for id, addr := range fuzzMembers {
		view.addrs[raftio.NodeInfo{ShardID: fuzzGroup, ReplicaID: id}] = addr
	}
	f.Fuzz(func(t *testing.T, stream []byte) {
		sources := &Sources{}
		sources.view.Store(view)
		var delivered []pb.MessageBatch
		tr := &raftTransport{log: zerolog.Nop(), sources: sources,
			onMessages: func(mb pb.MessageBatch) { delivered = append(delivered, mb) },
			onChunk:    func(pb.Chunk) bool { return true }}
		p := peerConn{t: tr}
		r := bufio.NewReader(bytes.NewReader(stream))
		var payload []byte
		for {
			kind, body, err := ReadFrame(r, payload)
			if err != nil {
				break
			}
			if cap(body) > 2*len(stream)+frameReadStep {
				t.Fatalf("a %d-byte stream grew a %d-byte buffer", len(stream), cap(body))
			}
			if p.handle(kind, body) != nil {
				break
			}
			payload = body[:0]
		}
		// What dragonboat's registry would be given: never two addresses
		// for one sender, never a member's at another address.
		filed := make(map[uint64]string)
		for _, mb := range delivered {
			for _, m := range mb.Requests {
				if m.ShardID != fuzzGroup || m.From == 0 || m.To != 1 || m.Type == pb.InstallSnapshot {
					t.Fatalf("a %s message from replica %d to %d of group %d reached dragonboat", m.Type, m.From, m.To, m.ShardID)
				}
				if mb.SourceAddress == "" {
					continue
				}
				if !validRaftAddr(mb.SourceAddress) {
					t.Fatalf("source address %q reached dragonboat", mb.SourceAddress)
				}
				if addr := fuzzMembers[m.From]; addr != "" && addr != mb.SourceAddress {
					t.Fatalf("member %d reached dragonboat at %q, not its %q", m.From, mb.SourceAddress, addr)
				}
				if first, ok := filed[m.From]; ok && first != mb.SourceAddress {
					t.Fatalf("replica %d reached dragonboat at %q and at %q", m.From, first, mb.SourceAddress)
				}
				filed[m.From] = mb.SourceAddress
			}
		}
	})
}
