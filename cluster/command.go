package cluster

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/lockd/lockd/engine"
)

// A proposal is one batch of commands for one group (group commit):
//
//	version u8 (=3) | term u64 | leader u64 | elapsed i64 | applied u64 |
//	dated u64 | since_dated i64 | dated_term u64 | dated_now i64 | count u32 | count × command
//
// from log format 5 on: the leadership the proposer knew, the elapsed
// time of its own leadership on its monotonic clock (ns; -1 when the
// proposer did not lead: undated), the index it had applied, and the
// last dated batch among them with its time since applying it, the
// clock's term and the group's time there (clock.go).
// Before format 5 the header is the wall-clock form
//
//	version u8 (=2) | now i64 (proposer's wall clock, Unix ns) | count u32
//
// and a command is
//
//	kind u8 | fields by kind | tenant len u8 + bytes | key len u8 + bytes
//
//	cmdAcquire: node u64 | id u64 | lease_s u16 | wait i64 (ns; 0 = one attempt) | key_limit u32
//
// The wait is relative and the state machine adds it to its own time, so
// one proposer's fast clock cannot make every later wait look elapsed. The
// key limit is the proposer's share of --max-keys for the group: it rides
// in the command because Update must not read node-local configuration —
// replicas with different flags would otherwise decide differently.
//
//	cmdAcquireBy: the fields of cmdAcquire | requester u64: an acquire of a
//	             session (SPEC §6a), which its requester may abandon;
//	             written only from log format 4 on
//	cmdAbandon:  node u64 | id u64 | requester u64: SPEC §6a ABANDON of
//	             the requester's acquire of the key, answered to id on
//	             node; written only from log format 4 on
//	cmdRelease:  node u64 | id u64 (0 = nobody waits for the answer) | token u64
//	cmdKeep:     node u64 | id u64 (0 = nobody waits for the answer) | token u64 | renewals u32 | lease_s u16
//	cmdLeaseEnd: (tenant and key only) proposed by the leader when a lease
//	             fell due on its heap: the key is settled on the
//	             replicated clock like before any command, which frees it
//	             only if its lease has ended there
//	cmdForget:   node u64 | keep_first u64 | keep_last u64 (tenant and key empty):
//	             drop node's queued waiters except those whose request id
//	             (without its top bit) is within [keep_first, keep_last] —
//	             proposed by a restarted node for the runs before it, and
//	             by a group leader for a node it has not heard from
//	cmdCancel:   node u64 | id u64: node's queued waiter id left (its
//	             connection closed); no answer, a lock is not touched
//	cmdFormat:   format u32 (tenant and key empty): the group's log format
//	             rises to format (version.go); written only by a leader
//	             whose every member stated it reads it
//
// A KEEP names the renewal it extends, as the proposer's replica last saw it, so
// that a retried proposal applied twice renews once: the second apply
// finds a later renewal.
//
// All integers big-endian. Time only enters the state machine through
// these fields; Update never reads a clock.
//
// The batch version is 2 in log formats 3 and 4 and 3 from format 5 on
// (version.go): the batches of the formats before 3 are refused whole,
// and a build of formats 3 and 4 halts at the first batch of version 3.
const (
	batchVersionWall = 2
	batchVersion     = 3
	headerLen        = 1 + 8 + 4   // batch version 2
	datedHeaderLen   = 1 + 8*8 + 4 // batch version 3

	cmdAcquire  = 'A'
	cmdRelease  = 'R'
	cmdKeep     = 'K'
	cmdLeaseEnd = 'D'
	cmdForget   = 'F'
	cmdCancel   = 'C'
	cmdFormat   = 'N'
	// log format 4 on (version.go):
	cmdAcquireBy = 'Q'
	cmdAbandon   = 'X'
)

var errBadBatch = errors.New("cluster: malformed proposal")

// errUnknownCommand is a batch version or command kind this build does not
// know: a newer build wrote it, and this replica must not apply past it
// (version.go, halt).
var errUnknownCommand = errors.New("cluster: unknown")

