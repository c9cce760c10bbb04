package ownership

import (
	"slices"
	"strings"
	"sync"
)

// NodeSet is an immutable set of node names: the nodes eligible to own a key
// by the configuration (advertisements, node labels and conditions, local
// endpoints), before liveness. Most Services of a cluster share one set, so
// sets are interned (Intern) and compared by pointer: 10,000 keys over 1,000
// nodes cost one set, not ten million entries.
type NodeSet struct {
	names []string // sorted, unique
	index map[string]struct{}
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
// allowed). names is not retained.
func (in *Interner) Intern(names []string) *NodeSet {
	sorted := slices.Clone(names)
	slices.Sort(sorted)
	sorted = slices.Compact(sorted)
	id := strings.Join(sorted, "\x00")
	in.mu.Lock()
	defer in.mu.Unlock()
	if s := in.sets[id]; s != nil {
		return s
	}
	s := &NodeSet{names: sorted, index: make(map[string]struct{}, len(sorted))}
	for _, n := range sorted {
		s.index[n] = struct{}{}
	}
	in.sets[id] = s
	return s
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
