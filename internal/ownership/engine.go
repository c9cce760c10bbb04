package ownership

import (
	"bytes"
	"fmt"
	"slices"
	"time"
)

// Failback says what happens when a node that lost keys can own them again.
type Failback string

const (
	// FailbackNever leaves keys where they are (the default): a returning
	// node only receives new keys.
	FailbackNever Failback = "never"
	// FailbackImmediate keeps MetalLB's rule: the hash winner among the
	// eligible live nodes always owns the key, so keys go back at once.
	FailbackImmediate Failback = "immediate"
)

// ParseFailback parses a --failback value.
func ParseFailback(s string) (Failback, error) {
	switch Failback(s) {
	case FailbackNever, FailbackImmediate:
		return Failback(s), nil
	}
	return "", fmt.Errorf("failback %q: want %q or %q", s, FailbackNever, FailbackImmediate)
}

// Reason says why a key changed owner; it is logged and counted.
type Reason string

const (
	// ReasonPlaced: a key without an owner got one (a new Service, or a key
	// nobody could own before).
	ReasonPlaced Reason = "placed"
	// ReasonOwnerDown: the owner's data path is down (its kernel no longer
	// answers on the segment, or it reported losing carrier).
	ReasonOwnerDown Reason = "ownerDataPathDown"
	// ReasonOwnerIneligible: the configuration no longer allows the owner
	// (advertisement, node labels or conditions, local endpoints).
	ReasonOwnerIneligible Reason = "ownerIneligible"
	// ReasonHoldExpired: the owner's speaker has been away longer than the
	// hold time.
	ReasonHoldExpired Reason = "holdExpired"
	// ReasonFailback: FailbackImmediate gave the key to the hash winner.
	ReasonFailback Reason = "failback"
	// ReasonLearned: a newer claim arrived from a peer.
	ReasonLearned Reason = "learned"
)

// Change is one key changing owner.
type Change struct {
	Key      string
	From, To string // From is "" for a key that had no owner
	Epoch    uint64
	Reason   Reason
}

// Speaker is a node's speaker liveness as memberlist sees it.
type Speaker int

const (
	// SpeakerGone: not a member (dead, left, or never seen).
	SpeakerGone Speaker = iota
	// SpeakerSuspect: a member that missed probes; usually refutes.
	SpeakerSuspect
	// SpeakerAlive: a healthy member.
	SpeakerAlive
)

func (s Speaker) String() string {
	return [...]string{"gone", "suspect", "alive"}[s]
}

// Path is the verdict on a node's data path.
type Path int

const (
	// PathUnknown: not probed, or probing.
	PathUnknown Path = iota
	// PathUp: its kernel answered for its own address.
	PathUp
	// PathDown: it stopped answering (or reported losing carrier).
	PathDown
)

func (p Path) String() string {
	return [...]string{"unknown", "up", "down"}[p]
}

// Options configure an Engine.
type Options struct {
	// Self is this node's name.
	Self string
	// Failback: FailbackNever (default) or FailbackImmediate.
	Failback Failback
	// Hold is how long a node keeps its keys after its speaker went away
	// while its data path is not known to be down. Zero: keys move as soon
	// as the speaker is gone (MetalLB's behaviour).
	Hold time.Duration
}

// inactiveTTL is how long a claim for a key no Service uses is kept: long
// enough that a key deleted and re-created keeps its owner and that peers
// still gossiping it do not resurrect it at once, short enough to bound the
// garbage.
const inactiveTTL = 10 * time.Minute

type nodeState struct {
	speaker   Speaker
	goneSince time.Time
	expired   bool // the hold ran out (processed once)
	path      Path
}

func (n *nodeState) alive() bool { return n.speaker != SpeakerGone }

// Engine holds the claims replica and decides ownership. It is not safe for
// concurrent use: one goroutine owns it (see package speaker).
type Engine struct {
	opts     Options
	now      time.Time
	synced   bool
	syncedAt time.Time

	keys     map[string]*NodeSet            // active keys -> eligible nodes
	claims   map[string]Claim               // replica, active and inactive keys
	inactive map[string]time.Time           // claims of inactive keys -> since
	nodes    map[string]*nodeState          // every node ever referenced
	owned    map[string]map[string]struct{} // owner -> active keys it claims
	unplaced map[string]struct{}            // active keys nobody serves or can serve
	away     map[string]struct{}            // nodes whose speaker is gone and hold is running

	ringCache []string // placeable nodes by name (Watchers)
	ringDirty bool
}