type command struct {
	kind     byte
	node, id uint64
	token    uint64
	renewals uint32
	lease    uint16
	wait     int64
	keyLimit uint32
	// requester tags a session's acquire (cmdAcquireBy) and names the
	// acquire an abandon gives back; 0 for an acquire without a session.
	requester engine.Requester
	// keepFirst and keepLast are cmdForget's range of ids to keep.
	keepFirst, keepLast uint64
	format              uint32 // cmdFormat
	tenant              []byte
	key                 []byte
}

func appendText(dst []byte, tenant string, key []byte) []byte {
	dst = append(dst, byte(len(tenant)))
	dst = append(dst, tenant...)
	dst = append(dst, byte(len(key)))
	return append(dst, key...)
}

// appendAcquire appends an acquire: a cmdAcquireBy when it has a
// requester, which only a group at log format 4 may be given.
func appendAcquire(dst []byte, node, id uint64, lease uint16, wait int64, keyLimit uint32, r engine.Requester, tenant string, key []byte) []byte {
	kind := byte(cmdAcquire)
	if r != 0 {
		kind = cmdAcquireBy
	}
	dst = append(dst, kind)
	dst = binary.BigEndian.AppendUint64(dst, node)
	dst = binary.BigEndian.AppendUint64(dst, id)
	dst = binary.BigEndian.AppendUint16(dst, lease)
	dst = binary.BigEndian.AppendUint64(dst, uint64(wait))
	dst = binary.BigEndian.AppendUint32(dst, keyLimit)
	if r != 0 {
		dst = binary.BigEndian.AppendUint64(dst, uint64(r))
	}
	return appendText(dst, tenant, key)
}

func appendAbandon(dst []byte, node, id uint64, r engine.Requester, tenant string, key []byte) []byte {
	dst = append(dst, cmdAbandon)
	dst = binary.BigEndian.AppendUint64(dst, node)
	dst = binary.BigEndian.AppendUint64(dst, id)
	dst = binary.BigEndian.AppendUint64(dst, uint64(r))
	return appendText(dst, tenant, key)
}

func appendRelease(dst []byte, node, id, token uint64, tenant string, key []byte) []byte {
	dst = append(dst, cmdRelease)
	dst = binary.BigEndian.AppendUint64(dst, node)
	dst = binary.BigEndian.AppendUint64(dst, id)
	dst = binary.BigEndian.AppendUint64(dst, token)
	return appendText(dst, tenant, key)
}

func appendKeep(dst []byte, node, id, token uint64, renewals uint32, lease uint16, tenant string, key []byte) []byte {
	dst = append(dst, cmdKeep)
	dst = binary.BigEndian.AppendUint64(dst, node)
	dst = binary.BigEndian.AppendUint64(dst, id)
	dst = binary.BigEndian.AppendUint64(dst, token)
	dst = binary.BigEndian.AppendUint32(dst, renewals)
	dst = binary.BigEndian.AppendUint16(dst, lease)
	return appendText(dst, tenant, key)
}

func appendForget(dst []byte, node, keepFirst, keepLast uint64) []byte {
	dst = append(dst, cmdForget)
	dst = binary.BigEndian.AppendUint64(dst, node)
	dst = binary.BigEndian.AppendUint64(dst, keepFirst)
	dst = binary.BigEndian.AppendUint64(dst, keepLast)
	return appendText(dst, "", nil)
}

func appendCancel(dst []byte, node, id uint64, tenant string, key []byte) []byte {
	dst = append(dst, cmdCancel)
	dst = binary.BigEndian.AppendUint64(dst, node)
	dst = binary.BigEndian.AppendUint64(dst, id)
	return appendText(dst, tenant, key)
}

func appendFormat(dst []byte, format uint32) []byte {
	dst = append(dst, cmdFormat)
	dst = binary.BigEndian.AppendUint32(dst, format)
	return appendText(dst, "", nil)
}

func appendLeaseEnd(dst []byte, tenant string, key []byte) []byte {
	dst = append(dst, cmdLeaseEnd)
	return appendText(dst, tenant, key)
}

// putHeader fills the wall-clock header (batch version 2) reserved at the
// start of a batch.
func putHeader(b []byte, now int64, count uint32) {
	b[0] = batchVersionWall
	binary.BigEndian.PutUint64(b[1:], uint64(now))
	binary.BigEndian.PutUint32(b[9:], count)
}

