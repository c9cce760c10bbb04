package ownership

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

var t0 = time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)

// cluster builds a synced engine for self with the given live nodes, every
// key eligible on every node.
func cluster(t testing.TB, self string, opts Options, nodes ...string) (*Engine, *NodeSet) {
	t.Helper()
	opts.Self = self
	e := New(opts)
	for _, n := range nodes {
		e.SetSpeaker(n, SpeakerAlive, t0)
	}
	e.SetSynced(t0)
	return e, NewInterner().Intern(nodes, nil)
}

func owner(t testing.TB, e *Engine, key string) string {
	t.Helper()
	o, _ := e.Owner(key)
	return o
}

func TestDecisions(t *testing.T) {
	nodes := []string{"a", "b", "c", "d"}
	hold := 30 * time.Second
	// The hash winner of "10.0.0.1" among nodes, and the next one.
	rank := func(key string, among []string) []string {
		r := slices.Clone(among)
		slices.SortFunc(r, func(x, y string) int {
			if HashLess(x, y, key) {
				return -1
			}
			return 1
		})
		return r
	}
	const key = "10.0.0.1"
	first := rank(key, nodes)[0]
	second := rank(key, nodes)[1]

	tests := []struct {
		name     string
		failback Failback
		hold     time.Duration
		// act runs the scenario on an engine where key is owned by first.
		act        func(e *Engine, all *NodeSet) []Change
		wantOwner  string
		wantReason Reason // of the last change, "" for none
	}{
		{
			name: "speaker gone within hold: kept",
			hold: hold,
			act: func(e *Engine, _ *NodeSet) []Change {
				return e.SetSpeaker(first, SpeakerGone, t0.Add(time.Second))
			},
			wantOwner: first,
		},
		{
			name: "speaker gone, data path answers: kept past many probes",
			hold: hold,
			act: func(e *Engine, _ *NodeSet) []Change {
				c := e.SetSpeaker(first, SpeakerGone, t0.Add(time.Second))
				c = append(c, votePath(e, first, PathUp)...)
				return append(c, e.Tick(t0.Add(29*time.Second))...)
			},
			wantOwner: first,
		},
		{
			name: "speaker gone, data path answers: kept past the hold (the deputy answers)",
			hold: hold,
			act: func(e *Engine, _ *NodeSet) []Change {
				c := e.SetSpeaker(first, SpeakerGone, t0.Add(time.Second))
				for now := t0; now.Before(t0.Add(5 * time.Minute)); now = now.Add(2 * time.Second) {
					c = append(c, e.Tick(now)...)
					c = append(c, votePath(e, first, PathUp)...) // the watchers re-send
				}
				return c
			},
			wantOwner: first,
		},
		{
			name: "hold expired with the data path not judged: moves to the hash winner of the rest",
			hold: hold,
			act: func(e *Engine, _ *NodeSet) []Change {
				c := e.SetSpeaker(first, SpeakerGone, t0.Add(time.Second))
				return append(c, e.Tick(t0.Add(31*time.Second))...)
			},
			wantOwner:  second,
			wantReason: ReasonHoldExpired,
		},
		{
			name: "data path answered, then no longer judged: the hold runs out",
			hold: hold,
			act: func(e *Engine, _ *NodeSet) []Change {
				c := e.SetSpeaker(first, SpeakerGone, t0.Add(time.Second))
				c = append(c, votePath(e, first, PathUp)...)
				c = append(c, e.Tick(t0.Add(time.Minute))...)
				c = append(c, votePath(e, first, PathUnknown)...)
				return append(c, e.Tick(t0.Add(time.Minute+time.Second))...)
			},
			wantOwner:  second,
			wantReason: ReasonHoldExpired,
		},
		{
			name: "no hold: speaker gone moves at once",
			act: func(e *Engine, _ *NodeSet) []Change {
				return e.SetSpeaker(first, SpeakerGone, t0.Add(time.Second))
			},
			wantOwner:  second,
			wantReason: ReasonHoldExpired,
		},
		{
			name: "suspect whose data path is down: moves before memberlist declares it dead",
			hold: hold,
			act: func(e *Engine, _ *NodeSet) []Change {
				c := e.SetSpeaker(first, SpeakerSuspect, t0)
				return append(c, votePath(e, first, PathDown)...)
			},
			wantOwner:  second,
			wantReason: ReasonOwnerDown,
		},
		{
			name: "node dead and back: no failback",
			hold: hold,
			act: func(e *Engine, _ *NodeSet) []Change {
				c := e.SetSpeaker(first, SpeakerGone, t0)
				c = append(c, votePath(e, first, PathDown)...)
				return append(c, e.SetSpeaker(first, SpeakerAlive, t0.Add(8*time.Second))...)
			},
			wantOwner:  second,
			wantReason: ReasonOwnerDown,
		},
		{
			name:     "node dead and back: failback immediate",
			failback: FailbackImmediate,
			hold:     hold,
			act: func(e *Engine, _ *NodeSet) []Change {
				c := e.SetSpeaker(first, SpeakerGone, t0)
				c = append(c, votePath(e, first, PathDown)...)
				return append(c, e.SetSpeaker(first, SpeakerAlive, t0.Add(8*time.Second))...)
			},
			wantOwner:  first,
			wantReason: ReasonFailback,
		},
		{
			name: "owner no longer eligible: moves; eligible again: stays",
			hold: hold,
			act: func(e *Engine, _ *NodeSet) []Change {
				in := NewInterner()
				c := e.SetKey(key, in.Intern(without(nodes, first), nil))
				return append(c, e.SetKey(key, in.Intern(nodes, nil))...)
			},
			wantOwner:  second,
			wantReason: ReasonOwnerIneligible,
		},
		{
			name: "path up verdict on a live owner changes nothing",
			hold: hold,
			act: func(e *Engine, _ *NodeSet) []Change {
				return votePath(e, first, PathUp)
			},
			wantOwner: first,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e, all := cluster(t, "a", Options{Failback: tc.failback, Hold: tc.hold}, nodes...)
			e.Merge([]Claim{{Key: key, Owner: first, Epoch: 3}})
			if c := e.SetKey(key, all); len(c) != 0 {
				t.Fatalf("setting up: unexpected changes %v", c)
			}
			changes := tc.act(e, all)
			if got := owner(t, e, key); got != tc.wantOwner {
				t.Errorf("owner = %s, want %s (changes %v)", got, tc.wantOwner, changes)
			}
			var last Reason
			if len(changes) > 0 {
				last = changes[len(changes)-1].Reason
			}
			if last != tc.wantReason {
				t.Errorf("last reason = %q, want %q (changes %v)", last, tc.wantReason, changes)
			}
			if c := e.decideAll(); len(c) != 0 {
				t.Errorf("a full recomputation changes %v", c)
			}
		})
	}
}