// New returns an Engine that makes no decision until SetSynced.
func New(opts Options) *Engine {
	if opts.Failback == "" {
		opts.Failback = FailbackNever
	}
	return &Engine{
		opts:     opts,
		keys:     map[string]*NodeSet{},
		claims:   map[string]Claim{},
		inactive: map[string]time.Time{},
		nodes:    map[string]*nodeState{},
		owned:    map[string]map[string]struct{}{},
		unplaced: map[string]struct{}{},
		away:     map[string]struct{}{},
	}
}

// Synced reports whether the engine decides (SetSynced was called).
func (e *Engine) Synced() bool { return e.synced }

// SetSynced starts deciding: the speaker has learned the current claims from
// its peers (or found it has none) and its caches are synced. Before it, a
// restarted speaker would place keys it has not heard of yet and move them.
// Returns the changes of the first full decision.
func (e *Engine) SetSynced(now time.Time) []Change {
	if now.After(e.now) {
		e.now = now
	}
	if e.synced {
		return nil
	}
	e.synced, e.syncedAt = true, now
	for name, n := range e.nodes {
		if !n.alive() && n.goneSince.IsZero() {
			n.goneSince = now
			e.away[name] = struct{}{}
		}
	}
	return e.decideAll()
}

// node returns the state of name, creating it as gone since now (a node
// known only from a claim: its speaker has not been seen).
func (e *Engine) node(name string) *nodeState {
	n := e.nodes[name]
	if n == nil {
		n = &nodeState{}
		if e.synced {
			n.goneSince = e.now
			e.away[name] = struct{}{}
		}
		e.nodes[name] = n
	}
	return n
}

// serving reports whether name may keep the keys it owns.
func (e *Engine) serving(name string) bool {
	n := e.node(name)
	if n.path == PathDown {
		return false
	}
	if n.alive() {
		return true
	}
	return e.opts.Hold > 0 && !n.expired && e.now.Sub(n.goneSince) < e.opts.Hold
}

// placeable reports whether name can take a key now: its speaker is a member
// and its data path is not down.
func (e *Engine) placeable(name string) bool {
	n := e.nodes[name]
	return n != nil && n.alive() && n.path != PathDown
}

// SetKey makes key active with its eligible nodes (or updates them) and
// decides it.
func (e *Engine) SetKey(key string, eligible *NodeSet) []Change {
	prev, had := e.keys[key]
	e.keys[key] = eligible
	if !had {
		delete(e.inactive, key)
		if c, ok := e.claims[key]; ok {
			e.index(key, "", c.Owner)
		}
	} else if prev == eligible {
		return nil
	}
	return e.decideKeys([]string{key})
}

// DeleteKey makes key inactive: no Service uses it any more. Its claim is
// kept for a while (inactiveTTL) so a re-created Service keeps its owner.
func (e *Engine) DeleteKey(key string) {
	if _, ok := e.keys[key]; !ok {
		return
	}
	delete(e.keys, key)
	delete(e.unplaced, key)
	if c, ok := e.claims[key]; ok {
		e.index(key, c.Owner, "")
		e.inactive[key] = e.now
	}
}

// SetSpeaker records a node's speaker liveness at time now.
func (e *Engine) SetSpeaker(name string, s Speaker, now time.Time) []Change {
	changes := e.Tick(now)
	n := e.node(name)
	wasAlive := n.alive()
	n.speaker = s
	e.ringDirty = true
	switch {
	case wasAlive && s == SpeakerGone:
		n.goneSince, n.expired = now, false
		e.away[name] = struct{}{}
		return append(changes, e.decideKeys(e.ownedKeys(name))...)
	case !wasAlive && s != SpeakerGone:
		// It is back: whatever was said about its data path is stale.
		n.path, n.expired = PathUnknown, false
		delete(e.away, name)
		return append(changes, e.nodeBecamePlaceable(name)...)
	}
	return changes
}