// putDatedHeader fills the header of batch version 3 reserved at the
// start of a batch.
func putDatedHeader(b []byte, st stamp, count uint32) {
	b[0] = batchVersion
	binary.BigEndian.PutUint64(b[1:], st.term)
	binary.BigEndian.PutUint64(b[9:], st.leader)
	binary.BigEndian.PutUint64(b[17:], uint64(st.elapsed))
	binary.BigEndian.PutUint64(b[25:], st.applied)
	binary.BigEndian.PutUint64(b[33:], st.dated)
	binary.BigEndian.PutUint64(b[41:], uint64(st.sinceDated))
	binary.BigEndian.PutUint64(b[49:], st.datedTerm)
	binary.BigEndian.PutUint64(b[57:], uint64(st.datedNow))
	binary.BigEndian.PutUint32(b[65:], count)
}

func readHeader(b []byte) (st stamp, count uint32, rest []byte, err error) {
	switch {
	case len(b) < 1:
		return stamp{}, 0, nil, errBadBatch
	case b[0] == batchVersionWall:
		if len(b) < headerLen {
			return stamp{}, 0, nil, errBadBatch
		}
		st = stamp{legacy: true, wall: int64(binary.BigEndian.Uint64(b[1:]))}
		return st, binary.BigEndian.Uint32(b[9:]), b[headerLen:], nil
	case b[0] == batchVersion:
		if len(b) < datedHeaderLen {
			return stamp{}, 0, nil, errBadBatch
		}
		be := binary.BigEndian
		st = stamp{term: be.Uint64(b[1:]), leader: be.Uint64(b[9:]), elapsed: time.Duration(be.Uint64(b[17:])), applied: be.Uint64(b[25:]),
			dated: be.Uint64(b[33:]), sinceDated: time.Duration(be.Uint64(b[41:])),
			datedTerm: be.Uint64(b[49:]), datedNow: time.Duration(be.Uint64(b[57:]))}
		return st, be.Uint32(b[65:]), b[datedHeaderLen:], nil
	}
	return stamp{}, 0, nil, fmt.Errorf("%w batch version %d (this build reads %d and %d)", errUnknownCommand, b[0], batchVersionWall, batchVersion)
}

// fieldsLen is the length of the fields of a command of kind, between
// its kind and its text; an error for a kind this build does not know.
func fieldsLen(kind byte) (int, error) {
	switch kind {
	case cmdAcquire:
		return 8 + 8 + 2 + 8 + 4, nil
	case cmdAcquireBy:
		return 8 + 8 + 2 + 8 + 4 + 8, nil
	case cmdAbandon:
		return 8 + 8 + 8, nil
	case cmdRelease:
		return 8 + 8 + 8, nil
	case cmdKeep:
		return 8 + 8 + 8 + 4 + 2, nil
	case cmdLeaseEnd:
		return 0, nil
	case cmdForget:
		return 8 + 8 + 8, nil
	case cmdCancel:
		return 8 + 8, nil
	case cmdFormat:
		return 4, nil
	}
	return 0, fmt.Errorf("%w command kind %q", errUnknownCommand, kind)
}

