package speaker

import (
	"context"
	"strconv"
	"sync"

	"github.com/go-logr/logr"

	"github.com/ironlb/ironlb/internal/membership"
	"github.com/ironlb/ironlb/internal/ownership"
)

// gossip replicates the ownership claims and the watchers' votes over
// memberlist: the full replica (claims and votes) in every push/pull (at
// join, on Sync, and every PushPullInterval), each claim this node decides as
// a broadcast, and each watcher's votes sent straight to every member when
// one changes and re-sent as gossip (health.resendVotes).
//
// Messages are handed to the ownership layer by run, not by NotifyMsg itself.
// NotifyMsg runs on memberlist's one handler goroutine, which also handles
// memberlist's own suspect and dead messages from one queue of 1,024
// (HandoffQueueDepth) that drops what overflows. A takeover of thousands of
// IPs makes every survivor broadcast thousands of claims at once; waiting for
// the ownership lock once per claim, the handler fell behind, and the queue
// dropped votes and failure-detector messages with the claims. NotifyMsg
// only decodes and queues (bounded, drops counted), and run merges whatever
// arrived in one call.
type gossip struct {
	log     logr.Logger
	own     *owners
	metrics *metrics
	kick    chan struct{} // something was queued

	mu     sync.Mutex
	claims []ownership.Claim
	votes  []ownership.Vote
	// dropped counts what was not queued since the last report (inbox
	// full), by metric reason.
	dropped map[string]int
}

var _ membership.StateDelegate = (*gossip)(nil)

// maxQueuedClaims bounds the claims waiting for run (~10 MB) and
// maxQueuedVotes the votes: beyond them, messages are dropped (and counted)
// for the next push/pull or re-send to repair, rather than memory growing
// without bound.
const (
	maxQueuedClaims = 1 << 18
	maxQueuedVotes  = 1 << 14
)

// Reasons of ironlb_peer_inputs_dropped_total for full inboxes (the engine's
// own reasons are ownership.Drop).
const (
	dropClaimQueueFull = "claimQueueFull"
	dropVoteQueueFull  = "voteQueueFull"
)

func newGossip(log logr.Logger, own *owners, m *metrics) *gossip {
	return &gossip{log: log, own: own, metrics: m, kick: make(chan struct{}, 1), dropped: map[string]int{}}
}

func (g *gossip) LocalState(bool) []byte {
	claims, votes := g.own.State()
	return ownership.AppendState(nil, claims, votes)
}

// MergeRemoteState merges a push/pull's claims and votes directly: they
// arrive on memberlist's TCP handler, not the queue NotifyMsg serves, as one
// batch.
func (g *gossip) MergeRemoteState(buf []byte, join bool) {
	claims, votes, err := ownership.DecodeState(buf)
	if err != nil {
		g.log.Info("ignoring an ownership state that does not parse", "via", "push/pull", "error", err.Error())
		return
	}
	g.own.Merge(claims)
	g.own.MergeVotes(votes)
}

// NotifyMsg decodes broadcast claims or votes and queues them for run.
func (g *gossip) NotifyMsg(msg []byte) {
	if ownership.IsVotes(msg) {
		votes, err := ownership.DecodeVotes(msg)
		if err != nil {
			g.log.Info("ignoring data-path votes that do not parse", "error", err.Error())
			return
		}
		g.mu.Lock()
		g.votes = appendBounded(g.votes, votes, maxQueuedVotes, g.dropped, dropVoteQueueFull)
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
	g.claims = appendBounded(g.claims, claims, maxQueuedClaims, g.dropped, dropClaimQueueFull)
	g.mu.Unlock()
	g.wake()
}

// appendBounded appends what fits of more to q (at most limit in all),
// counting the rest under reason.
func appendBounded[T any](q, more []T, limit int, dropped map[string]int, reason string) []T {
	if n := limit - len(q); n < len(more) {
		dropped[reason] += len(more) - max(n, 0)
		more = more[:max(n, 0)]
	}
	return append(q, more...)
}

func (g *gossip) wake() {
	select {
	case g.kick <- struct{}{}:
	default:
	}
}

// run hands what NotifyMsg queued to the ownership layer until ctx ends: the
// votes, then the claims, each as one batch.
func (g *gossip) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-g.kick:
		}
		g.mu.Lock()
		claims, votes, dropped := g.claims, g.votes, g.dropped
		g.claims, g.votes, g.dropped = nil, nil, map[string]int{}
		g.mu.Unlock()
		for reason, n := range dropped {
			g.metrics.dropped.WithLabelValues(reason).Add(float64(n))
			g.log.Info("ownership messages arrived faster than they could be merged; dropped some, which the next push/pull or re-send repairs", "reason", reason, "dropped", n)
		}
		for _, v := range votes {
			if v.Path == ownership.PathDown {
				g.log.Info("data-path vote from a watcher", "node", v.Node, "watcher", v.Watcher, "verdict", v.Path.String())
			} else {
				g.log.V(1).Info("data-path vote from a watcher", "node", v.Node, "watcher", v.Watcher, "verdict", v.Path.String())
			}
		}
		for res, n := range g.own.MergeVotes(votes) {
			if res != ownership.VoteAccepted && res != ownership.VoteStale {
				g.log.V(1).Info("data-path votes not counted", "reason", res.String(), "votes", n)
			}
		}
		g.own.Merge(claims)
	}
}

// broadcaster returns the function owners gossips its decisions with.
//
// A decision's claims are packed into as few messages as fit
// (membership.MaxBroadcast bytes): each received message costs every
// receiver a slot in memberlist's handler queue, shared with its suspect and
// dead messages and with the watchers' votes. A lone claim keeps its key, so
// a newer claim for the same IP replaces it in the queue; a pack replaces
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

// voteSender is how a watcher publishes its votes: send delivers them to
// every member at once (a changed finding must not wait for gossip) and
// returns how many sends failed; gossip queues them for memberlist's
// retransmitting broadcast, replacing this watcher's previous ones, so that
// members that missed the direct send (loss, a partition that healed) get
// them.
type voteSender struct {
	send   func(msg []byte) (failed, members int)
	gossip func(key string, msg []byte)
}

func newVoteSender(ml *membership.List) voteSender {
	return voteSender{
		send: func(msg []byte) (int, int) {
			return ml.SendToAll(msg), len(ml.States()) - 1
		},
		gossip: ml.Broadcast,
	}
}

// sendNow sends votes to every member; it reports whether every send failed
// (this node cannot reach anyone: its view is not to be trusted).
func (s voteSender) sendNow(votes []ownership.Vote) (allFailed bool) {
	if s.send == nil {
		return false
	}
	for _, msg := range ownership.PackVotes(votes, membership.MaxBroadcast) {
		if failed, members := s.send(msg); members > 0 && failed >= members {
			allFailed = true
		}
	}
	return allFailed
}

// resend queues this watcher's current votes as gossip, each pack replacing
// the previous re-send's.
func (s voteSender) resend(self string, votes []ownership.Vote) {
	if s.gossip == nil {
		return
	}
	for i, msg := range ownership.PackVotes(votes, membership.MaxBroadcast) {
		s.gossip("votes/"+self+"/"+strconv.Itoa(i), msg)
	}
}