// SetPath records the verdict on a node's data path.
func (e *Engine) SetPath(name string, p Path) []Change {
	n := e.node(name)
	prev := n.path
	n.path = p
	e.ringDirty = true
	switch {
	case p == PathDown && prev != PathDown:
		return e.decideKeys(e.ownedKeys(name))
	case p != PathDown && prev == PathDown && n.alive():
		return e.nodeBecamePlaceable(name)
	}
	return nil
}

// nodeBecamePlaceable re-decides the keys a node that became placeable can
// change: those nobody could own, and with FailbackImmediate those it wins.
func (e *Engine) nodeBecamePlaceable(name string) []Change {
	keys := make([]string, 0, len(e.unplaced))
	for k := range e.unplaced {
		keys = append(keys, k)
	}
	changes := e.decideKeys(keys)
	if e.opts.Failback != FailbackImmediate || !e.synced {
		return changes
	}
	// The winner (highest score, then hash) owns every key in this mode, so
	// the newcomer changes a key only if it beats the current owner: one
	// comparison per key, not a full election.
	var win []string
	for k, elig := range e.keys {
		c, ok := e.claims[k]
		if !ok || !elig.Has(name) || c.Owner == name {
			continue
		}
		if better(elig, name, c.Owner, k) {
			win = append(win, k)
		}
	}
	return append(changes, e.decideKeys(win)...)
}

// Tick advances the clock: owners whose hold ran out lose their keys, and
// old claims of deleted keys are forgotten. Every method that takes the time
// ticks first, so no decision is made with an expired hold.
func (e *Engine) Tick(now time.Time) []Change {
	if now.After(e.now) {
		e.now = now
	}
	var keys []string
	for name := range e.away {
		n := e.nodes[name]
		if n.alive() || n.expired {
			delete(e.away, name)
			continue
		}
		if e.opts.Hold > 0 && now.Sub(n.goneSince) >= e.opts.Hold {
			n.expired = true
			delete(e.away, name)
			keys = append(keys, e.ownedKeys(name)...)
		}
	}
	for k, since := range e.inactive {
		if now.Sub(since) >= inactiveTTL {
			delete(e.inactive, k)
			delete(e.claims, k)
		}
	}
	return e.decideKeys(keys)
}

// Merge folds claims received from a peer into the replica and re-decides
// the keys they changed.
func (e *Engine) Merge(claims []Claim) []Change {
	var changes []Change
	var keys []string
	for _, c := range claims {
		cur, had := e.claims[c.Key]
		if had && !Newer(c, cur) {
			continue
		}
		e.claims[c.Key] = c
		if _, active := e.keys[c.Key]; !active {
			if _, known := e.inactive[c.Key]; !known {
				e.inactive[c.Key] = e.now
			}
			continue
		}
		e.index(c.Key, cur.Owner, c.Owner)
		e.node(c.Owner)
		if cur.Owner != c.Owner {
			changes = append(changes, Change{Key: c.Key, From: cur.Owner, To: c.Owner, Epoch: c.Epoch, Reason: ReasonLearned})
		}
		keys = append(keys, c.Key)
	}
	return append(changes, e.decideKeys(keys)...)
}

// decideAll decides every active key (start-up, and the reference for the
// incremental paths in tests).
func (e *Engine) decideAll() []Change {
	keys := make([]string, 0, len(e.keys))
	for k := range e.keys {
		keys = append(keys, k)
	}
	return e.decideKeys(keys)
}

// decideKeys decides keys in sorted order, so that the loads seen by
// least-loaded placement evolve the same way on every speaker.
func (e *Engine) decideKeys(keys []string) []Change {
	if !e.synced || len(keys) == 0 {
		return nil
	}
	slices.Sort(keys)
	keys = slices.Compact(keys)
	var out []Change
	for _, k := range keys {
		if c, ok := e.decide(k); ok {
			out = append(out, c)
		}
	}
	return out
}

