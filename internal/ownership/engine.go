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
	// ReasonOwnerUnhealthy: the owner's kernel answers but it cannot deliver
	// (kube-proxy unhealthy and the Service's own data path through it
	// failing), by a majority of its watchers.
	ReasonOwnerUnhealthy Reason = "ownerUnhealthy"
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
	// ReasonRebalance: the owner gave the key to a node holding at least two
	// fewer (Rebalance), a planned move.
	ReasonRebalance Reason = "rebalance"
	// ReasonSpread: the owner of two keys of one group gave one to a node
	// holding none of the group (Spread), a planned move.
	ReasonSpread Reason = "spread"
)

// AllReasons lists every Reason, for exporting the counters (each series
// starts at 0).
func AllReasons() []Reason {
	return []Reason{ReasonPlaced, ReasonOwnerDown, ReasonOwnerUnhealthy, ReasonOwnerIneligible,
		ReasonHoldExpired, ReasonFailback, ReasonLearned, ReasonRebalance, ReasonSpread}
}

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
	// PathUnhealthy: its kernel answers but it cannot deliver Services'
	// traffic: its kube-proxy (or a replacement serving the same health
	// endpoint) is unhealthy and the Services' own data path through it
	// fails. It keeps watching others, but owns and takes no key.
	PathUnhealthy
)

func (p Path) String() string {
	return [...]string{"unknown", "up", "down", "unhealthy"}[p]
}

// delivers reports whether a node with this aggregate verdict may own keys:
// neither down nor unhealthy.
func (p Path) delivers() bool { return p != PathDown && p != PathUnhealthy }

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
	// RequireUp: a node takes keys only once its watchers found it
	// delivering (PathUp), so a node whose kube-proxy has not yet proven
	// healthy since it (re)joined receives none; a node that has no
	// watchers (a single node) cannot be judged and takes keys as before.
	// The speaker sets it when it health-checks nodes; watchers then probe
	// every node they watch, not only owners.
	RequireUp bool
	// AwaitJudgement: with RequireUp, how long a key that has never had an
	// owner waits for eligible nodes whose watchers have not judged them yet
	// (members whose data path is still unknown since they joined), so
	// that a cluster starting up spreads its keys over its nodes instead of
	// giving every key to the first node found up; without failback they
	// would stay there. Keys that have an owner never wait. Zero: no wait.
	AwaitJudgement time.Duration
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
	// path is the aggregate of votes (pathOf), never set directly;
	// pathSince is when it last changed (status).
	path      Path
	pathSince time.Time
	// member: seen as a memberlist member; expected: it runs a speaker Pod
	// (SetSpeakerNodes). Either counts in the quorum, as does an owner of
	// active keys, until forgotten (Forget, or gone memberForget).
	member, expected, forgotten bool
	// votes are the findings of its watchers, by watcher (evidence.go).
	votes map[string]vote
}

func (n *nodeState) alive() bool { return n.speaker != SpeakerGone }

// Engine holds the claims replica and decides ownership. It is not safe for
// concurrent use: one goroutine owns it (see package speaker).
type Engine struct {
	opts     Options
	now      time.Time
	synced   bool
	syncedAt time.Time

	keys     map[string]*NodeSet  // active keys -> eligible nodes
	claims   map[string]Claim     // replica, active and inactive keys
	inactive map[string]time.Time // claims of inactive keys -> since
	// foreign are the inactive keys no Service here ever used (learned from
	// a peer): kept until inactiveTTL, bounded by maxForeignClaims, and not
	// gossiped on, so a claim nobody uses dies out instead of circulating.
	foreign  map[string]struct{}
	nodes    map[string]*nodeState          // every node ever referenced
	owned    map[string]map[string]struct{} // owner -> active keys it claims
	unplaced map[string]struct{}            // active keys nobody serves or can serve, or awaiting a judgement
	away     map[string]struct{}            // nodes whose speaker is gone and hold is running
	// group and groupKeys are the anti-affinity groups (SetGroup): the
	// address slots of one Service, which go to distinct nodes.
	group     map[string]string              // active key -> its group
	groupKeys map[string]map[string]struct{} // group -> its active keys

	ringCache []string // watching nodes by name (Watchers)
	ringDirty bool

	// distrusted: SetTrusted(false); wasActing: Acting() when last checked.
	distrusted, wasActing bool
	// mayWas: mayAct() when last checked; relearnUntil: see relearnFor;
	// missedNews: while it could not act, a member came back or its trust
	// did, so it may have missed decisions (it relearns before acting).
	mayWas, missedNews bool
	relearnUntil       time.Time
	lastLapse          time.Time // last check for lapsed votes
	drops              DropCounts
}

