// Package raftlog routes dragonboat's logs into zerolog for a cluster
// node: it owns the levels dragonboat's packages log at and the
// rewording of its routine remarks.
package raftlog

import (
	"strings"
	"sync"

	"github.com/lni/dragonboat/v4/logger"
	"github.com/lockd/lockd/cluster/raftnet"
	"github.com/rs/zerolog"
)

var logOnce sync.Once

// Setup routes dragonboat's logs into zerolog, once per process
// (logger.SetLoggerFactory panics when called twice): the first node's
// logger receives them. Dragonboat's info chatter becomes debug; its
// routine remarks (routineRemarks) become info, and its remarks on a
// transport lockd does not use (ownTransportRemarks) debug.
func Setup(l zerolog.Logger) {
	logOnce.Do(func() {
		logger.SetLoggerFactory(func(pkg string) logger.ILogger { return newZlog(l, pkg) })
		for _, pkg := range []string{"raft", "rsm", "transport", "dragonboat", "logdb", "raftpb", "config", "settings", "grpc"} {
			level := logger.WARNING
			if pkg == "raft" { // for "became leader" at info
				level = logger.INFO
			}
			logger.GetLogger(pkg).SetLevel(level)
		}
	})
}

func newZlog(l zerolog.Logger, pkg string) *zlog {
	// A peer that is down makes the transport log errors every few
	// milliseconds; they are warnings for an operator.
	return &zlog{l: l.With().Str("raft_pkg", pkg).Logger(), level: logger.WARNING, errorsAreWarnings: pkg == "transport"}
}

// routineRemarks are dragonboat's warnings about what a healthy cluster
// does (elections and their votes, a tick setting lockd chose on
// purpose), matched on their format strings; they are logged at info.
var routineRemarks = []string{
	"became PreVote candidate", "became candidate", "received %s rejection from", "received %s from",
	"sent RequestPreVote to", "sent RequestVote to", "dropped RequestVote at term", "higher term",
	"cast preVote from", "rejected preVote", "cast vote from", "rejected vote", "campaign skipped",
	"rejections, quorum is", "ElectionRTT is not a magnitude larger than HeartbeatRTT",
}

// ownTransportRemarks are dragonboat's warnings about its own transport
// settings, which lockd replaces with its transport (raftnet, with
// its own mutual TLS): they say nothing true of lockd, and are logged at
// debug.
var ownTransportRemarks = []string{"mutual TLS disabled"}

// leadershipChanges are dragonboat's info messages kept at info: the
// changes of leadership an operator follows.
var leadershipChanges = []string{"became leader", "became follower"}

func matchesAny(f string, patterns []string) bool {
	for _, p := range patterns {
		if strings.Contains(f, p) {
			return true
		}
	}
	return false
}

type zlog struct {
	mu    sync.Mutex
	l     zerolog.Logger
	level logger.LogLevel

	errorsAreWarnings bool
}

func (z *zlog) SetLevel(level logger.LogLevel) { z.mu.Lock(); z.level = level; z.mu.Unlock() }

func (z *zlog) on(level logger.LogLevel) bool {
	z.mu.Lock()
	defer z.mu.Unlock()
	return level <= z.level
}

func (z *zlog) Debugf(f string, a ...any) {
	if z.on(logger.DEBUG) {
		z.l.Debug().Msgf(f, a...)
	}
}

func (z *zlog) Infof(f string, a ...any) {
	switch {
	case !z.on(logger.INFO):
	case matchesAny(f, leadershipChanges):
		z.l.Info().Msgf(f, a...)
	default:
		z.l.Debug().Msgf(f, a...)
	}
}

func (z *zlog) Warningf(f string, a ...any) {
	switch {
	case !z.on(logger.WARNING):
	case matchesAny(f, ownTransportRemarks):
		z.l.Debug().Msgf(f, a...)
	case matchesAny(f, routineRemarks):
		z.l.Info().Msgf(f, a...)
	default:
		z.l.Warn().Msgf(f, a...)
	}
}

func (z *zlog) Errorf(f string, a ...any) {
	switch {
	case !z.on(logger.ERROR):
	case z.errorsAreWarnings:
		z.l.Warn().Msgf(f, a...)
	default:
		z.l.Error().Msgf(f, a...)
	}
}

// Panicf is the transport's (raftnet.Panicf), which repairs the one
// registry conflict that must not end the process.
func (z *zlog) Panicf(f string, a ...any) { raftnet.Panicf(z.l, f, a...) }