// decide applies the ownership rule to one active key and records the
// transition it makes, if any.
func (e *Engine) decide(key string) (Change, bool) {
	elig, active := e.keys[key]
	if !active {
		return Change{}, false
	}
	cur, has := e.claims[key]
	if has && elig.Has(cur.Owner) && e.serving(cur.Owner) {
		delete(e.unplaced, key)
		if e.opts.Failback == FailbackImmediate {
			if w := e.winner(key, elig, cur.Owner); w != cur.Owner {
				return e.transition(key, cur, w, ReasonFailback), true
			}
		}
		return Change{}, false
	}
	var to string
	var why Reason
	switch {
	case !has:
		why = ReasonPlaced
		if e.opts.Failback == FailbackImmediate {
			to = e.winner(key, elig, "")
		} else {
			to = e.leastLoaded(key, elig)
		}
	default:
		switch {
		case !elig.Has(cur.Owner):
			why = ReasonOwnerIneligible
		case e.node(cur.Owner).path == PathDown:
			why = ReasonOwnerDown
		default:
			why = ReasonHoldExpired
		}
		to = e.winner(key, elig, "")
	}
	if to == "" {
		e.unplaced[key] = struct{}{}
		return Change{}, false
	}
	delete(e.unplaced, key)
	return e.transition(key, cur, to, why), true
}

func (e *Engine) transition(key string, cur Claim, to string, why Reason) Change {
	next := Claim{Key: key, Owner: to, Epoch: cur.Epoch + 1}
	e.claims[key] = next
	e.index(key, cur.Owner, to)
	return Change{Key: key, From: cur.Owner, To: to, Epoch: next.Epoch, Reason: why}
}

// index moves key from one owner's set to another's ("" = none).
func (e *Engine) index(key, from, to string) {
	if from == to {
		return
	}
	if from != "" {
		if s := e.owned[from]; s != nil {
			delete(s, key)
			if len(s) == 0 {
				delete(e.owned, from)
			}
		}
	}
	if to != "" {
		s := e.owned[to]
		if s == nil {
			s = map[string]struct{}{}
			e.owned[to] = s
		}
		s[key] = struct{}{}
	}
}

func (e *Engine) ownedKeys(name string) []string {
	s := e.owned[name]
	out := make([]string, 0, len(s))
	for k := range s {
		out = append(out, k)
	}
	return out
}

// candidates calls fn for each eligible node that can take a key now.
func (e *Engine) candidates(elig *NodeSet, fn func(string)) {
	for _, n := range elig.Names() {
		if e.placeable(n) {
			fn(n)
		}
	}
}

// winner is the hash winner among the placeable eligible nodes of the
// highest score, plus extra (the current owner, which may be held rather
// than placeable); "" if none. Without preferences every score is 0 and this
// is MetalLB's hash rule.
func (e *Engine) winner(key string, elig *NodeSet, extra string) string {
	best := extra
	e.candidates(elig, func(n string) {
		if best == "" || better(elig, n, best, key) {
			best = n
		}
	})
	return best
}

// leastLoaded is the placeable eligible node of the highest score owning the
// fewest active keys; ties go to the hash order.
func (e *Engine) leastLoaded(key string, elig *NodeSet) string {
	best, bestScore, bestLoad := "", int64(0), 0
	e.candidates(elig, func(n string) {
		sc, l := elig.Score(n), len(e.owned[n])
		if best == "" || sc > bestScore || (sc == bestScore && (l < bestLoad || (l == bestLoad && hashLess(n, best, key)))) {
			best, bestScore, bestLoad = n, sc, l
		}
	})
	return best
}

// better orders nodes for key: the higher preference score first, then the
// hash order.
func better(elig *NodeSet, a, b, key string) bool {
	if sa, sb := elig.Score(a), elig.Score(b); sa != sb {
		return sa > sb
	}
	return hashLess(a, b, key)
}

// hashLess orders nodes for key by Hash, then by name.
func hashLess(a, b, key string) bool {
	ha, hb := Hash(a, key), Hash(b, key)
	if c := bytes.Compare(ha[:], hb[:]); c != 0 {
		return c < 0
	}
	return a < b
}

// Owner returns the owner of an active key and whether it serves it: the
// claimed owner is eligible and serving (a gone-but-held owner serves; one
// whose data path is down, or that the configuration no longer allows, does
// not, and then nobody does: the key has no placeable candidate).
func (e *Engine) Owner(key string) (owner string, serving bool) {
	elig, ok := e.keys[key]
	if !ok {
		return "", false
	}
	c, ok := e.claims[key]
	if !ok {
		return "", false
	}
	return c.Owner, elig.Has(c.Owner) && e.serving(c.Owner)
}

