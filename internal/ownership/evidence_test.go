package ownership

import (
	"slices"
	"testing"
	"time"
)

// TestVotesAreEvidence: a vote counts only from the node's watchers, the
// latest per watcher wins, a majority of watchers moves the node's keys,
// and what a replica refuses is counted.
func TestVotesAreEvidence(t *testing.T) {
	nodes := []string{"a", "b", "c", "d", "e"}
	e, all := cluster(t, "a", Options{Hold: 30 * time.Second}, nodes...)
	e.SetKey("k", all)
	first := owner(t, e, "k")
	ws := e.Watchers(first, WatchersPerNode)
	var outsider string
	for _, n := range nodes {
		if n != first && !slices.Contains(ws, n) {
			outsider = n
		}
	}
	vote := func(w string, p Path, seq uint64) VoteResult {
		_, res := e.Vote(Vote{Node: first, Watcher: w, Path: p, Seq: seq}, t0)
		return res
	}
	if res := vote(outsider, PathDown, 1); res != VoteNotWatcher {
		t.Fatalf("a vote from %s, not a watcher of %s (%v): %s", outsider, first, ws, res)
	}
	if res := vote(ws[0], PathDown, 5); res != VoteAccepted {
		t.Fatalf("a watcher's vote: %s", res)
	}
	if owner(t, e, "k") != first {
		t.Fatalf("one watcher of three moved the key")
	}
	if res := vote(ws[0], PathUp, 4); res != VoteStale {
		t.Fatalf("an older vote: %s", res)
	}
	if _, res := e.Vote(Vote{Node: "stranger", Watcher: ws[0], Path: PathDown, Seq: 9}, t0); res != VoteUnknownNode {
		t.Fatalf("a vote about an unknown node: %s", res)
	}
	vote(ws[1], PathDown, 6)
	if got := owner(t, e, "k"); got == first {
		t.Fatalf("two watchers of three vote down, the key stays on %s", got)
	}
	d := e.Drops()
	if d[DropVoteNotWatcher] != 1 || d[DropVoteStale] != 1 || d[DropVoteUnknownNode] != 1 {
		t.Fatalf("drops %v, want one of each vote kind", d)
	}
}

// TestQuorum: only a replica that sees a majority of the known membership
// acts; of equal halves, the one holding the first name; the membership
// shrinks by Forget and by members gone memberForget, as judged by a replica
// that acts; a replica that regains quorum relearns before it decides.
func TestQuorum(t *testing.T) {
	nodes := []string{"a", "b", "c", "d"}
	gone := func(e *Engine, now time.Time, ns ...string) {
		for _, n := range ns {
			e.SetSpeaker(n, SpeakerGone, now)
		}
	}
	a, _ := cluster(t, "a", Options{}, nodes...)
	gone(a, t0, "c", "d")
	if !a.Quorum() {
		t.Error("a with b, two of four including the first name: no quorum")
	}
	d, all := cluster(t, "d", Options{}, nodes...)
	gone(d, t0, "a", "b")
	if d.Quorum() {
		t.Error("d with c, two of four without the first name: quorum")
	}
	// A minority places nothing.
	if c := d.SetKey("k", all); len(c) != 0 || owner(t, d, "k") != "" {
		t.Fatalf("d without quorum placed a key: %v", c)
	}
	// a comes back: d may have missed what the others decided while it
	// could not hear them, so it relearns before deciding.
	if c := d.SetSpeaker("a", SpeakerAlive, t0); len(c) != 0 {
		t.Fatalf("decided at once on regaining quorum by a member's return, before relearning: %v", c)
	}
	if !d.Quorum() || d.Acting() {
		t.Fatalf("a back: quorum %v (want true), acting %v (want false while relearning)", d.Quorum(), d.Acting())
	}
	if c := d.Tick(t0.Add(relearnFor)); len(c) != 1 || c[0].Reason != ReasonPlaced {
		t.Fatalf("after relearning, the deferred placement: %v", c)
	}
	// The cluster shrank instead: a's Node was deleted, leaving c and d of
	// three. That is evidence, not a return: it acts at once.
	f, all2 := cluster(t, "d", Options{}, nodes...)
	gone(f, t0, "a", "b")
	f.SetKey("k", all2)
	if c := f.Forget("a"); !f.Acting() || len(c) != 1 {
		t.Fatalf("after Forget: acting %v, changes %v; want the placement at once", f.Acting(), c)
	}
	// Three of five alive: members gone for memberForget are forgotten by
	// a replica that acts, and it keeps acting when two more go.
	nodes = []string{"a", "b", "c", "d", "e"}
	e, _ := cluster(t, "e", Options{}, nodes...)
	gone(e, t0, "a", "b")
	e.Tick(t0.Add(memberForget))
	if total, alive := e.Members(); total != 3 || alive != 3 {
		t.Fatalf("after memberForget: %d members, %d alive; want 3 and 3", total, alive)
	}
	gone(e, t0.Add(memberForget), "c")
	if !e.Quorum() {
		t.Error("e with d, two of the three members left: no quorum")
	}
}

