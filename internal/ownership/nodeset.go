package ownership

import (
	"slices"
	"strconv"
	"strings"
	"sync"
)

// NodeSet is an immutable set of node names: the nodes eligible to own a key
// by the configuration (advertisements, node labels and conditions, local
// endpoints), before liveness, each with its preference score (the summed
// weights of the L2Advertisements' preferredNodeSelectors it matches; 0 for
// most). Most Services of a cluster share one set, so sets are interned
// (Intern) and compared by pointer: 10,000 keys over 1,000 nodes cost one
// set, not ten million entries.
type NodeSet struct {
	names  []string // sorted, unique
	index  map[string]struct{}
	scores map[string]int64 // non-zero scores only; nil when none
}

// Has reports whether node is in the set. A nil set is empty.
func (s *NodeSet) Has(node string) bool {
	if s == nil {
		return false
	}
	_, ok := s.index[node]
	return ok
}

// Len is the number of nodes.
func (s *NodeSet) Len() int {
	if s == nil {
		return 0
	}
	return len(s.names)
}

// Score is node's preference score: placement tries the nodes of the highest
// score first. 0 for a node without preference or not in the set.
func (s *NodeSet) Score(node string) int64 {
	if s == nil {
		return 0
	}
	return s.scores[node]
}

// Names returns the sorted names; the caller must not modify them.
func (s *NodeSet) Names() []string {
	if s == nil {
		return nil
	}
	return s.names
}

// Interner hands out one *NodeSet per distinct content. Sets no key uses any
// more are dropped by Sweep. Safe for concurrent use.
type Interner struct {
	mu   sync.Mutex
	sets map[string]*NodeSet
}

// NewInterner returns an empty Interner.
func NewInterner() *Interner { return &Interner{sets: map[string]*NodeSet{}} }

// Intern returns the shared set holding names (any order, duplicates
// allowed) with their scores (nil: all 0; scores of nodes not in names are
// ignored). Neither argument is retained.
func (in *Interner) Intern(names []string, scores map[string]int64) *NodeSet {
	sorted := slices.Clone(names)
	slices.Sort(sorted)
	sorted = slices.Compact(sorted)
	var id strings.Builder
	for _, n := range sorted {
		id.WriteString(n)
		if sc := scores[n]; sc != 0 {
			// "\x01" cannot occur in a node name, so the id stays unambiguous.
			id.WriteString("\x01" + strconv.FormatInt(sc, 10))
		}
		id.WriteByte(0)
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if s := in.sets[id.String()]; s != nil {
		return s
	}
	s := &NodeSet{names: sorted, index: make(map[string]struct{}, len(sorted))}
	for _, n := range sorted {
		s.index[n] = struct{}{}
		if sc := scores[n]; sc != 0 {
			if s.scores == nil {
				s.scores = map[string]int64{}
			}
			s.scores[n] = sc
		}
	}
	in.sets[id.String()] = s
	return s
}

// Intersect returns the shared set of the nodes in both a and b, each with
// the lower of its two scores (a node without a score in one of them scores
// 0), so the result does not depend on the order of the arguments. A set
// intersected with itself is itself.
func (in *Interner) Intersect(a, b *NodeSet) *NodeSet {
	if a == b {
		return a
	}
	var names []string
	var scores map[string]int64
	for _, n := range a.Names() {
		if !b.Has(n) {
			continue
		}
		names = append(names, n)
		if sa, sb := a.Score(n), b.Score(n); sa != 0 && sb != 0 {
			if scores == nil {
				scores = map[string]int64{}
			}
			scores[n] = min(sa, sb)
		}
	}
	return in.Intern(names, scores)
}

// Sweep drops the sets for which used returns false.
func (in *Interner) Sweep(used func(*NodeSet) bool) {
	in.mu.Lock()
	defer in.mu.Unlock()
	for id, s := range in.sets {
		if !used(s) {
			delete(in.sets, id)
		}
	}
}

// Len is the number of distinct sets held.
func (in *Interner) Len() int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return len(in.sets)
}
