package ownership

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// world is a random cluster for the property tests.
type world struct {
	rng   *rand.Rand
	nodes []string
	keys  []string
	sets  []*NodeSet
}

func newWorld(seed uint64, nNodes, nKeys int) *world {
	w := &world{rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
	for i := range nNodes {
		w.nodes = append(w.nodes, fmt.Sprintf("node-%d", i))
	}
	for i := range nKeys {
		w.keys = append(w.keys, fmt.Sprintf("10.0.%d.%d", i/250, i%250))
	}
	in := NewInterner()
	w.sets = []*NodeSet{in.Intern(w.nodes, nil)} // most keys: every node
	for range 3 {
		var sub []string
		for _, n := range w.nodes {
			if w.rng.IntN(2) == 0 {
				sub = append(sub, n)
			}
		}
		w.sets = append(w.sets, in.Intern(sub, nil))
	}
	// Preferences: every node, or a subset, with a few score tiers (0, 1-100
	// and sums of two weights), as preferredNodeSelectors produce.
	for i := range 3 {
		scores := map[string]int64{}
		var sub []string
		for _, n := range w.nodes {
			if i == 0 || w.rng.IntN(3) > 0 {
				sub = append(sub, n)
			}
			scores[n] = []int64{0, 0, 30, 100, 130}[w.rng.IntN(5)]
		}
		w.sets = append(w.sets, in.Intern(sub, scores))
	}
	return w
}

func (w *world) set() *NodeSet {
	if w.rng.IntN(3) == 0 {
		return w.sets[w.rng.IntN(len(w.sets))]
	}
	return w.sets[0]
}

// event is one input applied to an engine.
type event struct {
	desc string
	// item is the key or node the event changes ("" for Tick): events on
	// distinct items commute.
	item  string
	apply func(e *Engine, now time.Time) []Change
}

func (w *world) event(now time.Time) event {
	node := w.nodes[w.rng.IntN(len(w.nodes))]
	key := w.keys[w.rng.IntN(len(w.keys))]
	switch w.rng.IntN(7) {
	case 0, 1:
		set := w.set()
		return event{fmt.Sprintf("SetKey(%s, %v %v)", key, set.Names(), set.scores), key, func(e *Engine, _ time.Time) []Change { return e.SetKey(key, set) }}
	case 2:
		return event{"DeleteKey(" + key + ")", key, func(e *Engine, _ time.Time) []Change { e.DeleteKey(key); return nil }}
	case 3:
		s := Speaker(w.rng.IntN(3))
		return event{fmt.Sprintf("SetSpeaker(%s, %s)", node, s), node, func(e *Engine, now time.Time) []Change { return e.SetSpeaker(node, s, now) }}
	case 4:
		p := Path(w.rng.IntN(3))
		return event{fmt.Sprintf("SetPath(%s, %s)", node, p), node, func(e *Engine, _ time.Time) []Change { return votePath(e, node, p) }}
	case 5:
		c := Claim{Key: key, Owner: node, Epoch: uint64(w.rng.IntN(6))}
		return event{fmt.Sprintf("Merge(%+v)", c), key, func(e *Engine, _ time.Time) []Change { return e.Merge([]Claim{c}) }}
	default:
		return event{"Tick", "", func(e *Engine, now time.Time) []Change { return e.Tick(now) }}
	}
}

// TestIncrementalEqualsFullRecompute: after every event, a full
// recomputation of every key changes nothing, i.e. the incremental paths
// found every key the event could affect.
func TestIncrementalEqualsFullRecompute(t *testing.T) {
	for _, fb := range []Failback{FailbackNever, FailbackImmediate} {
		for _, hold := range []time.Duration{0, 30 * time.Second} {
			for seed := range uint64(60) {
				w := newWorld(seed, 2+int(seed%9), 1+int(seed%40))
				e := New(Options{Self: w.nodes[0], Failback: fb, Hold: hold})
				now := t0
				var trail []string
				for i := range 400 {
					if i == 5 {
						e.SetSynced(now)
					}
					if w.rng.IntN(8) == 0 {
						now = now.Add(time.Duration(w.rng.IntN(40)) * time.Second)
					}
					ev := w.event(now)
					trail = append(trail, ev.desc)
					// Expire holds first, so that the event's own decisions
					// see the placeability checkTopTier checks them against.
					if e.Synced() {
						checkTopTier(t, e, e.Tick(now), trail)
					}
					changes := ev.apply(e, now)
					if !e.Synced() {
						continue
					}
					checkTopTier(t, e, changes, trail)
					if c := e.decideAll(); len(c) != 0 {
						t.Fatalf("failback=%s hold=%s seed=%d: after\n  %s\na full recomputation changes %v",
							fb, hold, seed, lastN(trail, 12), c)
					}
					checkValid(t, e)
				}
			}
		}
	}
}

func lastN(s []string, n int) string {
	if len(s) > n {
		s = s[len(s)-n:]
	}
	out := ""
	for _, x := range s {
		out += x + "\n  "
	}
	return out
}

// checkValid: every active key's owner is eligible and serving, or the key
// is unplaced because nobody can own it.
func checkValid(t *testing.T, e *Engine) {
	t.Helper()
	for k, elig := range e.keys {
		o, serving := e.Owner(k)
		if o != "" && elig.Has(o) && serving {
			continue
		}
		if !e.Acting() {
			continue // without quorum nothing is re-placed
		}
		hasCandidate := false
		e.candidates(elig, func(string) { hasCandidate = true })
		if hasCandidate {
			t.Fatalf("key %s: owner %q (serving %v, eligible %v) although %v has a placeable node", k, o, serving, elig.Has(o), elig.Names())
		}
	}
}

// checkTopTier: every key the rule placed went to a node of the highest
// preference score among those that could take it (learned claims are a
// peer's decision, checked on that peer).
func checkTopTier(t *testing.T, e *Engine, changes []Change, trail []string) {
	t.Helper()
	for _, c := range changes {
		if c.Reason == ReasonLearned {
			continue
		}
		elig := e.keys[c.Key]
		top := int64(-1)
		e.candidates(elig, func(n string) { top = max(top, elig.Score(n)) })
		if got := elig.Score(c.To); got != top {
			t.Fatalf("after\n  %s\n%+v gave the key to a node of score %d, but a placeable node scores %d (%v)",
				lastN(trail, 12), c, got, top, elig.scores)
		}
	}
}

// TestSpeakersAgree: speakers that receive the same inputs in different
// orders, then gossip their claims, end with identical replicas, whatever
// the order.
func TestSpeakersAgree(t *testing.T) {
	for _, fb := range []Failback{FailbackNever, FailbackImmediate} {
		for seed := range uint64(80) {
			w := newWorld(seed, 3+int(seed%6), 5+int(seed%30))
			engines := make([]*Engine, len(w.nodes))
			for i, n := range w.nodes {
				engines[i] = New(Options{Self: n, Failback: fb, Hold: 30 * time.Second})
			}
			// A common past: all members, every key placed, converged.
			base := []event{}
			for _, n := range w.nodes {
				base = append(base, event{"alive " + n, n, func(e *Engine, now time.Time) []Change { return e.SetSpeaker(n, SpeakerAlive, now) }})
			}
			base = append(base, event{"sync", "", func(e *Engine, now time.Time) []Change { return e.SetSynced(now) }})
			for _, k := range w.keys {
				set := w.set()
				base = append(base, event{"key " + k, k, func(e *Engine, _ time.Time) []Change { return e.SetKey(k, set) }})
			}
			for _, e := range engines {
				for _, ev := range base {
					ev.apply(e, t0)
				}
			}
			gossip(t, engines)
			// A batch of changes on distinct items, each delivered to each
			// speaker in its own order.
			var batch []event
			for range 1 + w.rng.IntN(8) {
				batch = append(batch, w.event(t0))
			}
			batch = distinctItems(batch)
			for _, e := range engines {
				order := w.rng.Perm(len(batch))
				for _, i := range order {
					batch[i].apply(e, t0)
				}
			}
			gossip(t, engines)
			want := engines[0].Claims()
			for i, e := range engines[1:] {
				if got := e.Claims(); !slices.Equal(got, want) {
					t.Fatalf("failback=%s seed=%d: %s and %s disagree after gossip\n%v\n%v", fb, seed, w.nodes[0], w.nodes[i+1], want, got)
				}
				checkValid(t, e)
			}
		}
	}
}

// distinctItems keeps one event per key or node, so the final inputs do not
// depend on the order of delivery.
func distinctItems(evs []event) []event {
	seen := map[string]bool{}
	var out []event
	for _, ev := range evs {
		if ev.item == "" || seen[ev.item] {
			continue
		}
		seen[ev.item] = true
		out = append(out, ev)
	}
	return out
}

// gossip exchanges full replicas between every pair until nothing changes
// (memberlist push/pull), failing if it does not settle.
func gossip(t *testing.T, engines []*Engine) {
	t.Helper()
	for round := 0; round < 20; round++ {
		changed := false
		for _, a := range engines {
			for _, b := range engines {
				if a == b {
					continue
				}
				before := a.Claims()
				a.Merge(b.Claims())
				if !slices.Equal(before, a.Claims()) {
					changed = true
				}
			}
		}
		if !changed {
			return
		}
	}
	for _, e := range engines {
		t.Logf("%s: %v", e.opts.Self, e.Claims())
	}
	t.Fatalf("gossip did not settle in 20 rounds")
}

// TestRestartWithStaleState: a restarted speaker seeded with stale claims
// (an old ServiceL2Status) learns the current ones from a peer before it
// decides anything, and then changes nothing.
func TestRestartWithStaleState(t *testing.T) {
	for seed := range uint64(40) {
		w := newWorld(seed, 4, 30)
		peer := New(Options{Self: w.nodes[0], Hold: time.Minute})
		for _, n := range w.nodes {
			peer.SetSpeaker(n, SpeakerAlive, t0)
		}
		peer.SetSynced(t0)
		for _, k := range w.keys {
			peer.SetKey(k, w.sets[0])
		}
		// Some history: a node died and came back, keys moved.
		peer.SetSpeaker(w.nodes[2], SpeakerGone, t0)
		votePath(peer, w.nodes[2], PathDown)
		peer.SetSpeaker(w.nodes[2], SpeakerAlive, t0)

		r := New(Options{Self: w.nodes[1], Hold: time.Minute})
		var stale []Claim
		for _, k := range w.keys {
			stale = append(stale, Claim{Key: k, Owner: w.nodes[w.rng.IntN(4)], Epoch: 0})
		}
		r.Merge(stale)
		for _, n := range w.nodes {
			r.SetSpeaker(n, SpeakerAlive, t0)
		}
		for _, k := range w.keys {
			if c := r.SetKey(k, w.sets[0]); c != nil {
				t.Fatalf("restarted speaker decided before sync: %v", c)
			}
		}
		r.Merge(peer.Claims())
		if c := r.SetSynced(t0); len(c) != 0 {
			t.Fatalf("seed %d: restarted speaker changed owners at sync: %v", seed, c)
		}
		if !slices.Equal(r.Claims(), peer.Claims()) {
			t.Fatalf("seed %d: restarted replica differs from its peer", seed)
		}
	}
}

// TestTwoClaimantsResolveToOne: two nodes claiming a key at the same epoch
// (placed concurrently from different views) end with one owner everywhere.
func TestTwoClaimantsResolveToOne(t *testing.T) {
	a, all := cluster(t, "a", Options{Hold: time.Minute}, "a", "b", "c")
	b, _ := cluster(t, "b", Options{Hold: time.Minute}, "a", "b", "c")
	a.SetKey("k", all)
	b.SetKey("k", all)
	a.Merge([]Claim{{Key: "k", Owner: "a", Epoch: 9}})
	b.Merge([]Claim{{Key: "k", Owner: "b", Epoch: 9}})
	gossip(t, []*Engine{a, b})
	oa, ob := owner(t, a, "k"), owner(t, b, "k")
	if oa != ob {
		t.Fatalf("a says %s, b says %s", oa, ob)
	}
	want := "a"
	if Newer(Claim{Key: "k", Owner: "b", Epoch: 9}, Claim{Key: "k", Owner: "a", Epoch: 9}) {
		want = "b"
	}
	if oa != want {
		t.Fatalf("owner %s, want %s by the hash order", oa, want)
	}
}
