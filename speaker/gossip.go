package speaker

import (
	"github.com/go-logr/logr"

	"github.com/ironlb/ironlb/internal/membership"
	"github.com/ironlb/ironlb/internal/ownership"
)

// gossip replicates the ownership claims over memberlist: the full replica in
// every push/pull (at join, on Sync, and every PushPullInterval), and each
// claim this node decides as a broadcast. It also receives the watchers'
// data-path verdicts, sent straight to every member.
type gossip struct {
	log logr.Logger
	own *owners
}

var _ membership.StateDelegate = gossip{}

func (g gossip) LocalState(bool) []byte { return ownership.AppendClaims(nil, g.own.Claims()...) }

func (g gossip) MergeRemoteState(buf []byte, join bool) { g.merge(buf, "push/pull") }

func (g gossip) NotifyMsg(msg []byte) {
	if ownership.IsVerdict(msg) {
		v, err := ownership.DecodeVerdict(msg)
		if err != nil {
			g.log.Info("ignoring a data-path verdict that does not parse", "error", err.Error())
			return
		}
		if v.Node != g.own.self {
			g.log.Info("data-path verdict from a watcher", "node", v.Node, "verdict", v.Path.String())
			g.own.SetPath(v.Node, v.Path, "", nil)
		}
		return
	}
	g.merge(msg, "broadcast")
}

func (g gossip) merge(b []byte, via string) {
	claims, err := ownership.DecodeClaims(b)
	if err != nil {
		g.log.Info("ignoring an ownership message that does not parse", "via", via, "error", err.Error())
		return
	}
	g.own.Merge(claims)
}

// broadcaster returns the function owners gossips its decisions with.
func broadcaster(ml *membership.List) func([]ownership.Claim) {
	return func(claims []ownership.Claim) {
		for _, c := range claims {
			ml.Broadcast(c.Key, ownership.AppendClaims(nil, c))
		}
	}
}

// verdictSender returns the function a watcher sends its verdicts with.
func verdictSender(ml *membership.List) func(ownership.Verdict) {
	return func(v ownership.Verdict) { ml.SendToAll(ownership.AppendVerdict(nil, v)) }
}
