package raftlog

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/lni/dragonboat/v4/logger"
	"github.com/rs/zerolog"
)

// An election and lockd's own tick setting are routine: dragonboat's
// warnings about them are logged at info, and its real warnings stay
// warnings.
func TestDragonboatRoutineRemarksAreInfo(t *testing.T) {
	var out bytes.Buffer
	l := zerolog.New(&out)
	raft, config, transport := newZlog(l, "raft"), newZlog(l, "config"), newZlog(l, "transport")
	raft.SetLevel(logger.INFO)
	for _, tc := range []struct {
		log  func(string, ...any)
		f    string
		args []any
		want string
	}{
		{raft.Warningf, "%s became candidate", []any{"[f:1,r:1]"}, "info"},
		{raft.Warningf, "%s became PreVote candidate", []any{"[f:1,r:1]"}, "info"},
		{raft.Warningf, "%s received %s from %s", []any{"[f:1,r:1]", "RequestVoteResp", "2"}, "info"},
		{raft.Warningf, "%s cast vote from %s index %d term %d, log term: %d", []any{"a", "b", 1, 2, 3}, "info"},
		{raft.Warningf, "%s become follower after receiving higher term from %s", []any{"a", "b"}, "info"},
		{raft.Infof, "%s became leader", []any{"[f:1,r:1]"}, "info"},
		{raft.Infof, "%s created, initial: %t, new: %t", []any{"a", true, true}, "debug"},
		{config.Warningf, "ElectionRTT is not a magnitude larger than HeartbeatRTT", nil, "info"},
		{raft.Warningf, "%s received %d votes and %d rejections, quorum is %d", []any{"a", 2, 0, 2}, "info"},
		{raft.Warningf, "%s received %d preVotes and %d rejections, quorum is %d", []any{"a", 2, 0, 2}, "info"},
		{config.Warningf, "mutual TLS disabled, communication is insecure", nil, "debug"},
		{raft.Warningf, "%s has lost quorum", []any{"[f:1,r:1]"}, "warn"},
		{transport.Errorf, "failed to connect to %s", []any{"127.0.0.1:1"}, "warn"},
	} {
		out.Reset()
		tc.log(tc.f, tc.args...)
		var entry struct{ Level string }
		if err := json.Unmarshal(out.Bytes(), &entry); err != nil || entry.Level != tc.want {
			t.Errorf("%q: logged %q, want level %s", tc.f, out.String(), tc.want)
		}
	}
}