// MaxEpoch bounds claim epochs: a transition never goes past it and a claim
// beyond it is refused, so an epoch can neither wrap to 0 nor be inflated by
// a peer to a value no later transition can beat. At one transition of a key
// a second it lasts nine million years.
const MaxEpoch = 1 << 48

// maxEpochStep bounds how far ahead of the replica's claim a peer's claim for
// the same key may be: replicas differ by the transitions they missed, never
// by a million.
const maxEpochStep = 1 << 20

// maxForeignClaims bounds the claims kept for keys no Service here uses.
const maxForeignClaims = 1 << 16

// New returns an Engine that makes no decision until SetSynced.
func New(opts Options) *Engine {
	if opts.Failback == "" {
		opts.Failback = FailbackNever
	}
	return &Engine{
		opts:      opts,
		keys:      map[string]*NodeSet{},
		claims:    map[string]Claim{},
		inactive:  map[string]time.Time{},
		foreign:   map[string]struct{}{},
		nodes:     map[string]*nodeState{},
		owned:     map[string]map[string]struct{}{},
		unplaced:  map[string]struct{}{},
		away:      map[string]struct{}{},
		group:     map[string]string{},
		groupKeys: map[string]map[string]struct{}{},
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
	e.mayWas, e.missedNews = e.mayAct(), false
	e.wasActing = e.Acting()
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
	if !n.path.delivers() {
		return false
	}
	if n.alive() || n.path == PathUp {
		// A node whose kernel answers its watchers delivers its keys'
		// traffic whatever became of its speaker (crashed, frozen, cut off
		// from memberlist): moving them would only break connections.
		return true
	}
	return e.opts.Hold > 0 && !n.expired && e.now.Sub(n.goneSince) < e.opts.Hold
}

// watching reports whether name is in the ring of watchers: its speaker is a
// member and its data path is not down. An unhealthy node still watches (its
// kernel and speaker work; only its delivery of Services does not): taking
// it out would change other nodes' watchers, and so the votes that count,
// whenever a health check flaps.
func (e *Engine) watching(name string) bool {
	n := e.nodes[name]
	return n != nil && n.alive() && n.path != PathDown
}

// placeable reports whether name can take a key now: it watches, it
// delivers (not unhealthy), and with RequireUp its watchers found it up.
func (e *Engine) placeable(name string) bool {
	if !e.watching(name) {
		return false
	}
	p := e.nodes[name].path
	if p == PathUnhealthy {
		return false
	}
	return !e.opts.RequireUp || p == PathUp || len(e.Watchers(name, WatchersPerNode)) == 0
}

// SetKey makes key active with its eligible nodes (or updates them) and
// decides it.
func (e *Engine) SetKey(key string, eligible *NodeSet) []Change {
	prev, had := e.keys[key]
	e.keys[key] = eligible
	if !had {
		delete(e.inactive, key)
		delete(e.foreign, key)
		if c, ok := e.claims[key]; ok {
			e.index(key, "", c.Owner)
		}
	} else if prev == eligible {
		return nil
	}
	return e.settle(e.decideKeys([]string{key}))
}

// SetGroup puts an active key in an anti-affinity group ("" takes it out):
// placement, failover and Spread keep the keys of one group on distinct
// nodes as long as enough nodes can take them, so that one Service's
// addresses are announced by as many nodes. Call it before SetKey, so that
// the key's first placement already avoids its group. It decides nothing.
func (e *Engine) SetGroup(key, group string) {
	old := e.group[key]
	if old == group {
		return
	}
	if old != "" {
		delete(e.groupKeys[old], key)
		if len(e.groupKeys[old]) == 0 {
			delete(e.groupKeys, old)
		}
		delete(e.group, key)
	}
	if group == "" {
		return
	}
	e.group[key] = group
	m := e.groupKeys[group]
	if m == nil {
		m = map[string]struct{}{}
		e.groupKeys[group] = m
	}
	m[key] = struct{}{}
}

// siblings reports whether node owns another active key of key's group.
func (e *Engine) siblings(node, key string) bool {
	g := e.group[key]
	if g == "" {
		return false
	}
	for k := range e.groupKeys[g] {
		if k == key {
			continue
		}
		if _, active := e.keys[k]; !active {
			continue
		}
		if c, ok := e.claims[k]; ok && c.Owner == node {
			return true
		}
	}
	return false
}

// settle appends what a change of the quorum the call caused decides: the
// owners of active keys count in the membership (members), so keys and
// claims coming and going can grant or take it.
func (e *Engine) settle(changes []Change) []Change {
	if !e.synced {
		return changes
	}
	return append(changes, e.actingChanged()...)
}

// DeleteKey makes key inactive: no Service uses it any more. Its claim is
// kept for a while (inactiveTTL) so a re-created Service keeps its owner.
func (e *Engine) DeleteKey(key string) []Change {
	if _, ok := e.keys[key]; !ok {
		return nil
	}
	delete(e.keys, key)
	delete(e.unplaced, key)
	e.SetGroup(key, "")
	if c, ok := e.claims[key]; ok {
		e.index(key, c.Owner, "")
		e.inactive[key] = e.now
	}
	return e.settle(nil)
}

// SetSpeaker records a node's speaker liveness at time now.
func (e *Engine) SetSpeaker(name string, s Speaker, now time.Time) []Change {
	changes := e.Tick(now)
	n := e.node(name)
	wasAlive, wasActing := n.alive(), e.wasActing
	n.speaker = s
	if s != SpeakerGone {
		n.member, n.forgotten = true, false
		if !wasAlive && e.synced && !e.mayWas {
			e.missedNews = true
		}
	}
	if wasAlive == n.alive() {
		return changes
	}
	e.ringDirty = true
	if wasAlive {
		n.goneSince, n.expired = now, false
		e.away[name] = struct{}{}
		changes = append(changes, e.decideKeys(e.ownedKeys(name))...)
	} else {
		// It is back: whatever was said about its data path is stale.
		clear(n.votes)
		n.path, n.pathSince, n.expired = PathUnknown, now, false
		delete(e.away, name)
	}
	// The ring changed: other nodes' watchers, and so the votes that
	// count, may have too; and the quorum may have been lost or regained.
	changes = append(changes, e.reaggregate()...)
	if regained := e.actingChanged(); regained != nil || e.Acting() && !wasActing {
		return append(changes, regained...) // every key decided afresh, the newcomer's too
	}
	if !wasAlive {
		changes = append(changes, e.nodeBecamePlaceable(name)...)
	}
	return changes
}

// setPath records the aggregate verdict on a node's data path (pathOf).
func (e *Engine) setPath(name string, p Path) []Change {
	return e.setPaths(map[string]Path{name: p})
}

// setPaths records several nodes' aggregate verdicts, all before deciding
// anything, so that every decision sees every new verdict (a key is not
// moved to a node that a later verdict of the same call rules out).
func (e *Engine) setPaths(paths map[string]Path) []Change {
	var keys, placeable []string
	judged := false // a node left PathUnknown: keys awaiting its judgement may be placed
	for name, p := range paths {
		n := e.node(name)
		prev := n.path
		if p == prev {
			continue
		}
		n.path, n.pathSince = p, e.now
		e.ringDirty = true
		judged = judged || prev == PathUnknown
		switch {
		case !p.delivers() && prev.delivers():
			keys = append(keys, e.ownedKeys(name)...)
		case p.delivers() && !prev.delivers() && n.alive(), p == PathUp && e.opts.RequireUp && n.alive():
			placeable = append(placeable, name)
		case prev == PathUp && !n.alive():
			// Its kernel no longer known to answer: its hold runs again.
			if _, ok := e.away[name]; !ok && !n.expired {
				e.away[name] = struct{}{}
			}
			keys = append(keys, e.ownedKeys(name)...)
		}
	}
	if regained := e.actingChanged(); regained != nil {
		return regained // a two-node survivor's quorum (absentDown): every key decided
	}
	if judged {
		keys = append(keys, e.Unplaced()...)
	}
	changes := e.decideKeys(keys)
	slices.Sort(placeable)
	for _, name := range placeable {
		changes = append(changes, e.nodeBecamePlaceable(name)...)
	}
	return changes
}

// nodeBecamePlaceable re-decides the keys a node that became placeable can
// change: those nobody could own, and with FailbackImmediate those it wins.
func (e *Engine) nodeBecamePlaceable(name string) []Change {
	changes := e.decideKeys(e.Unplaced())
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
	var changes []Change
	if now.Sub(e.lastLapse) >= time.Second {
		// Votes that lapsed first, so that the decisions below place keys
		// on the nodes that are placeable now.
		prev := e.lastLapse
		e.lastLapse = now
		changes = e.reaggregate()
		changes = append(changes, e.forgetAndPrune()...)
		if e.judgementWaitEnded(prev, now) {
			changes = append(changes, e.decideKeys(e.Unplaced())...)
		}
	}
	if !e.wasActing && e.synced {
		changes = append(changes, e.actingChanged()...) // a relearning period may have ended
	}
	var keys []string
	for name := range e.away {
		n := e.nodes[name]
		if n.alive() || n.expired {
			delete(e.away, name)
			continue
		}
		if n.path == PathUp {
			continue // it delivers: the hold does not run out (serving)
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
			delete(e.foreign, k)
			delete(e.claims, k)
		}
	}
	return append(changes, e.decideKeys(keys)...)
}

// Merge folds claims received from a peer into the replica and re-decides
// the keys they changed.
func (e *Engine) Merge(claims []Claim) []Change {
	var changes []Change
	var keys []string
	for _, c := range claims {
		cur, had := e.claims[c.Key]
		if c.Epoch > MaxEpoch || (had && c.Epoch > cur.Epoch+maxEpochStep) {
			e.drops[DropClaimEpoch]++
			continue
		}
		if had && !Newer(c, cur) {
			continue
		}
		if _, active := e.keys[c.Key]; !active {
			if _, known := e.inactive[c.Key]; !known {
				if len(e.foreign) >= maxForeignClaims {
					e.drops[DropClaimForeign]++
					continue
				}
				e.inactive[c.Key] = e.now
				e.foreign[c.Key] = struct{}{}
			}
			e.claims[c.Key] = c
			continue
		}
		e.claims[c.Key] = c
		e.index(c.Key, cur.Owner, c.Owner)
		e.node(c.Owner)
		if cur.Owner != c.Owner {
			changes = append(changes, Change{Key: c.Key, From: cur.Owner, To: c.Owner, Epoch: c.Epoch, Reason: ReasonLearned})
		}
		keys = append(keys, c.Key)
	}
	return e.settle(append(changes, e.decideKeys(keys)...))
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
	acting := e.Acting()
	var out []Change
	for _, k := range keys {
		if c, ok := e.decide(k, acting); ok {
			out = append(out, c)
		}
	}
	return out
}

// decide applies the ownership rule to one active key and records the
// transition it makes, if any. A replica that is not acting (no quorum, or
// distrusting itself) makes none: the key keeps its claim until one that
// acts decides, or until this one acts again (actingChanged).
func (e *Engine) decide(key string, acting bool) (Change, bool) {
	elig, active := e.keys[key]
	if !active {
		return Change{}, false
	}
	cur, has := e.claims[key]
	if has && elig.Has(cur.Owner) && e.serving(cur.Owner) {
		delete(e.unplaced, key)
		if e.opts.Failback == FailbackImmediate && acting {
			if w := e.winner(key, elig, cur.Owner); w != cur.Owner {
				return e.transition(key, cur, w, ReasonFailback), true
			}
		}
		return Change{}, false
	}
	if !acting {
		return Change{}, false
	}
	var to string
	var why Reason
	switch {
	case !has:
		if e.awaitsJudgement(elig) {
			e.unplaced[key] = struct{}{}
			return Change{}, false
		}
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
		case e.node(cur.Owner).path == PathUnhealthy:
			why = ReasonOwnerUnhealthy
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
	next := Claim{Key: key, Owner: to, Epoch: min(cur.Epoch+1, MaxEpoch)}
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

// awaitsJudgement reports whether a key with these eligible nodes, never
// owned yet, waits before it is placed (Options.AwaitJudgement): one of
// them joined less than AwaitJudgement ago and its watchers have not
// judged it yet, so it may soon be placeable.
func (e *Engine) awaitsJudgement(elig *NodeSet) bool {
	if !e.opts.RequireUp || e.opts.AwaitJudgement <= 0 {
		return false
	}
	for _, name := range elig.Names() {
		n := e.nodes[name]
		if n != nil && n.alive() && n.path == PathUnknown && e.now.Sub(n.pathSince) < e.opts.AwaitJudgement &&
			e.watching(name) && len(e.Watchers(name, WatchersPerNode)) > 0 {
			return true
		}
	}
	return false
}

// Rebalance moves up to n of the keys this node (Self) owns to the nodes
// that can take them and own at least two fewer keys: the spread that
// failures left (without failback, the IPs of a failed node stay on the
// survivors) comes back by planned moves, which the new owners drain to this
// node, so no connection breaks. Only an owner gives keys away, never takes
// them, so that replicas acting at once cannot move one key twice; a key
// goes only to a node of the same or a higher preference score (the
// least-loaded rule's first criterion), and never with FailbackImmediate,
// where the hash winner owns every key. Keys for which keep returns true
// (nil: none) stay: the caller's, e.g. keys whose last planned move is still
// being drained, since a second move would break the connections the
// previous owner holds. Keys are tried in sorted order; Rebalance returns the
// changes, to be broadcast like any decision.
func (e *Engine) Rebalance(n int, keep func(key string) bool) []Change {
	self := e.opts.Self
	if n <= 0 || e.opts.Failback == FailbackImmediate || !e.synced || !e.Acting() || !e.placeable(self) {
		return nil
	}
	var out []Change
	for _, k := range e.Owned(self) {
		if len(out) >= n {
			break
		}
		if keep != nil && keep(k) {
			continue
		}
		elig := e.keys[k]
		to := e.leastLoaded(k, elig)
		if to == "" || to == self || elig.Score(to) < elig.Score(self) || len(e.owned[to])+2 > len(e.owned[self]) ||
			(e.siblings(to, k) && !e.siblings(self, k)) { // never put two keys of a group together
			continue
		}
		out = append(out, e.transition(k, e.claims[k], to, ReasonRebalance))
	}
	return e.settle(out)
}

// Spread moves up to n of the keys this node (Self) owns together with
// another key of their group (SetGroup) to nodes that can take them and own
// none of the group: a failure that put two of a Service's addresses on one
// node, when fewer nodes could take them, is undone by planned moves once
// enough nodes are back. Like Rebalance, only an owner gives keys away, a
// key goes only to a node of the same or a higher preference score, never
// with FailbackImmediate (the hash winner with anti-affinity places them
// already), and keys for which keep returns true stay. Keys are tried in
// sorted order; the changes are to be broadcast like any decision.
func (e *Engine) Spread(n int, keep func(key string) bool) []Change {
	self := e.opts.Self
	// Without groups (no Service asks for several addresses) there is
	// nothing to spread, and the owned keys are not sorted every tick.
	if n <= 0 || len(e.groupKeys) == 0 || e.opts.Failback == FailbackImmediate || !e.synced || !e.Acting() || !e.placeable(self) {
		return nil
	}
	var out []Change
	for _, k := range e.Owned(self) {
		if len(out) >= n {
			break
		}
		if !e.siblings(self, k) || (keep != nil && keep(k)) {
			continue
		}
		elig := e.keys[k]
		to := e.leastLoaded(k, elig)
		if to == "" || to == self || e.siblings(to, k) || elig.Score(to) < elig.Score(self) {
			continue
		}
		out = append(out, e.transition(k, e.claims[k], to, ReasonSpread))
	}
	return e.settle(out)
}

// judgementWaitEnded reports whether the AwaitJudgement wait for a node
// still unjudged ran out in (from, to]: keys waiting for it are placed now.
func (e *Engine) judgementWaitEnded(from, to time.Time) bool {
	if len(e.unplaced) == 0 || !e.opts.RequireUp || e.opts.AwaitJudgement <= 0 {
		return false
	}
	for _, n := range e.nodes {
		if end := n.pathSince.Add(e.opts.AwaitJudgement); n.alive() && n.path == PathUnknown && end.After(from) && !end.After(to) {
			return true
		}
	}
	return false
}

// winner is the hash winner among the placeable eligible nodes of the
// highest score, plus extra (the current owner, which may be held rather
// than placeable); "" if none. Without preferences every score is 0 and this
// is MetalLB's hash rule. Nodes that own another key of key's group come
// last (SetGroup).
func (e *Engine) winner(key string, elig *NodeSet, extra string) string {
	best, bestSib := extra, extra != "" && e.siblings(extra, key)
	e.candidates(elig, func(n string) {
		sib := e.siblings(n, key)
		if best == "" || (bestSib && !sib) || (sib == bestSib && better(elig, n, best, key)) {
			best, bestSib = n, sib
		}
	})
	return best
}

// leastLoaded is the placeable eligible node of the highest score owning the
// fewest active keys; ties go to the hash order. Nodes that own another key
// of key's group come last (SetGroup).
func (e *Engine) leastLoaded(key string, elig *NodeSet) string {
	best, bestSib, bestScore, bestLoad := "", false, int64(0), 0
	e.candidates(elig, func(n string) {
		sib, sc, l := e.siblings(n, key), elig.Score(n), len(e.owned[n])
		switch {
		case best == "", bestSib && !sib:
		case sib != bestSib:
			return
		case sc < bestScore, sc == bestScore && (l > bestLoad || (l == bestLoad && !HashLess(n, best, key))):
			return
		}
		best, bestSib, bestScore, bestLoad = n, sib, sc, l
	})
	return best
}

// better orders nodes for key: the higher preference score first, then the
// hash order.
func better(elig *NodeSet, a, b, key string) bool {
	if sa, sb := elig.Score(a), elig.Score(b); sa != sb {
		return sa > sb
	}
	return HashLess(a, b, key)
}

// HashLess is the hash order of nodes for key, the one every component
// uses (election's Rank, placement here, the status view): by
// Hash, then by name, so that the order is total even on a hash tie.
func HashLess(a, b, key string) bool {
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

// Claims returns the claims of the replica a peer needs (push/pull), sorted
// by key: those of active keys and of keys deleted here, not those learned
// for keys no Service here ever used (foreign), which would otherwise
// circulate between replicas forever.
func (e *Engine) Claims() []Claim {
	out := make([]Claim, 0, len(e.claims))
	for k, c := range e.claims {
		if _, f := e.foreign[k]; f {
			continue
		}
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

// AnyOwned calls fn with active keys node claims, in map order, until fn
// returns true.
func (e *Engine) AnyOwned(node string, fn func(key string) bool) {
	for k := range e.owned[node] {
		if fn(k) {
			return
		}
	}
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

// PathSince returns when node's data-path verdict last changed (zero: never).
func (e *Engine) PathSince(node string) time.Time {
	if n := e.nodes[node]; n != nil {
		return n.pathSince
	}
	return time.Time{}
}

// Placeable reports whether node can take a key now (status).
func (e *Engine) Placeable(node string) bool { return e.placeable(node) }

// Speaker returns what the engine knows of node's speaker and data path.
func (e *Engine) Speaker(node string) (Speaker, Path) {
	n := e.nodes[node]
	if n == nil {
		return SpeakerGone, PathUnknown
	}
	return n.speaker, n.path
}

// Watchers returns the k nodes that watch node's data path: the watching
// nodes (members whose data path is not down) that follow node in name
// order, wrapping around (a ring). Every speaker computes the same watchers
// from the same membership, each node is watched by k others whatever the
// cluster's size, and the first watcher is node's deputy: it answers for
// node's keys while node is held.
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

// ring returns the watching nodes sorted by name, rebuilt when liveness
// changed.
func (e *Engine) ring() []string {
	if e.ringDirty || e.ringCache == nil {
		e.ringCache = e.ringCache[:0]
		for n := range e.nodes {
			if e.watching(n) {
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

// WatchersPerNode is how many nodes probe each owner's data path, and a
// majority of them must agree that it is down before its keys move: one
// watcher whose own cable, port or CPU failed is outvoted, and one dying with
// the owner still leaves a majority to decide (two of three).
const WatchersPerNode = 3

// Interested reports whether self must probe node's data path: self is one
// of its watchers, and node owns keys (or its data path is down or
// unhealthy, so that its recovery is noticed; with RequireUp any member,
// since it takes keys only once found up). Watchers tell the others their
// verdicts, so the new owners of node's keys need not probe it themselves.
func (e *Engine) Interested(node string) bool {
	self := e.opts.Self
	if node == self {
		return false
	}
	n := e.nodes[node]
	judged := n != nil && n.alive() && (!n.path.delivers() || e.opts.RequireUp)
	if len(e.owned[node]) == 0 && !judged {
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

// Unplaced returns the active keys nobody owns or can own, or that await a
// node's judgement before their first placement (AwaitJudgement), sorted.
func (e *Engine) Unplaced() []string {
	out := make([]string, 0, len(e.unplaced))
	for k := range e.unplaced {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