// TestRestartedAloneHasNoQuorum: a speaker that restarts and cannot reach
// its peers (a failed join, a memberlist key they cannot read yet) knows
// them only from the claims it was seeded with; they count, so it is no
// majority of one and moves nothing, whatever its hold says.
func TestRestartedAloneHasNoQuorum(t *testing.T) {
	nodes := []string{"a", "b", "c", "d"}
	all := NewInterner().Intern(nodes, nil)
	e := New(Options{Self: "c", Hold: 30 * time.Second})
	e.SetSpeaker("c", SpeakerAlive, t0)
	e.Merge([]Claim{{Key: "k1", Owner: "a"}, {Key: "k2", Owner: "b"}}) // the ServiceL2Status seeds
	e.SetKey("k1", all)
	e.SetKey("k2", all)
	if c := e.SetSynced(t0); len(c) != 0 {
		t.Fatalf("decided at sync: %v", c)
	}
	if e.Quorum() {
		t.Fatal("alone, with a and b known as owners: quorum")
	}
	if c := e.Tick(t0.Add(time.Minute)); len(c) != 0 || owner(t, e, "k1") != "a" || owner(t, e, "k2") != "b" {
		t.Fatalf("moved keys without quorum past the hold: %v", c)
	}
}

// TestSpeakerNodesCount: the nodes that run a speaker Pod count in the
// quorum even before memberlist shows them, so a speaker restarted cut off
// from its peers, with no claim naming them or only some (a tie-break it
// would win by name), acts on nothing.
func TestSpeakerNodesCount(t *testing.T) {
	nodes := []string{"a", "b", "c", "d"}
	all := NewInterner().Intern(nodes, nil)
	e := New(Options{Self: "a", Hold: 30 * time.Second})
	e.SetSpeaker("a", SpeakerAlive, t0)
	e.Merge([]Claim{{Key: "k1", Owner: "b"}}) // one seed: a alone would be half of {a, b}, first by name
	e.SetKey("k1", all)
	e.SetKey("k2", all)
	e.SetSpeakerNodes(nodes)
	if c := e.SetSynced(t0); len(c) != 0 {
		t.Fatalf("decided at sync: %v", c)
	}
	if total, alive := e.Members(); e.Quorum() || total != 4 || alive != 1 {
		t.Fatalf("quorum %v with %d of %d members alive, want none with 1 of 4", e.Quorum(), alive, total)
	}
	if c := e.Tick(t0.Add(time.Minute)); len(c) != 0 || owner(t, e, "k2") != "" {
		t.Fatalf("placed or moved keys without quorum: %v", c)
	}
	// c's and d's speaker Pods removed for good: a is half of {a, b} and
	// holds the first name.
	e.SetSpeakerNodes([]string{"a", "b"})
	if total, _ := e.Members(); !e.Quorum() || total != 2 {
		t.Errorf("speakers only on a and b: quorum %v with %d members, want quorum with 2", e.Quorum(), total)
	}
}