// Eligible returns the eligible nodes of an active key (nil if inactive).
func (e *Engine) Eligible(key string) *NodeSet { return e.keys[key] }

// Claim returns the replica's claim for key.
func (e *Engine) Claim(key string) (Claim, bool) {
	c, ok := e.claims[key]
	return c, ok
}

// Claims returns every claim of the replica (for push/pull), sorted by key.
func (e *Engine) Claims() []Claim {
	out := make([]Claim, 0, len(e.claims))
	for _, c := range e.claims {
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b Claim) int {
		if a.Key < b.Key {
			return -1
		}
		if a.Key > b.Key {
			return 1
		}
		return 0
	})
	return out
}

// Owned returns the active keys node claims, sorted.
func (e *Engine) Owned(node string) []string {
	out := e.ownedKeys(node)
	slices.Sort(out)
	return out
}

// Load is the number of active keys node claims.
func (e *Engine) Load(node string) int { return len(e.owned[node]) }

// Held reports whether node's speaker is gone while it keeps its keys (the
// hold is running and its data path is not down): a deputy must answer for
// it.
func (e *Engine) Held(node string) bool {
	n := e.nodes[node]
	return n != nil && !n.alive() && e.serving(node)
}

// Speaker returns what the engine knows of node's speaker and data path.
func (e *Engine) Speaker(node string) (Speaker, Path) {
	n := e.nodes[node]
	if n == nil {
		return SpeakerGone, PathUnknown
	}
	return n.speaker, n.path
}

// Watchers returns the k nodes that watch node's data path: the placeable
// nodes that follow node in name order, wrapping around (a ring). Every
// speaker computes the same watchers from the same membership, each node is
// watched by k others whatever the cluster's size, and the first watcher is
// node's deputy: it answers for node's keys while node is held.
func (e *Engine) Watchers(node string, k int) []string {
	ring := e.ring()
	if len(ring) == 0 || k <= 0 {
		return nil
	}
	i, _ := slices.BinarySearch(ring, node)
	out := make([]string, 0, k)
	for j := 0; j < len(ring) && len(out) < k; j++ {
		n := ring[(i+j)%len(ring)]
		if n != node {
			out = append(out, n)
		}
	}
	return out
}

// ring returns the placeable nodes sorted by name, rebuilt when liveness
// changed.
func (e *Engine) ring() []string {
	if e.ringDirty || e.ringCache == nil {
		e.ringCache = e.ringCache[:0]
		for n := range e.nodes {
			if e.placeable(n) {
				e.ringCache = append(e.ringCache, n)
			}
		}
		slices.Sort(e.ringCache)
		e.ringDirty = false
	}
	return e.ringCache
}

// Deputy returns the node that answers for node's keys while node is held:
// its first watcher.
func (e *Engine) Deputy(node string) string {
	if w := e.Watchers(node, 1); len(w) > 0 {
		return w[0]
	}
	return ""
}

// WatchersPerNode is how many nodes probe each owner's data path: enough that
// one watcher dying with it does not leave it unwatched, few enough that the
// probes stay constant per node at any cluster size.
const WatchersPerNode = 2

// Interested reports whether self must probe node's data path: self is one
// of its watchers, and node owns keys (or its data path is down, so that its
// recovery is noticed). Watchers tell the others their verdicts, so the new
// owners of node's keys need not probe it themselves.
func (e *Engine) Interested(node string) bool {
	self := e.opts.Self
	if node == self {
		return false
	}
	n := e.nodes[node]
	if len(e.owned[node]) == 0 && (n == nil || n.path != PathDown || !n.alive()) {
		return false
	}
	return slices.Contains(e.Watchers(node, WatchersPerNode), self)
}

// Nodes returns the names of every node the engine knows, sorted.
func (e *Engine) Nodes() []string {
	out := make([]string, 0, len(e.nodes))
	for n := range e.nodes {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// Unplaced returns the active keys nobody owns or can own, sorted.
func (e *Engine) Unplaced() []string {
	out := make([]string, 0, len(e.unplaced))
	for k := range e.unplaced {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
