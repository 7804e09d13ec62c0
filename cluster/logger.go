package cluster

import (
	"sync"

	"github.com/lni/dragonboat/v4/logger"
	"github.com/rs/zerolog"
)

var logOnce sync.Once

// setupLogging routes dragonboat's logs into zerolog, once per process
// (logger.SetLoggerFactory panics when called twice): the first node's
// logger receives them. Dragonboat's info chatter becomes debug.
func setupLogging(l zerolog.Logger) {
	logOnce.Do(func() {
		logger.SetLoggerFactory(func(pkg string) logger.ILogger {
			// A peer that is down makes the transport log errors every few
			// milliseconds; they are warnings for an operator.
			return &zlog{l: l.With().Str("raft_pkg", pkg).Logger(), level: logger.WARNING, errorsAreWarnings: pkg == "transport"}
		})
		for _, pkg := range []string{"raft", "rsm", "transport", "dragonboat", "logdb", "raftpb", "config", "settings", "grpc"} {
			logger.GetLogger(pkg).SetLevel(logger.WARNING)
		}
	})
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
	if z.on(logger.INFO) {
		z.l.Debug().Msgf(f, a...)
	}
}

func (z *zlog) Warningf(f string, a ...any) {
	if z.on(logger.WARNING) {
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

func (z *zlog) Panicf(f string, a ...any) { z.l.Panic().Msgf(f, a...) }