// TestUnhealthyOwner: a majority of watchers finding the owner's kernel
// answering but its delivery failing moves its keys (ownerUnhealthy) and
// keeps new ones off it; it still watches others, so the ring does not
// change; a minority moves nothing, and once found up again it takes keys.
func TestUnhealthyOwner(t *testing.T) {
	nodes := []string{"a", "b", "c", "d", "e"}
	e, all := cluster(t, "a", Options{}, nodes...)
	e.SetKey("k", all)
	first := owner(t, e, "k")
	ws := e.Watchers(first, WatchersPerNode)
	ring := slices.Clone(e.ring())
	seq := uint64(1)
	vote := func(w string, p Path) []Change {
		seq++
		c, res := e.Vote(Vote{Node: first, Watcher: w, Path: p, Seq: seq}, t0)
		if res != VoteAccepted {
			t.Fatalf("vote of %s on %s: %s", w, first, res)
		}
		return c
	}
	vote(ws[0], PathUnhealthy)
	vote(ws[1], PathUp)
	if owner(t, e, "k") != first {
		t.Fatal("one unhealthy vote of three, one up: the key moved")
	}
	c := vote(ws[1], PathDown) // down and unhealthy: a majority that cannot reach delivery
	if len(c) != 1 || c[0].Reason != ReasonOwnerUnhealthy || c[0].To == first {
		t.Fatalf("two of three watchers find %s unable to deliver: changes %v, want one ownerUnhealthy move", first, c)
	}
	if _, p := e.Speaker(first); p != PathUnhealthy {
		t.Fatalf("aggregate verdict %s, want unhealthy", p)
	}
	if !slices.Equal(e.ring(), ring) {
		t.Fatalf("an unhealthy node left the ring of watchers: %v, was %v", e.ring(), ring)
	}
	e.SetKey("k2", all)
	if owner(t, e, "k2") == first {
		t.Fatal("a new key was placed on an unhealthy node")
	}
	if watcher := slices.Contains(ws, "a"); e.Interested(first) != watcher {
		t.Fatalf("a, a watcher of %s: %v, probes it while unhealthy: %v", first, watcher, e.Interested(first))
	}
	vote(ws[0], PathUp)
	vote(ws[1], PathUp)
	if !e.placeable(first) {
		t.Fatalf("%s found up again is not placeable", first)
	}
	if owner(t, e, "k") == first {
		t.Fatal("a key went back to a recovered node without failback")
	}
}

// TestRequireUp: with RequireUp a node takes keys only once a watcher found
// it up, so a returning node whose kube-proxy has not proven healthy gets
// nothing; a key with no such node waits unplaced and is placed the moment
// one is found up; a lone node (no watchers) is not held back.
func TestRequireUp(t *testing.T) {
	e, all := cluster(t, "a", Options{RequireUp: true}, "a", "b", "c", "d")
	if c := e.SetKey("k", all); len(c) != 0 {
		t.Fatalf("a key placed on nodes nobody found up: %v", c)
	}
	for _, n := range all.Names() {
		if !e.Interested(n) && slices.Contains(e.Watchers(n, WatchersPerNode), "a") {
			t.Fatalf("a is a watcher of %s but does not probe it before it owns anything", n)
		}
	}
	w := e.Watchers("c", WatchersPerNode)[0]
	c, _ := e.Vote(Vote{Node: "c", Watcher: w, Path: PathUp, Seq: 1}, t0)
	if len(c) != 1 || c[0].To != "c" || c[0].Reason != ReasonPlaced {
		t.Fatalf("c found up: changes %v, want k placed on c", c)
	}
	// c's speaker restarts: it is judged again before it takes more.
	e.SetSpeaker("c", SpeakerGone, t0)
	e.SetSpeaker("c", SpeakerAlive, t0)
	e.SetKey("k2", all)
	if got := owner(t, e, "k2"); got != "" {
		t.Fatalf("k2 placed on %s, found up by nobody since it returned", got)
	}
	lone, one := cluster(t, "solo", Options{RequireUp: true}, "solo")
	lone.SetKey("k", one)
	if owner(t, lone, "k") != "solo" {
		t.Fatal("a single node, which nobody can watch, was held back")
	}
}

