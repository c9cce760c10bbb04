package ownership

import (
	"slices"
	"testing"
)

// TestGroups: the keys of one group (a Service's address slots) go to
// distinct nodes when placed and when they fail over, share a node only
// when fewer nodes can take them, and Spread undoes that once enough nodes
// are back, by planned moves; Rebalance never puts two of them together.
func TestGroups(t *testing.T) {
	slots := []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"}
	owners := func(e *Engine) []string {
		var out []string
		for _, k := range slots {
			out = append(out, owner(t, e, k))
		}
		return out
	}
	distinct := func(t *testing.T, os []string) {
		t.Helper()
		c := slices.Clone(os)
		slices.Sort(c)
		if len(slices.Compact(c)) != len(os) {
			t.Fatalf("owners %v: two keys of the group share a node", os)
		}
	}
	place := func(e *Engine, all *NodeSet) {
		for _, k := range slots {
			e.SetGroup(k, "default/web")
			e.SetKey(k, all)
		}
	}

	t.Run("placed on distinct nodes", func(t *testing.T) {
		for _, failback := range []Failback{FailbackNever, FailbackImmediate} {
			e, all := cluster(t, "a", Options{Failback: failback}, "a", "b", "c", "d")
			place(e, all)
			distinct(t, owners(e))
		}
	})

	t.Run("a failover avoids the nodes holding the others", func(t *testing.T) {
		e, all := cluster(t, "a", Options{}, "a", "b", "c", "d")
		place(e, all)
		before := owners(e)
		var free string
		for _, n := range []string{"a", "b", "c", "d"} {
			if !slices.Contains(before, n) {
				free = n
			}
		}
		victim := before[1]
		if victim == "a" { // keep self alive: it decides
			victim = before[2]
		}
		votePath(e, victim, PathDown)
		after := owners(e)
		for i, k := range slots {
			switch {
			case before[i] == victim && after[i] != free:
				t.Fatalf("%s moved from %s to %s, want %s (the node holding none of its group)", k, victim, after[i], free)
			case before[i] != victim && after[i] != before[i]:
				t.Fatalf("%s moved from %s to %s although its owner is up", k, before[i], after[i])
			}
		}
	})

	t.Run("fewer nodes than keys: shared, then spread back", func(t *testing.T) {
		e, _ := cluster(t, "a", Options{}, "a", "b", "c")
		place(e, NewInterner().Intern([]string{"a"}, nil))
		if os := owners(e); !slices.Equal(os, []string{"a", "a", "a"}) {
			t.Fatalf("owners %v, want all on a, the only eligible node", os)
		}
		if c := e.Spread(10, nil); len(c) != 0 {
			t.Fatalf("spread with no other eligible node: %v", c)
		}
		all := NewInterner().Intern([]string{"a", "b", "c"}, nil)
		for _, k := range slots {
			e.SetKey(k, all) // sticky: nothing moves by itself
		}
		if os := owners(e); !slices.Equal(os, []string{"a", "a", "a"}) {
			t.Fatalf("owners %v after b and c became eligible, want them kept until Spread", os)
		}
		c := e.Spread(1, nil)
		if len(c) != 1 || c[0].From != "a" || c[0].Reason != ReasonSpread {
			t.Fatalf("Spread(1) = %v, want one key given away by a", c)
		}
		e.Spread(10, nil)
		distinct(t, owners(e))
		if c := e.Spread(10, nil); len(c) != 0 {
			t.Fatalf("spread again: %v", c)
		}
		kept := func(string) bool { return true }
		e2, _ := cluster(t, "a", Options{}, "a", "b", "c")
		place(e2, NewInterner().Intern([]string{"a"}, nil))
		for _, k := range slots {
			e2.SetKey(k, all)
		}
		if c := e2.Spread(10, kept); len(c) != 0 {
			t.Fatalf("spread of kept keys: %v", c)
		}
	})

	t.Run("Rebalance never puts two together", func(t *testing.T) {
		e, _ := cluster(t, "a", Options{}, "a")
		all := NewInterner().Intern([]string{"a", "b"}, nil)
		// a owns the group's first key and many others; b owns the second.
		e.SetGroup("g1", "svc")
		e.SetGroup("g2", "svc")
		e.Merge([]Claim{{Key: "g2", Owner: "b", Epoch: 1}})
		e.SetSpeaker("b", SpeakerAlive, t0)
		e.SetKey("g1", all)
		e.SetKey("g2", all)
		for _, k := range []string{"x1", "x2", "x3", "x4"} {
			e.SetKey(k, NewInterner().Intern([]string{"a"}, nil))
		}
		for _, c := range e.Rebalance(10, nil) {
			if c.Key == "g1" {
				t.Fatalf("Rebalance put g1 on %s beside g2: %v", c.To, c)
			}
		}
	})
}
