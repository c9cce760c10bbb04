package ownership

import (
	"slices"
	"strings"
	"time"
)

// Vote is one watcher's finding on a node's data path. It is evidence, not a
// command: a replica counts it only while its sender is one of the node's
// designated watchers (Watchers), keeps the latest per watcher, and takes the
// node's data path as down only when a majority of those watchers agree
// (Engine.pathOf). One watcher whose own link, port or CPU failed therefore
// cannot move another node's keys.
type Vote struct {
	// Node is the node judged, Watcher the node that judged it.
	Node, Watcher string
	Path          Path
	// Seq orders a watcher's findings on one node: the watcher's wall clock
	// (UnixNano) when it reached this one. A re-sent finding keeps its Seq;
	// a higher Seq supersedes, so loss, duplication and reordering of the
	// messages carrying votes cannot leave an older finding in place.
	Seq uint64
}

// voteTTL is how long a vote counts without being received again. Watchers
// re-send their current votes well within it (package speaker), so only a
// watcher that stopped watching (or cannot reach anyone) lets its votes
// lapse, and then a replica forgets what it said.
const voteTTL = 10 * time.Second

type vote struct {
	path Path
	seq  uint64
	at   time.Time // when this replica last received it
}

// VoteResult says what a replica did with a vote: Accepted, or why it was
// dropped.
type VoteResult int

const (
	// VoteAccepted: recorded (a newer finding, or a re-send refreshing one).
	VoteAccepted VoteResult = iota
	// VoteStale: an older finding than the one held for this watcher.
	VoteStale
	// VoteNotWatcher: the sender is not one of the node's watchers in this
	// replica's view, so its finding is not evidence here.
	VoteNotWatcher
	// VoteUnknownNode: about a node this replica has never seen as a member
	// or an owner; keeping it would let peers grow the state without bound.
	VoteUnknownNode
)

func (r VoteResult) String() string {
	return [...]string{"accepted", "stale", "notWatcher", "unknownNode"}[r]
}

// Drop is a kind of peer input the engine refused to keep, counted for the
// speaker's metrics (every map fed by peers is bounded).
type Drop int

const (
	// DropVoteStale .. DropVoteUnknownNode mirror VoteResult.
	DropVoteStale Drop = iota
	DropVoteNotWatcher
	DropVoteUnknownNode
	// DropClaimEpoch: a claim whose epoch is past MaxEpoch, or more than
	// maxEpochStep ahead of the replica's claim for the key.
	DropClaimEpoch
	// DropClaimForeign: a claim for a key no Service here has ever used,
	// beyond maxForeignClaims.
	DropClaimForeign
	numDrops
)

func (d Drop) String() string {
	return [...]string{"voteStale", "voteNotWatcher", "voteUnknownNode", "claimEpoch", "claimForeign"}[d]
}

// DropCounts counts refused inputs by Drop.
type DropCounts [numDrops]uint64

// Drops returns how many inputs of each kind were refused so far.
func (e *Engine) Drops() DropCounts { return e.drops }

// AllDrops lists every Drop, for exporting the counters.
func AllDrops() []Drop {
	out := make([]Drop, numDrops)
	for i := range out {
		out[i] = Drop(i)
	}
	return out
}

// Vote records a watcher's finding and re-decides what it changes.
func (e *Engine) Vote(v Vote, now time.Time) ([]Change, VoteResult) {
	changes := e.Tick(now)
	n := e.nodes[v.Node]
	if n == nil {
		e.drops[DropVoteUnknownNode]++
		return changes, VoteUnknownNode
	}
	if !slices.Contains(e.Watchers(v.Node, WatchersPerNode), v.Watcher) {
		if v.Watcher == e.opts.Self {
			// Its own finding, withdrawn as it stopped watching: nothing
			// a peer sent, no drop.
			delete(n.votes, v.Watcher)
			return changes, VoteNotWatcher
		}
		e.drops[DropVoteNotWatcher]++
		return changes, VoteNotWatcher
	}
	if cur, ok := n.votes[v.Watcher]; ok && cur.seq > v.Seq {
		e.drops[DropVoteStale]++
		return changes, VoteStale
	}
	if n.votes == nil {
		n.votes = map[string]vote{}
	}
	n.votes[v.Watcher] = vote{path: v.Path, seq: v.Seq, at: now}
	return append(changes, e.setPath(v.Node, e.pathOf(v.Node))...), VoteAccepted
}