func without(s []string, drop ...string) []string {
	return slices.DeleteFunc(slices.Clone(s), func(x string) bool { return slices.Contains(drop, x) })
}

func TestNewKeysGoToTheLeastLoaded(t *testing.T) {
	e, all := cluster(t, "a", Options{Hold: time.Minute}, "a", "b", "c")
	for i := range 30 {
		e.SetKey(fmt.Sprintf("10.0.0.%d", i), all)
	}
	for _, n := range []string{"a", "b", "c"} {
		if l := e.Load(n); l != 10 {
			t.Errorf("load of %s = %d, want 10", n, l)
		}
	}
	// c dies: its keys spread over a and b by hash; c comes back and then
	// receives the new keys until it catches up.
	e.SetSpeaker("c", SpeakerGone, t0)
	votePath(e, "c", PathDown)
	if e.Load("c") != 0 || e.Load("a")+e.Load("b") != 30 {
		t.Fatalf("after c died: loads a=%d b=%d c=%d", e.Load("a"), e.Load("b"), e.Load("c"))
	}
	e.SetSpeaker("c", SpeakerAlive, t0.Add(time.Second))
	if e.Load("c") != 0 {
		t.Fatalf("c took %d keys back without failback", e.Load("c"))
	}
	spread := func() string {
		return fmt.Sprintf("a=%d b=%d c=%d", e.Load("a"), e.Load("b"), e.Load("c"))
	}
	t.Logf("after c died and returned: %s", spread())
	for i := 30; i < 40; i++ {
		key := fmt.Sprintf("10.0.0.%d", i)
		e.SetKey(key, all)
		if o := owner(t, e, key); o != "c" {
			t.Errorf("new key %s went to %s, want the least-loaded c", key, o)
		}
	}
	t.Logf("after 10 new keys: %s", spread())
}

