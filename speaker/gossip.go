package speaker

import (
	"context"
	"sync"

	"github.com/go-logr/logr"

	"github.com/ironlb/ironlb/internal/membership"
	"github.com/ironlb/ironlb/internal/ownership"
)

// gossip replicates the ownership claims over memberlist: the full replica in
// every push/pull (at join, on Sync, and every PushPullInterval), and each
// claim this node decides as a broadcast. It also receives the watchers'
// data-path verdicts, sent straight to every member.
//
// Messages are handed to the ownership layer by run, not by NotifyMsg itself.
// NotifyMsg runs on memberlist's one handler goroutine, which also handles
// memberlist's own suspect and dead messages from one queue of 1,024
// (HandoffQueueDepth) that drops what overflows. A takeover of thousands of
// IPs makes every survivor broadcast thousands of claims at once; waiting for
// the ownership lock once per claim, the handler fell behind, and the queue
// dropped verdicts and failure-detector messages with the claims. NotifyMsg
// only decodes and queues, and run merges whatever arrived in one call.
type gossip struct {
	log  logr.Logger
	own  *owners
	kick chan struct{} // something was queued

	mu       sync.Mutex
	claims   []ownership.Claim
	verdicts []ownership.Verdict
	dropped  int // claims not queued since the last report (inbox full)
}

var _ membership.StateDelegate = (*gossip)(nil)

// maxQueuedClaims bounds the claims waiting for run (~10 MB): beyond it,
// claims are dropped (and counted in the log) for the next push/pull to
// repair, rather than memory growing without bound.
const maxQueuedClaims = 1 << 18

func newGossip(log logr.Logger, own *owners) *gossip {
	return &gossip{log: log, own: own, kick: make(chan struct{}, 1)}
}

func (g *gossip) LocalState(bool) []byte { return ownership.AppendClaims(nil, g.own.Claims()...) }

// MergeRemoteState merges a push/pull's claims directly: they arrive on
// memberlist's TCP handler, not the queue NotifyMsg serves, as one batch.
func (g *gossip) MergeRemoteState(buf []byte, join bool) {
	claims, err := ownership.DecodeClaims(buf)
	if err != nil {
		g.log.Info("ignoring an ownership state that does not parse", "via", "push/pull", "error", err.Error())
		return
	}
	g.own.Merge(claims)
}

// NotifyMsg decodes a broadcast claim or a verdict and queues it for run.
func (g *gossip) NotifyMsg(msg []byte) {
	if ownership.IsVerdict(msg) {
		v, err := ownership.DecodeVerdict(msg)
		if err != nil {
			g.log.Info("ignoring a data-path verdict that does not parse", "error", err.Error())
			return
		}
		if v.Node == g.own.self {
			return // about this node itself: it knows better
		}
		g.mu.Lock()
		g.verdicts = append(g.verdicts, v)
		g.mu.Unlock()
		g.wake()
		return
	}
	claims, err := ownership.DecodeClaims(msg)
	if err != nil {
		g.log.Info("ignoring an ownership message that does not parse", "via", "broadcast", "error", err.Error())
		return
	}
	g.mu.Lock()
	if n := maxQueuedClaims - len(g.claims); n < len(claims) {
		g.dropped += len(claims) - max(n, 0)
		claims = claims[:max(n, 0)]
	}
	g.claims = append(g.claims, claims...)
	g.mu.Unlock()
	g.wake()
}

func (g *gossip) wake() {
	select {
	case g.kick <- struct{}{}:
	default:
	}
}

// run hands what NotifyMsg queued to the ownership layer until ctx ends:
// the verdicts in the order they came, then the claims as one merge.
func (g *gossip) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-g.kick:
		}
		g.mu.Lock()
		claims, verdicts, dropped := g.claims, g.verdicts, g.dropped
		g.claims, g.verdicts, g.dropped = nil, nil, 0
		g.mu.Unlock()
		if dropped > 0 {
			g.log.Info("ownership messages arrived faster than they could be merged; dropped some claims, which the next push/pull repairs", "dropped", dropped)
		}
		for _, v := range verdicts {
			g.log.Info("data-path verdict from a watcher", "node", v.Node, "verdict", v.Path.String())
			g.own.SetPath(v.Node, v.Path, "", nil)
		}
		g.own.Merge(claims)
	}
}

// broadcaster returns the function owners gossips its decisions with.
//
// A decision's claims are packed into as few messages as fit
// (membership.MaxBroadcast bytes, ~20 claims): a takeover of 1,250 IPs is ~65
// messages per survivor instead of 1,250, each of which cost every receiver a
// slot in memberlist's handler queue of 1,024, shared with its suspect and
// dead messages and with the watchers' verdicts. A lone claim keeps its key,
// so a newer claim for the same IP replaces it in the queue; a pack replaces
// nothing, which costs at most a stale claim that loses to the newer epoch.
func broadcaster(ml *membership.List) func([]ownership.Claim) {
	return func(claims []ownership.Claim) {
		key := "" // a pack: replaces nothing
		if len(claims) == 1 {
			key = claims[0].Key
		}
		for _, msg := range ownership.PackClaims(claims, membership.MaxBroadcast) {
			ml.Broadcast(key, msg)
		}
	}
}

// verdictSender returns the function a watcher sends its verdicts with.
func verdictSender(ml *membership.List) func(ownership.Verdict) {
	return func(v ownership.Verdict) { ml.SendToAll(ownership.AppendVerdict(nil, v)) }
}