// pathOf aggregates the votes on name from its current watchers: down when a
// majority of them say down; unhealthy when a majority say down or unhealthy
// (its kernel answers some, but none of that majority finds it delivering);
// up when any says up (a kernel that answers one watcher, with a healthy
// kube-proxy, delivers); unknown otherwise. Votes from nodes that are no
// longer its watchers (the ring changed) or that lapsed do not count.
func (e *Engine) pathOf(name string) Path {
	n := e.nodes[name]
	if n == nil || len(n.votes) == 0 {
		return PathUnknown
	}
	ws := e.Watchers(name, WatchersPerNode)
	down, unhealthy, up := 0, 0, 0
	for _, w := range ws {
		v, ok := n.votes[w]
		if !ok || e.now.Sub(v.at) >= voteTTL {
			continue
		}
		switch v.path {
		case PathDown:
			down++
		case PathUnhealthy:
			unhealthy++
		case PathUp:
			up++
		}
	}
	switch {
	case len(ws) > 0 && down > len(ws)/2:
		return PathDown
	case len(ws) > 0 && down+unhealthy > len(ws)/2:
		return PathUnhealthy
	case up > 0:
		return PathUp
	}
	return PathUnknown
}

// reaggregate recomputes every voted node's path (the ring changed, or votes
// lapsed) and applies what changed.
func (e *Engine) reaggregate() []Change {
	paths := map[string]Path{}
	for name, n := range e.nodes {
		for w, v := range n.votes {
			if e.now.Sub(v.at) >= voteTTL {
				delete(n.votes, w)
			}
		}
		if p := e.pathOf(name); p != n.path {
			paths[name] = p
		}
	}
	return e.setPaths(paths)
}

// Votes returns the votes a replica holds on node, by watcher (status).
func (e *Engine) Votes(node string) map[string]Path {
	n := e.nodes[node]
	if n == nil {
		return nil
	}
	out := make(map[string]Path, len(n.votes))
	for w, v := range n.votes {
		out[w] = v.path
	}
	return out
}

// Quorum reports whether this replica may make transitions other than
// learning: it sees a majority of the last known membership alive (members
// are the nodes seen as memberlist members, until Forget, the owners of
// active keys, and itself), or
// exactly half of it including the member whose name sorts first, so that of
// two equal halves exactly one acts. A node cut off from its peers therefore
// places, moves and expires nothing, and its epochs cannot win on heal.
//
// Two equal halves have one more way to act: when every absent member's data
// path is down by its watchers' majority. That is what lets the survivor of
// a two-node cluster take over when the other node dies (it is the other's
// only watcher, and distrusts itself while its own carrier is down); the
// price, documented in docs/architecture.md, is that a survivor whose uplink
// fails without losing carrier takes the other's IPs too, and they move to
// it once more on heal.
func (e *Engine) Quorum() bool {
	total, alive, firstAlive := e.members()
	if 2*alive > total {
		return true
	}
	if 2*alive < total {
		return false
	}
	return firstAlive || e.absentDown()
}

// absentDown reports whether every member that is not alive has its data
// path down.
func (e *Engine) absentDown() bool {
	for name, n := range e.nodes {
		if n.member && name != e.opts.Self && !n.alive() && n.path != PathDown {
			return false
		}
	}
	return true
}

// Members returns how many nodes the quorum counts and how many of them are
// alive (itself included).
func (e *Engine) Members() (total, alive int) {
	total, alive, _ = e.members()
	return total, alive
}

func (e *Engine) members() (total, alive int, firstAlive bool) {
	self := e.opts.Self
	total, alive = 1, 1 // itself, a member whether or not memberlist lists it
	first := self
	firstAlive = true
	for name, n := range e.nodes {
		// A node that owns an active key counts too, seen as a member or
		// not: it ran a speaker. A speaker that restarted cut off from
		// the others (its join failed, a key it cannot use) knows them
		// only from the claims it was seeded with, and must not be a
		// majority of one.
		if name == self || n.forgotten || !n.member && !n.expected && len(e.owned[name]) == 0 {
			continue
		}
		total++
		if n.alive() {
			alive++
		}
		if name < first {
			first, firstAlive = name, n.alive()
		}
	}
	return total, alive, firstAlive
}

// SetSpeakerNodes tells the replica which nodes run a speaker (the speaker
// Pods the API server lists, with itself): they count in the quorum's
// membership whether or not memberlist has shown them yet. A speaker that
// restarted cut off from its peers (its join failed, or it cannot read their
// traffic: a memberlist key they do not send with yet) knows from them how
// many peers it lacks, and is no majority of one.
func (e *Engine) SetSpeakerNodes(nodes []string) []Change {
	want := make(map[string]bool, len(nodes))
	for _, name := range nodes {
		want[name] = true
		if name == e.opts.Self {
			continue
		}
		n := e.node(name)
		if !n.expected {
			n.expected, n.forgotten = true, false
		}
	}
	for name, n := range e.nodes {
		if n.expected && !want[name] {
			n.expected = false
		}
	}
	return e.settle(nil)
}