func TestNoCandidatesThenPlaced(t *testing.T) {
	e, _ := cluster(t, "a", Options{Hold: time.Minute}, "a", "b")
	in := NewInterner()
	e.SetKey("k", in.Intern([]string{"c"}, nil))
	if o, _ := e.Owner("k"); o != "" {
		t.Fatalf("owner %q with no live eligible node", o)
	}
	if u := e.Unplaced(); !slices.Equal(u, []string{"k"}) {
		t.Fatalf("unplaced = %v", u)
	}
	changes := e.SetSpeaker("c", SpeakerAlive, t0)
	if len(changes) != 1 || changes[0].To != "c" || changes[0].Reason != ReasonPlaced {
		t.Fatalf("changes when c joined = %v", changes)
	}
}

func TestNoDecisionBeforeSynced(t *testing.T) {
	e := New(Options{Self: "a", Hold: time.Minute})
	e.SetSpeaker("a", SpeakerAlive, t0)
	all := NewInterner().Intern([]string{"a", "b"}, nil)
	if c := e.SetKey("k", all); c != nil {
		t.Fatalf("decided before synced: %v", c)
	}
	if o, _ := e.Owner("k"); o != "" {
		t.Fatalf("owner %q before synced", o)
	}
	// What peers tell us before we are synced is kept, and wins.
	e.Merge([]Claim{{Key: "k", Owner: "b", Epoch: 7}})
	e.SetSpeaker("b", SpeakerAlive, t0)
	if c := e.SetSynced(t0); len(c) != 0 {
		t.Fatalf("changes at sync: %v", c)
	}
	if o := owner(t, e, "k"); o != "b" {
		t.Fatalf("owner = %s, want the learned b", o)
	}
}

func TestDeputy(t *testing.T) {
	e, _ := cluster(t, "a", Options{Hold: time.Minute}, "a", "b", "c", "d")
	d := e.Deputy("b")
	if d == "" || d == "b" {
		t.Fatalf("deputy of b = %q", d)
	}
	e.SetSpeaker("b", SpeakerGone, t0)
	if got := e.Deputy("b"); got != d {
		t.Errorf("deputy of b changed from %s to %s when b left", d, got)
	}
	e.SetSpeaker(d, SpeakerGone, t0)
	if got := e.Deputy("b"); got == d || got == "b" || got == "" {
		t.Errorf("deputy of b is %q after the deputy %s left", got, d)
	}
}

func TestDeletedKeyKeepsOwnerForAWhile(t *testing.T) {
	e, all := cluster(t, "a", Options{Hold: time.Minute}, "a", "b", "c")
	e.SetKey("k", all)
	o := owner(t, e, "k")
	e.DeleteKey("k")
	if l := e.Load(o); l != 0 {
		t.Fatalf("load of %s = %d after delete", o, l)
	}
	// Make another node the least loaded: the re-created key still returns
	// to its previous owner.
	e.SetKey("other", all)
	e.SetKey("k", all)
	if got := owner(t, e, "k"); got != o {
		t.Errorf("re-created key went to %s, was %s", got, o)
	}
	e.DeleteKey("k")
	e.Tick(t0.Add(inactiveTTL))
	if _, ok := e.Claim("k"); ok {
		t.Errorf("claim of a key deleted %s ago is still kept", inactiveTTL)
	}
}