// readCommand decodes one command; its slices point into b.
func readCommand(b []byte, c *command) ([]byte, error) {
	if len(b) < 1 {
		return nil, errBadBatch
	}
	c.kind = b[0]
	b = b[1:]
	need, err := fieldsLen(c.kind)
	if err != nil {
		return nil, err
	}
	if len(b) < need {
		return nil, errBadBatch
	}
	c.requester = 0
	switch c.kind {
	case cmdAcquire, cmdAcquireBy:
		c.node = binary.BigEndian.Uint64(b)
		c.id = binary.BigEndian.Uint64(b[8:])
		c.lease = binary.BigEndian.Uint16(b[16:])
		c.wait = int64(binary.BigEndian.Uint64(b[18:]))
		c.keyLimit = binary.BigEndian.Uint32(b[26:])
		if c.kind == cmdAcquireBy {
			c.requester = engine.Requester(binary.BigEndian.Uint64(b[30:]))
		}
	case cmdAbandon:
		c.node = binary.BigEndian.Uint64(b)
		c.id = binary.BigEndian.Uint64(b[8:])
		c.requester = engine.Requester(binary.BigEndian.Uint64(b[16:]))
	case cmdRelease:
		c.node = binary.BigEndian.Uint64(b)
		c.id = binary.BigEndian.Uint64(b[8:])
		c.token = binary.BigEndian.Uint64(b[16:])
	case cmdKeep:
		c.node = binary.BigEndian.Uint64(b)
		c.id = binary.BigEndian.Uint64(b[8:])
		c.token = binary.BigEndian.Uint64(b[16:])
		c.renewals = binary.BigEndian.Uint32(b[24:])
		c.lease = binary.BigEndian.Uint16(b[28:])
	case cmdForget:
		c.node = binary.BigEndian.Uint64(b)
		c.keepFirst = binary.BigEndian.Uint64(b[8:])
		c.keepLast = binary.BigEndian.Uint64(b[16:])
	case cmdCancel:
		c.node = binary.BigEndian.Uint64(b)
		c.id = binary.BigEndian.Uint64(b[8:])
	case cmdFormat:
		c.format = binary.BigEndian.Uint32(b)
	}
	b = b[need:]
	var ok bool
	if c.tenant, b, ok = readText(b); !ok {
		return nil, errBadBatch
	}
	if c.key, b, ok = readText(b); !ok {
		return nil, errBadBatch
	}
	return b, nil
}

func readText(b []byte) ([]byte, []byte, bool) {
	if len(b) < 1 || len(b) < 1+int(b[0]) {
		return nil, nil, false
	}
	n := int(b[0])
	return b[1 : 1+n], b[1+n:], true
}

// lockKey is the state machine's map key: tenant names cannot contain
// 0x00 (SPEC §3), so the first 0x00 separates tenant from key.
func lockKey(tenant, key []byte) string {
	b := make([]byte, 0, len(tenant)+1+len(key))
	b = append(b, tenant...)
	b = append(b, 0)
	return string(append(b, key...))
}

func splitLockKey(k string) (tenant string, key []byte) {
	for i := 0; i < len(k); i++ {
		if k[i] == 0 {
			return k[:i], []byte(k[i+1:])
		}
	}
	return "", []byte(k)
}

// groupOf places (tenant, key) on one of groups Raft groups by 64-bit
// FNV-1a over tenant | 0x00 | key. The function is part of the on-disk
// format: changing it (or the group count) would move keys between groups
// and break their token monotonicity.
func groupOf(tenant string, key []byte, groups int) int {
	const offset, prime = 14695981039346656037, 1099511628211
	h := uint64(offset)
	for i := 0; i < len(tenant); i++ {
		h = (h ^ uint64(tenant[i])) * prime
	}
	h *= prime // the 0x00 separator: h ^ 0 is h
	for _, c := range key {
		h = (h ^ uint64(c)) * prime
	}
	return int(h % uint64(groups))
}

// unreadable is what in the batch cmd this build cannot apply — a batch
// version or a command kind it does not know, or a format above the
// newest it reads — nil when there is none. It walks the commands without
// decoding their fields. A batch this build can read but finds malformed
// is Update's to skip: every replica of the same build skips it alike.
func unreadable(cmd []byte) error {
	_, count, b, err := readHeader(cmd)
	if err != nil {
		if errors.Is(err, errUnknownCommand) {
			return err
		}
		return nil
	}
	for range count {
		if len(b) < 1 {
			return nil
		}
		kind := b[0]
		need, err := fieldsLen(kind)
		if err != nil {
			return err
		}
		if len(b) < 1+need {
			return nil
		}
		if kind == cmdFormat {
			if format := binary.BigEndian.Uint32(b[1:]); format > logFormatNewest {
				return fmt.Errorf("%w log format %d (this build reads %d to %d)", errUnknownCommand, format, logFormatBase, logFormatNewest)
			}
		}
		var ok bool
		if _, b, ok = readText(b[1+need:]); !ok {
			return nil
		}
		if _, b, ok = readText(b); !ok {
			return nil
		}
	}
	return nil
}