// Forget removes node from the membership the quorum counts (its Node object
// was deleted: the cluster shrank). Its speaker, votes and keys are handled
// as for any gone node.
func (e *Engine) Forget(node string) []Change {
	n := e.nodes[node]
	if n == nil || n.forgotten {
		return nil
	}
	n.member, n.forgotten = false, true
	return e.actingChanged()
}

// SetTrusted says whether this speaker trusts its own view: false while its
// announcing link has no carrier, its sends fail, or it was just frozen or
// starved. An untrusted replica learns but decides nothing, like one without
// quorum.
func (e *Engine) SetTrusted(ok bool) []Change {
	if e.distrusted == !ok {
		return nil
	}
	e.distrusted = !ok
	if ok && e.synced && !e.mayWas {
		e.missedNews = true // it could not hear its peers
	}
	return e.actingChanged()
}

// relearnFor: a replica that regains the right to act because peers came
// back or its trust did (it may have missed their decisions meanwhile) waits
// this long before deciding, so that the push/pull their return or its
// carrier's triggers brings the claims it missed: a key created while it was
// cut off must not be placed by it a second time. Regaining it by evidence
// alone (absent members' data paths down, a Node deleted) needs no wait: no
// peer it could not hear decided anything.
const relearnFor = time.Second

// mayAct: synced, trusted and with quorum.
func (e *Engine) mayAct() bool { return e.synced && !e.distrusted && e.Quorum() }

// Acting reports whether this replica makes transitions now: synced, trusted
// and with quorum, for relearnFor already if it lacked one of them since it
// synced.
func (e *Engine) Acting() bool { return e.mayAct() && !e.now.Before(e.relearnUntil) }

// actingChanged re-decides every key when the replica may act again: the
// decisions it deferred meanwhile are due.
func (e *Engine) actingChanged() []Change {
	may := e.mayAct()
	if may && !e.mayWas && e.synced && e.missedNews {
		e.relearnUntil = e.now.Add(relearnFor)
	}
	if may {
		e.missedNews = false
	}
	e.mayWas = may
	acting := e.Acting()
	was := e.wasActing
	e.wasActing = acting
	if acting && !was {
		return e.decideAll()
	}
	return nil
}

// AllVotes returns every vote the replica holds that still counts somewhere
// (for push/pull), sorted by node then watcher: a replica that was cut off
// learns the evidence it missed with the claims.
func (e *Engine) AllVotes() []Vote {
	var out []Vote
	for name, n := range e.nodes {
		for w, v := range n.votes {
			if e.now.Sub(v.at) < voteTTL {
				out = append(out, Vote{Node: name, Watcher: w, Path: v.path, Seq: v.seq})
			}
		}
	}
	slices.SortFunc(out, func(a, b Vote) int {
		if a.Node != b.Node {
			return strings.Compare(a.Node, b.Node)
		}
		return strings.Compare(a.Watcher, b.Watcher)
	})
	return out
}

// VotesBy returns the votes watcher cast that this replica holds (a watcher
// re-sends its own from here).
func (e *Engine) VotesBy(watcher string) []Vote {
	var out []Vote
	for _, v := range e.AllVotes() {
		if v.Watcher == watcher {
			out = append(out, v)
		}
	}
	return out
}

// memberForget is how long a member must have been gone before a replica
// that acts stops counting it in the quorum: the cluster shrinks by the
// nodes that died for good (a cut-off replica, which does not act, forgets
// nobody). Node deletion forgets at once (Forget).
const memberForget = 10 * time.Minute

// forgetAndPrune drops from the membership the members gone for
// memberForget, and forgets the state of nodes that are neither members nor
// owners nor voted on, gone for inactiveTTL: peers cannot grow it.
func (e *Engine) forgetAndPrune() []Change {
	acting := e.Acting()
	forgot := false
	for name, n := range e.nodes {
		if n.alive() || name == e.opts.Self || n.goneSince.IsZero() {
			continue
		}
		gone := e.now.Sub(n.goneSince)
		if !n.forgotten && (n.member || len(e.owned[name]) > 0) && acting && gone >= memberForget {
			n.member, n.forgotten, forgot = false, true, true
		}
		if !n.member && !n.expected && gone >= inactiveTTL && len(e.owned[name]) == 0 && len(n.votes) == 0 {
			delete(e.nodes, name)
			delete(e.away, name)
			e.ringDirty = true
		}
	}
	if forgot {
		return e.actingChanged()
	}
	return nil
}