// TestPreferences: keys go to the nodes of the highest preference score that
// can take them (least-loaded, or hash winner, within that tier), fall back to
// lower scores, and stay where they are when a preferred node returns unless
// failback is immediate.
func TestPreferences(t *testing.T) {
	keys := []string{"10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5", "10.0.0.6"}
	for _, fb := range []Failback{FailbackNever, FailbackImmediate} {
		t.Run(string(fb), func(t *testing.T) {
			e, _ := cluster(t, "a", Options{Failback: fb, Hold: time.Minute}, "a", "b", "p1", "p2")
			pref := NewInterner().Intern([]string{"a", "b", "p1", "p2"}, map[string]int64{"p1": 100, "p2": 100, "b": 30})
			for _, k := range keys {
				e.SetKey(k, pref)
			}
			load := map[string]int{}
			for _, k := range keys {
				load[owner(t, e, k)]++
			}
			if fb == FailbackNever && (load["p1"] != 3 || load["p2"] != 3) {
				t.Fatalf("new keys spread %v, want 3 each on p1 and p2 (least-loaded within the top tier)", load)
			}
			if load["p1"]+load["p2"] != len(keys) {
				t.Fatalf("keys placed outside the top tier: %v", load)
			}

			// p1 fails: its keys go to p2, the other node of the top tier.
			for _, c := range votePath(e, "p1", PathDown) {
				if c.To != "p2" || c.Reason != ReasonOwnerDown {
					t.Errorf("p1 down: %+v, want p2 (ownerDataPathDown)", c)
				}
			}
			// p2 fails too: the next tier (b, score 30), not the hash order.
			for _, c := range votePath(e, "p2", PathDown) {
				if c.To != "b" {
					t.Errorf("p2 down: %+v, want b (next tier)", c)
				}
			}
			if got := e.Owned("b"); len(got) != len(keys) {
				t.Fatalf("b owns %v, want every key", got)
			}
			// p1 returns.
			changes := votePath(e, "p1", PathUp)
			if fb == FailbackNever {
				if len(changes) != 0 {
					t.Fatalf("a returning preferred node took keys without failback: %v", changes)
				}
				return
			}
			if len(changes) != len(keys) {
				t.Fatalf("failback=immediate: %v, want every key back on p1 (alone in the top tier)", changes)
			}
			for _, c := range changes {
				if c.To != "p1" || c.Reason != ReasonFailback {
					t.Errorf("failback: %+v", c)
				}
			}
		})
	}
}

// TestInternScores: sets differing only by scores are distinct; equal
// contents share one set, whatever the order and zero scores given.
func TestInternScores(t *testing.T) {
	in := NewInterner()
	plain := in.Intern([]string{"a", "b"}, nil)
	if in.Intern([]string{"b", "a"}, map[string]int64{"a": 0, "x": 5}) != plain {
		t.Error("zero scores and scores of absent nodes made a new set")
	}
	scored := in.Intern([]string{"a", "b"}, map[string]int64{"b": 7})
	if scored == plain || scored.Score("b") != 7 || scored.Score("a") != 0 || plain.Score("b") != 0 {
		t.Errorf("scored set: %p vs %p, scores %d %d", scored, plain, scored.Score("a"), scored.Score("b"))
	}
	if in.Intern([]string{"a", "b"}, map[string]int64{"b": 7}) != scored || in.Len() != 2 {
		t.Errorf("equal scored sets not shared: %d sets", in.Len())
	}
}