// TestAwaitJudgement: keys present when a cluster starts spread over its
// nodes instead of going to the first node found up, a node nobody judges is
// waited for only AwaitJudgement, and keys that have an owner never wait.
func TestAwaitJudgement(t *testing.T) {
	const wait = 10 * time.Second
	vote := func(e *Engine, n string, p Path, at time.Time) []Change {
		var out []Change
		for i, w := range e.Watchers(n, WatchersPerNode) {
			c, _ := e.Vote(Vote{Node: n, Watcher: w, Path: p, Seq: uint64(at.Sub(t0)/time.Millisecond) + uint64(i) + 1}, at)
			out = append(out, c...)
		}
		return out
	}
	keys := []string{"k1", "k2", "k3", "k4", "k5", "k6", "k7", "k8"}
	start := func(t *testing.T) (*Engine, *NodeSet) {
		e, all := cluster(t, "a", Options{RequireUp: true, AwaitJudgement: wait}, "a", "b", "c", "d")
		for _, k := range keys {
			e.SetKey(k, all)
		}
		return e, all
	}
	owners := func(e *Engine) map[string]int {
		out := map[string]int{}
		for _, k := range keys {
			if o, _ := e.Owner(k); o != "" {
				out[o]++
			}
		}
		return out
	}

	t.Run("spread at start", func(t *testing.T) {
		e, all := start(t)
		if c := vote(e, "c", PathUp, t0.Add(time.Second)); len(c) != 0 {
			t.Fatalf("the first node found up took keys while the others were being judged: %v", c)
		}
		for _, n := range []string{"a", "b", "d"} {
			vote(e, n, PathUp, t0.Add(2*time.Second))
		}
		if got := owners(e); len(got) != 4 || got["a"] != 2 || got["b"] != 2 || got["c"] != 2 || got["d"] != 2 {
			t.Fatalf("owners %v, want 2 keys on each of a, b, c, d", got)
		}
		if c := e.SetKey("k9", all); len(c) != 1 || c[0].Reason != ReasonPlaced {
			t.Fatalf("a new key with every node judged: %v, want it placed at once", c)
		}
	})

	t.Run("a node nobody judges is waited for AwaitJudgement", func(t *testing.T) {
		e, _ := start(t)
		for _, n := range []string{"a", "b", "c"} {
			vote(e, n, PathUp, t0.Add(time.Second))
		}
		if c := vote(e, "a", PathUp, t0.Add(wait-time.Second)); len(c) != 0 || len(e.Unplaced()) != len(keys) {
			t.Fatalf("before the wait ran out: changes %v, unplaced %v", c, e.Unplaced())
		}
		// The watchers vote again (votes lapse); d's wait has run out.
		for _, n := range []string{"a", "b", "c"} {
			vote(e, n, PathUp, t0.Add(wait+time.Second))
		}
		if got := owners(e); got["d"] != 0 || got["a"]+got["b"]+got["c"] != len(keys) {
			t.Fatalf("after the wait: owners %v, want every key on a, b, c", got)
		}
	})

	t.Run("a node judged unhealthy ends the wait", func(t *testing.T) {
		e, _ := start(t)
		for _, n := range []string{"a", "b", "c"} {
			vote(e, n, PathUp, t0.Add(time.Second))
		}
		vote(e, "d", PathUnhealthy, t0.Add(2*time.Second))
		if got := owners(e); got["d"] != 0 || got["a"]+got["b"]+got["c"] != len(keys) {
			t.Fatalf("owners %v, want every key on a, b, c as soon as d was judged", got)
		}
	})

	t.Run("an owned key does not wait", func(t *testing.T) {
		e, _ := start(t)
		for _, n := range []string{"a", "b", "c", "d"} {
			vote(e, n, PathUp, t0.Add(time.Second))
		}
		// b's speaker restarts (unjudged again), then c's data path fails:
		// c's keys move at once, to a or d.
		at := t0.Add(2 * time.Second)
		e.SetSpeaker("b", SpeakerGone, at)
		e.SetSpeaker("b", SpeakerAlive, at)
		moved := vote(e, "c", PathDown, at)
		if got := owners(e); len(moved) != 2 || got["c"] != 0 || got["a"]+got["d"] != 6 || got["b"] != 2 {
			t.Fatalf("c down: changes %v, owners %v; want c's 2 keys on a or d at once, b's kept", moved, got)
		}
	})
}