// TestIntersect: the nodes of both sets, each with the lower of its scores (0
// when one set gives none), the same whatever the order; a set with itself is
// itself.
func TestIntersect(t *testing.T) {
	in := NewInterner()
	a := in.Intern([]string{"a", "b", "c"}, map[string]int64{"a": 10, "b": 100, "c": 5})
	b := in.Intern([]string{"b", "c", "d"}, map[string]int64{"b": 40})
	ab, ba := in.Intersect(a, b), in.Intersect(b, a)
	if ab != ba {
		t.Fatalf("Intersect(a, b) %v and Intersect(b, a) %v differ", ab.Names(), ba.Names())
	}
	if !slices.Equal(ab.Names(), []string{"b", "c"}) || ab.Score("b") != 40 || ab.Score("c") != 0 {
		t.Errorf("a ∩ b: %v with scores b=%d c=%d, want [b c] with b=40 c=0", ab.Names(), ab.Score("b"), ab.Score("c"))
	}
	if in.Intersect(a, a) != a {
		t.Error("a set intersected with itself is a new set")
	}
	if in.Intersect(a, in.Intern(nil, nil)).Len() != 0 {
		t.Error("intersection with the empty set is not empty")
	}
}

// votePath casts p on node from every one of its watchers, as watchers that
// agree do, and returns the changes.
func votePath(e *Engine, node string, p Path) []Change {
	var out []Change
	for _, w := range e.Watchers(node, WatchersPerNode) {
		voteSeq++
		c, _ := e.Vote(Vote{Node: node, Watcher: w, Path: p, Seq: voteSeq}, e.now)
		out = append(out, c...)
	}
	return out
}

var voteSeq uint64

// TestRebalance: the keys a failure piled on one node go back to the others
// by its own planned moves, n at a time, until no node owns two more than
// another; never to a node of a lower preference score, never with
// FailbackImmediate, never from a replica that does not act.
func TestRebalance(t *testing.T) {
	keys := []string{"k1", "k2", "k3", "k4", "k5", "k6", "k7", "k8"}
	// a alone places every key; b, c, d join later and, without failback,
	// take none (with FailbackImmediate they take those they win).
	start := func(t *testing.T, opts Options, scores map[string]int64) *Engine {
		e, _ := cluster(t, "a", opts, "a")
		all := NewInterner().Intern([]string{"a", "b", "c", "d"}, scores)
		for _, k := range keys {
			e.SetKey(k, all)
		}
		for _, n := range []string{"b", "c", "d"} {
			e.SetSpeaker(n, SpeakerAlive, t0)
		}
		if got := len(e.Owned("a")); got != len(keys) && opts.Failback != FailbackImmediate {
			t.Fatalf("a owns %d keys before rebalancing, want %d", got, len(keys))
		}
		return e
	}
	loads := func(e *Engine) map[string]int {
		out := map[string]int{}
		for _, n := range []string{"a", "b", "c", "d"} {
			out[n] = len(e.Owned(n))
		}
		return out
	}

	e := start(t, Options{}, nil)
	if c := e.Rebalance(1, nil); len(c) != 1 || c[0].From != "a" || c[0].Reason != ReasonRebalance {
		t.Fatalf("Rebalance(1, nil) = %v, want one key moved off a", c)
	}
	for range 10 {
		e.Rebalance(1, nil)
	}
	if l := loads(e); l["a"] != 2 || l["b"] != 2 || l["c"] != 2 || l["d"] != 2 {
		t.Fatalf("loads after rebalancing %v, want 2 each", l)
	}
	if c := e.Rebalance(100, nil); len(c) != 0 {
		t.Fatalf("a balanced cluster rebalanced: %v", c)
	}

	if c := start(t, Options{Failback: FailbackImmediate}, nil).Rebalance(100, nil); len(c) != 0 {
		t.Fatalf("FailbackImmediate rebalanced: %v", c)
	}
	if c := start(t, Options{}, map[string]int64{"a": 10}).Rebalance(100, nil); len(c) != 0 {
		t.Fatalf("keys left a, the preferred node: %v", c)
	}
	e = start(t, Options{}, nil)
	kept := func(k string) bool { return k != "k5" }
	if c := e.Rebalance(100, kept); len(c) != 1 || c[0].Key != "k5" {
		t.Fatalf("Rebalance with every key but k5 kept = %v, want k5 alone moved", c)
	}
	e = start(t, Options{}, nil)
	e.SetTrusted(false)
	if c := e.Rebalance(100, nil); len(c) != 0 {
		t.Fatalf("a replica that does not act rebalanced: %v", c)
	}
}
