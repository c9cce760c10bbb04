package speaker

import (
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	"github.com/ironlb/ironlb/internal/election"
	"github.com/ironlb/ironlb/internal/layer2"
	"github.com/ironlb/ironlb/internal/ownership"
	"github.com/ironlb/ironlb/internal/service"
	"github.com/ironlb/ironlb/internal/statusview"
	"github.com/ironlb/ironlb/internal/textlimit"
)

// announcer is what the speaker needs from layer2.Announcer.
type announcer interface {
	Apply(updates []layer2.BalancerUpdate)
	SetProxy(name string, ips []netip.Addr, macs map[string]net.HardwareAddr)
	SetHandover(name string, ips []netip.Addr, interfaces []string)
	DeleteProxy(name string)
	Interfaces() []string
	KernelARPFindings(ips []netip.Addr) ([]layer2.KernelARPFinding, error)
}

// svcEntry is what the speaker knows of one Service.
type svcEntry struct {
	// in is the Service's Input without Eligible and Scores: eligible holds
	// them, interned. Most Services share a few node sets, and a copy per
	// Service of the eligible nodes' names would cost 16 bytes per node per
	// Service (160 MB at 10,000 Services and 1,000 nodes;
	// BenchmarkSpeakerAtScale).
	in       Input
	eligible *ownership.NodeSet
	ref      *corev1.Service // identity only, for events
	// slots are in.Slots(): one ownership key each, announced by its
	// owner. One slot (every MetalLB Service) is keyed by in.Key().
	slots []Slot
}

// slotKeys returns the ownership keys of the entry's slots (none for nil).
func (e *svcEntry) slotKeys() []string {
	if e == nil {
		return nil
	}
	out := make([]string, 0, len(e.slots))
	for _, s := range e.slots {
		out = append(out, s.Key)
	}
	return out
}

// slot returns the entry's slot keyed key.
func (e *svcEntry) slot(key string) (Slot, bool) {
	for _, s := range e.slots {
		if s.Key == key {
			return s, true
		}
	}
	return Slot{}, false
}

// group is the anti-affinity group of the entry's slots (ownership.Engine.
// SetGroup): the Service's key when it has several, none otherwise.
func (e *svcEntry) group() string {
	if e == nil || len(e.slots) < 2 {
		return ""
	}
	return e.in.Key()
}

// announced is what this node gave the announcer for one Service.
type announced struct {
	ips        []netip.Addr
	interfaces []string // nil = all
}

func (a announced) equal(b announced) bool {
	return slices.Equal(a.ips, b.ips) && slices.Equal(a.interfaces, b.interfaces)
}

// proxied is what this node answers for on behalf of a held node.
type proxied struct {
	ips  []netip.Addr
	macs map[string]net.HardwareAddr
}

// owners is the speaker's ownership layer: the Services it knows, grouped by
// key, the ownership engine that decides who announces each key, and what it
// told the announcer. Every input (a Service's Input, a member's liveness, a
// data-path verdict, claims from peers, the clock) goes through its methods,
// which apply the consequences to the announcer at once and only then queue
// ServiceL2Status writes and events: a takeover never waits for the API
// server or for other Services.
type owners struct {
	log     logr.Logger
	self    string
	ann     announcer
	metrics *metrics
	// status queues a ServiceL2Status sync for a Service (non-blocking).
	status func(svc string)
	// broadcast gossips claims this node decided (nil without memberlist).
	broadcast func([]ownership.Claim)
	recorder  recorder.EventRecorder

	mu       sync.Mutex
	eng      *ownership.Engine
	sets     *ownership.Interner
	services map[string]*svcEntry
	// byKey maps each ownership key (a Service's address slot, shared by
	// the Services sharing its IPs) to the Services using it.
	byKey       map[string]map[string]struct{}
	announced   map[string]announced
	proxies     map[string]proxied
	macs        map[string]map[string]net.HardwareAddr // node -> interface -> MAC
	unannounced map[string]string                      // Service -> reason logged
	proxyDirty  bool
	lastSweep   time.Time
	started     bool // the first decision after sync is done: events from now on
	// changes are the last changeHistory owner changes, a ring whose
	// oldest entry is changeNext once full (`ironlb status`).
	changes    []statusview.Change
	changeNext int
	// dropsSeen: the engine's drop counters when last exported.
	dropsSeen ownership.DropCounts
	// drains are the keys this node took over from a node whose data path
	// was up, in their drain period (drainTimeout; 0: none): handoff gives
	// them to the data path (secondChance), which forwards the connections
	// this node does not know to that node. A key is drained only while
	// this node owns it: a node that lost a key forwards nothing for it,
	// so two nodes never hand a flow back and forth.
	drains       map[string]drainEntry
	drainTimeout time.Duration
	handoff      func([]Drain)
	// rebalanceEvery paces Rebalance: one key given away at most this
	// often (0: never); lastRebalance is when the last one was tried.
	rebalanceEvery time.Duration
	lastRebalance  time.Time
	// rebalanceAsked is the last RebalanceAnnotation seen on this node, and
	// rebalanceUntil the end of the burst it asked for.
	rebalanceAsked string
	rebalanceUntil time.Time
	// lastSpread is when this node last tried to give away one of a
	// Service's slots it holds with another (spreadEvery).
	lastSpread time.Time
	// handovers are the keys this node gave to another node, until when it
	// still answers for their IPs (handoverLinger): the announcer ends each
	// IP's hand-over earlier once the new owner announces it.
	handovers map[string]time.Time
}

// handoverLinger bounds how long a node that gave a key away keeps
// answering ARP/NDP for its IPs, in case the new owner never announces them.
// The new owner learns the move by gossip, a moment later (longer in a burst
// of hundreds of moves), and its gratuitous announcement, seen by this node,
// ends the hand-over at once; until then a client whose neighbour entry
// expired would find nobody answering.
const handoverLinger = 5 * time.Second

// drainEntry is a planned move to this node in its drain period.
type drainEntry struct {
	from  string
	until time.Time
}

func newOwners(log logr.Logger, self string, opts ownership.Options, ann announcer, m *metrics, rec recorder.EventRecorder) *owners {
	opts.Self = self
	return &owners{
		log: log, self: self, ann: ann, metrics: m, recorder: rec,
		status:      func(string) {},
		eng:         ownership.New(opts),
		sets:        ownership.NewInterner(),
		services:    map[string]*svcEntry{},
		byKey:       map[string]map[string]struct{}{},
		announced:   map[string]announced{},
		proxies:     map[string]proxied{},
		macs:        map[string]map[string]net.HardwareAddr{},
		unannounced: map[string]string{},
		drains:      map[string]drainEntry{},
		handovers:   map[string]time.Time{},
	}
}

// scope is what one call of the ownership layer decides besides the claims:
// a value built by that call alone, never kept on owners between calls.
type scope struct {
	// assigned are keys a transition of this call gave to this node:
	// starting to announce them is a nodeAssigned event even at start-up.
	assigned map[string]bool
	// updates are the announcer changes, applied as one batch
	// (layer2.Announcer.Apply) once every key is decided: a takeover of
	// hundreds of Services swaps the responders' sets once.
	updates []layer2.BalancerUpdate
	// events are recorded after the call, outside the lock (recording may
	// block on a full buffer).
	events []func()
	// checks are the Services newly announced, whose interfaces and kernel
	// ARP settings are checked after the call, off the announcement's path
	// (they read the node's links and addresses).
	checks []announceCheck
}

// do runs fn under the lock with a fresh scope, applies the changes it
// returns (the announcer gets the scope's updates as one batch), then, out
// of the lock, emits the scope's events and runs its checks.
func (o *owners) do(fn func(sc *scope) []ownership.Change) {
	sc := &scope{assigned: map[string]bool{}}
	o.mu.Lock()
	o.applyLocked(sc, fn(sc))
	o.mu.Unlock()
	for _, e := range sc.events {
		e()
	}
	o.checkAnnounced(sc.checks)
}

// SetService records a Service's input (nil ref: deleted).
func (o *owners) SetService(svc string, in Input, ref *corev1.Service) {
	o.do(func(sc *scope) []ownership.Change {
		oldKeys := o.services[svc].slotKeys()
		if ref != nil && in.Reason == ReasonNotLoadBalancer {
			// Most Services of a cluster are not LoadBalancers: keep
			// nothing for them (one that changes type is dropped here).
			ref = nil
		}
		if ref == nil {
			delete(o.services, svc)
		} else {
			e := &svcEntry{in: in, eligible: o.sets.Intern(in.Eligible, in.Scores),
				// Only what an event's reference needs.
				ref: &corev1.Service{ObjectMeta: metav1.ObjectMeta{
					Namespace: ref.Namespace, Name: ref.Name, UID: ref.UID, ResourceVersion: ref.ResourceVersion}},
				slots: in.Slots()}
			e.in.Eligible, e.in.Scores = nil, nil
			o.services[svc] = e
		}
		newKeys := o.services[svc].slotKeys()
		var changes []ownership.Change
		for _, k := range oldKeys {
			if slices.Contains(newKeys, k) {
				continue
			}
			delete(o.byKey[k], svc)
			if len(o.byKey[k]) == 0 {
				delete(o.byKey, k)
			}
			changes = append(changes, o.updateKeyLocked(sc, k)...)
		}
		// In slot order: each slot's first placement sees where the
		// slots before it went, and avoids their nodes.
		for _, k := range newKeys {
			if o.byKey[k] == nil {
				o.byKey[k] = map[string]struct{}{}
			}
			o.byKey[k][svc] = struct{}{}
			changes = append(changes, o.updateKeyLocked(sc, k)...)
		}
		o.refreshServiceLocked(sc, svc)
		return changes
	})
}

// groupLocked is key's anti-affinity group: that of the Services using it
// with several slots (the smallest, should Services sharing an IP differ).
func (o *owners) groupLocked(key string) string {
	g := ""
	for svc := range o.byKey[key] {
		if sg := o.services[svc].group(); sg != "" && (g == "" || sg < g) {
			g = sg
		}
	}
	return g
}

// updateKeyLocked gives the engine a key's eligible nodes: the nodes every
// announceable Service of the key allows (they normally agree: sharing
// requires it), each with the lowest score those Services give it (equal
// too: Services sharing an IP cannot be told apart by serviceSelectors), or
// deactivates the key when none is announceable.
func (o *owners) updateKeyLocked(sc *scope, key string) []ownership.Change {
	var elig *ownership.NodeSet
	for svc := range o.byKey[key] {
		e := o.services[svc]
		if e == nil || e.in.Reason != "" {
			continue
		}
		if elig == nil {
			elig = e.eligible
		} else {
			elig = o.sets.Intersect(elig, e.eligible)
		}
	}
	// The group is set first: the key's placement by SetKey avoids the
	// nodes of its siblings. A key no Service uses leaves its group (the
	// engine's groups stay bounded by the keys in use).
	o.eng.SetGroup(key, o.groupLocked(key))
	if elig == nil {
		changes := o.eng.DeleteKey(key)
		o.refreshKeyLocked(sc, key)
		return changes
	}
	if o.ownerHeldLocked(key) {
		o.proxyDirty = true
	}
	wasActive := o.eng.Eligible(key) != nil
	changes := o.eng.SetKey(key, elig)
	if c, kept := o.eng.Claim(key); !wasActive && kept && len(changes) == 0 && o.started && o.broadcast != nil {
		// A key that became active again with a claim this replica kept (a
		// Service re-created within inactiveTTL keeps its owner): a peer
		// that forgot the claim (restarted meanwhile) placed the key afresh
		// at a lower epoch, which this replica ignores, and without this
		// gossip it would learn the kept claim only at the next push/pull,
		// two nodes answering meanwhile (6 s in the lab).
		o.broadcast([]ownership.Claim{c})
	}
	return changes
}

func (o *owners) ownerHeldLocked(key string) bool {
	c, ok := o.eng.Claim(key)
	return ok && o.eng.Held(c.Owner)
}

// applyLocked reports changes (log, metric, gossip) and brings the announcer
// in step for the keys they touch.
func (o *owners) applyLocked(sc *scope, changes []ownership.Change) {
	for _, ch := range changes {
		if ch.To == o.self && ch.From != o.self && ch.Reason != ownership.ReasonLearned {
			sc.assigned[ch.Key] = true
		}
	}
	// A key this node decided to give to another node by a planned move is
	// handed over: this node, which still delivers, answers for its IPs
	// until the new owner, which learns of the move by gossip, announces
	// them. (Not when this node's data path is judged down or unhealthy:
	// then its answers would only keep clients away from the new owner.)
	type handover struct {
		key        string
		interfaces []string
	}
	var handovers []handover
	for _, ch := range changes {
		if ch.From != o.self || ch.To == "" || ch.To == o.self || !handedOver[ch.Reason] {
			continue
		}
		if ifaces, ok := o.announcedInterfacesLocked(ch.Key); ok {
			handovers = append(handovers, handover{ch.Key, ifaces})
		}
	}
	// Answer first: the announcer gets every key's change in one batch
	// before the logs, metrics and gossip below, so that none of them
	// delays a takeover.
	for _, ch := range changes {
		if o.eng.Held(ch.From) || o.eng.Held(ch.To) {
			o.proxyDirty = true
		}
		o.refreshKeyLocked(sc, ch.Key)
	}
	if o.proxyDirty {
		o.refreshProxiesLocked()
	}
	// Before the balancers go (Apply), so that the IPs are answered
	// throughout, on the interfaces they were announced on.
	for _, h := range handovers {
		if ips := o.keyIPsLocked(h.key); len(ips) > 0 {
			o.ann.SetHandover(handoverName(h.key), ips, h.interfaces)
			o.handovers[h.key] = time.Now().Add(handoverLinger)
		}
	}
	// A planned move's forwarding is in place before this node answers for
	// the IP: from the gratuitous ARP on, the connections it does not know
	// arrive here, and each one that reached kube-proxy first would reset.
	if o.noteDrainsLocked(changes, time.Now()) {
		o.handDrainsLocked()
	}
	if len(sc.updates) > 0 {
		o.ann.Apply(sc.updates)
	}
	var mine []ownership.Claim
	now := time.Now()
	for _, g := range groupChanges(changes) {
		// The info line of an ownership change, on the nodes it involves,
		// with its cause; the announcer and status work it causes is
		// logged at debug.
		log := o.log.V(1)
		if g.from == o.self || g.to == o.self {
			log = o.log
		}
		if !log.Enabled() {
			continue // a debug line: not worth listing the Services for
		}
		var svcs []string
		for _, k := range g.keys {
			svcs = append(svcs, o.servicesOfLocked(k)...)
		}
		log.Info("owner changed", "ips", g.keys, "from", g.from, "to", g.to, "reason", string(g.reason), "services", svcs)
	}
	for _, ch := range changes {
		o.metrics.ownerChanges.WithLabelValues(string(ch.Reason)).Inc()
		o.recordChangeLocked(now, ch)
		if ch.Reason != ownership.ReasonLearned {
			mine = append(mine, ownership.Claim{Key: ch.Key, Owner: ch.To, Epoch: ch.Epoch})
		}
	}
	if len(mine) > 0 && o.broadcast != nil {
		o.broadcast(mine)
	}
}

// noteDrainsLocked starts a drain for each key this node takes over from a
// node whose data path is up (a planned move: that node still holds the
// connections' state), and ends those of keys it lost. It reports whether
// the drains changed.
func (o *owners) noteDrainsLocked(changes []ownership.Change, now time.Time) bool {
	changed := false
	for _, ch := range changes {
		if ch.To == o.self && ch.From != "" && ch.From != o.self && o.drainTimeout > 0 {
			if _, p := o.eng.Speaker(ch.From); p == ownership.PathUp {
				o.drains[ch.Key] = drainEntry{from: ch.From, until: now.Add(o.drainTimeout)}
				changed = true
				continue
			}
		}
		if _, ok := o.drains[ch.Key]; ok && ch.To != o.self {
			delete(o.drains, ch.Key)
			changed = true
		}
	}
	return changed
}

// handedOver are the reasons of the moves a node that gave its key away
// hands over (planned moves: the node still delivers).
var handedOver = map[ownership.Reason]bool{
	ownership.ReasonOwnerIneligible: true,
	ownership.ReasonFailback:        true,
	ownership.ReasonRebalance:       true,
	ownership.ReasonSpread:          true,
}

// spreadEvery paces Spread: a node holding two slots of one Service (fewer
// nodes could take them when they were placed) gives one away at most this
// often, as a planned move, once another node can take it. Always on: two
// of a Service's addresses on one node are the failure it was spread to
// avoid.
const spreadEvery = time.Second

// handoverName is the announcer entry of a key's hand-over.
func handoverName(key string) string { return "handover/" + key }

// announcedInterfacesLocked returns the interfaces this node announces
// key's Services on (nil: all) and whether it announces any.
func (o *owners) announcedInterfacesLocked(key string) ([]string, bool) {
	var ifaces []string
	announces, all := false, false
	for svc := range o.byKey[key] {
		a, ok := o.announced[svc]
		if !ok {
			continue
		}
		announces = true
		all = all || a.interfaces == nil
		ifaces = append(ifaces, a.interfaces...)
	}
	if all {
		return nil, announces
	}
	slices.Sort(ifaces)
	return slices.Compact(ifaces), announces
}

// keyIPsLocked returns the IPs of key's slot of its Services that are to be
// announced (no Reason not to), sorted and without duplicates.
func (o *owners) keyIPsLocked(key string) []netip.Addr {
	var ips []netip.Addr
	for svc := range o.byKey[key] {
		if e := o.services[svc]; e != nil && e.in.Reason == "" {
			if s, ok := e.slot(key); ok {
				ips = append(ips, s.IPs...)
			}
		}
	}
	slices.SortFunc(ips, netip.Addr.Compare)
	return slices.Compact(ips)
}

// drainingLocked reports whether this node drains key (a planned move
// brought it here less than the drain timeout ago): it keeps such a key
// from being rebalanced away. Drains are one hop: once this node gives the
// key away it forwards nothing for it (two nodes must never hand a flow
// back and forth), so the connections it still forwards to the previous
// owner would break.
func (o *owners) drainingLocked(key string) bool {
	_, ok := o.drains[key]
	return ok
}

// handDrainsLocked gives the data path the drains in effect, with the IPs of
// their keys' Services; keys this node no longer serves are dropped.
func (o *owners) handDrainsLocked() {
	if o.handoff == nil {
		return
	}
	out := make([]Drain, 0, len(o.drains))
	for key, d := range o.drains {
		if owner, serving := o.eng.Owner(key); owner != o.self || !serving {
			delete(o.drains, key)
			continue
		}
		ips := o.keyIPsLocked(key)
		if len(ips) == 0 {
			continue
		}
		out = append(out, Drain{Key: key, From: d.from, IPs: ips, Until: d.until, MACs: maps.Clone(o.macs[d.from])})
	}
	slices.SortFunc(out, func(a, b Drain) int { return strings.Compare(a.Key, b.Key) })
	o.handoff(out)
}

// setRebalance makes this node give one of its keys away at most every
// every, to a node owning at least two fewer (ownership.Engine.Rebalance): a
// planned move, drained by the new owner. Zero: never.
func (o *owners) setRebalance(every time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.rebalanceEvery = every
}

// Asked rebalancing (election.RebalanceAnnotation): one key a second for a
// minute from the annotation's time; an older request is ignored (a
// restarted speaker reading an annotation set long ago).
const (
	rebalanceBurstEvery = time.Second
	rebalanceBurst      = time.Minute
)

// RequestRebalance takes this node's RebalanceAnnotation (RFC 3339 time;
// "" none): a new value within the last rebalanceBurst starts a burst of
// rebalancing until rebalanceBurst after it, and removing it ends the
// burst. A value that does not parse is logged once.
func (o *owners) RequestRebalance(value string, now time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if value == o.rebalanceAsked {
		return
	}
	o.rebalanceAsked = value
	if value == "" {
		o.rebalanceUntil = time.Time{} // removed (the command is done, or an operator): the burst ends
		return
	}
	at, err := time.Parse(time.RFC3339, value)
	if err != nil {
		o.log.Info("ignoring the rebalance annotation: not an RFC 3339 time", "annotation", election.RebalanceAnnotation, "value", textlimit.Quote(value))
		return
	}
	if until := at.Add(rebalanceBurst); now.Before(until) {
		o.rebalanceUntil = until
		o.log.Info("rebalancing asked: giving IPs to nodes owning two fewer, one a second", "until", until.UTC().Format(time.RFC3339))
	}
}

// setDrains turns planned-move drains on (Start): keys taken over from a
// node whose data path is up are drained for timeout, handed to handoff.
func (o *owners) setDrains(timeout time.Duration, handoff func([]Drain)) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.drainTimeout, o.handoff = timeout, handoff
}

func (o *owners) servicesOfLocked(key string) []string {
	out := make([]string, 0, len(o.byKey[key]))
	for s := range o.byKey[key] {
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

func (o *owners) refreshKeyLocked(sc *scope, key string) {
	for svc := range o.byKey[key] {
		o.refreshServiceLocked(sc, svc)
	}
}

// refreshServiceLocked makes the announcer, metrics and logs match what this
// node should do for svc, and queues its status when that changed.
func (o *owners) refreshServiceLocked(sc *scope, svc string) {
	e := o.services[svc]
	prev, had := o.announced[svc]
	var ips []netip.Addr
	var owner string
	assigned := false
	if e != nil && e.in.Reason == "" && e.in.Self && o.eng.Synced() {
		for _, s := range e.slots {
			if ow, serving := o.eng.Owner(s.Key); serving && ow == o.self {
				ips = append(ips, s.IPs...)
				assigned = assigned || sc.assigned[s.Key]
			} else if owner == "" {
				owner = ow
			}
		}
		// As the Service lists them: one slot gives back in.IPs itself.
		ips = filterIPs(e.in.IPs, ips)
	}
	want := len(ips) > 0
	o.logUnannouncedLocked(svc, e)
	if !want {
		if had {
			sc.updates = append(sc.updates, layer2.BalancerUpdate{Name: svc, Delete: true})
			o.setAnnouncedMetric(svc, prev.ips, nil)
			delete(o.announced, svc)
			reason := string(election.ReasonNotOwner)
			if e == nil {
				reason = ReasonServiceDeleted
			} else if e.in.Reason != "" {
				reason = e.in.Reason
			}
			// Debug: the owner change that caused it, if any, is the info
			// line (applyLocked); MetalLB's message name is kept.
			o.log.V(1).Info("serviceWithdrawn", "service", svc, "reason", reason, "owner", owner, "ips", prev.ips)
		}
		o.status(svc)
		return
	}
	next := announced{ips: ips}
	if !e.in.AllInterfaces {
		next.interfaces = e.in.Interfaces
	}
	if had && prev.equal(next) {
		return
	}
	sc.updates = append(sc.updates, layer2.BalancerUpdate{Name: svc, IPs: next.ips, Interfaces: next.interfaces})
	o.announced[svc] = next
	o.setAnnouncedMetric(svc, prev.ips, next.ips)
	o.log.V(1).Info("serviceAnnounced", "service", svc, "ips", next.ips, "pool", e.in.Pool, "interfaces", next.interfaces)
	o.status(svc)
	// New here: the Service (one slot), or some of its slots' IPs.
	added := next.ips
	if had && len(e.slots) < 2 {
		added = nil
	} else if had {
		added = slices.DeleteFunc(slices.Clone(next.ips), func(ip netip.Addr) bool { return slices.Contains(prev.ips, ip) })
	}
	if len(added) == 0 || (!o.started && !assigned) {
		// A restarted speaker resuming the IPs it owned assigns nothing;
		// a transition to this node, or any new announcement once
		// started, does: for a Service with several slots, each slot
		// this node takes (the event names its IPs).
		return
	}
	ref := e.ref
	if here, before := slotsIn(e.slots, next.ips), slotsIn(e.slots, prev.ips); here > 1 && here > before {
		// Anti-affinity places a Service's slots on distinct nodes first:
		// two here means no other node could take one.
		msg := fmt.Sprintf("%d of the Service's %d address slots (%s) are announced from node %q: no other eligible node can take one now; they spread again, one a second, once one can",
			here, len(e.slots), service.JoinIPs(next.ips, ", "), o.self)
		sc.events = append(sc.events, func() {
			o.recorder.Eventf(ref, nil, corev1.EventTypeWarning, EventAddressesShareNode, "Announce", "%s", msg)
		})
	}
	if len(e.slots) < 2 {
		sc.events = append(sc.events, func() {
			o.recorder.Eventf(ref, nil, corev1.EventTypeNormal, EventNodeAssigned, "Announce",
				"announcing from node %q with protocol %q", o.self, Protocol)
		})
	} else {
		sc.events = append(sc.events, func() {
			o.recorder.Eventf(ref, nil, corev1.EventTypeNormal, EventNodeAssigned, "Announce",
				"announcing %s from node %q with protocol %q", service.JoinIPs(added, ", "), o.self, Protocol)
		})
	}
	sc.checks = append(sc.checks, announceCheck{svc: svc, ref: ref, announced: announced{ips: added, interfaces: next.interfaces}})
}

// slotsIn counts the slots whose addresses ips holds.
func slotsIn(slots []Slot, ips []netip.Addr) int {
	n := 0
	for _, s := range slots {
		if slices.Contains(ips, s.IPs[0]) {
			n++
		}
	}
	return n
}

// filterIPs returns the IPs of all that are in some, in all's order (all
// itself when every one is).
func filterIPs(all, some []netip.Addr) []netip.Addr {
	if len(some) == len(all) {
		return all
	}
	return slices.DeleteFunc(slices.Clone(all), func(ip netip.Addr) bool { return !slices.Contains(some, ip) })
}

// announceCheck is a Service newly announced from this node.
type announceCheck struct {
	svc       string
	ref       *corev1.Service
	announced announced
}

// checkAnnounced warns, for Services this node just started announcing,
// when none of the advertisement's interfaces exists here, and when this
// node's kernel would answer ARP for their IPs itself. It runs after the
// announcement, outside the lock, with one scan of the node's interfaces and
// addresses for all of them.
func (o *owners) checkAnnounced(checks []announceCheck) {
	if len(checks) == 0 {
		return
	}
	have := o.ann.Interfaces()
	var ips []netip.Addr
	for _, c := range checks {
		ips = append(ips, c.announced.ips...)
		if c.announced.interfaces == nil || len(have) == 0 ||
			slices.ContainsFunc(c.announced.interfaces, func(i string) bool { return slices.Contains(have, i) }) {
			continue
		}
		for _, ip := range c.announced.ips {
			o.recorder.Eventf(c.ref, nil, corev1.EventTypeWarning, EventAnnounceFailed, "Announce",
				"the interfaces specified by LB IP %q doesn't exist in assigned node %q with protocol %q", ip.String(), o.self, Protocol)
		}
		o.log.Info("announceFailed: none of the advertisement's interfaces exists here", "service", c.svc, "interfaces", c.announced.interfaces, "nodeInterfaces", have)
	}
	findings, err := o.ann.KernelARPFindings(ips)
	if err != nil {
		o.log.V(1).Info("cannot check whether the kernel answers ARP for the announced IPs", "services", len(checks), "error", err.Error())
		return
	}
	for _, f := range findings {
		for _, c := range checks {
			if !slices.Contains(c.announced.ips, f.IP) {
				continue
			}
			o.log.Info("the kernel of this node answers ARP for a load-balancer IP", "service", c.svc, "ip", f.IP, "message", f.Message)
			o.recorder.Eventf(c.ref, nil, corev1.EventTypeWarning, EventKernelAnswersARP, "Announce", "%s", f.Message)
		}
	}
}

// notAnnouncedReasons are the reasons that leave a Service unannounced by
// every node and that an operator can fix (endpoints, advertisements, node
// labels or conditions, pools); they are logged at info level once per change.
// Reasons that are normal (other class, not a LoadBalancer) or already
// reported elsewhere (noConfig: the config error) are not.
var notAnnouncedReasons = map[string]bool{
	election.ReasonNoCandidates:                true,
	election.ReasonNoMatchingAdvertisement:     true,
	election.ReasonNoReadyEndpoints:            true,
	election.ReasonSharedIPWithServiceSelector: true,
	ReasonIPNotAllowed:                         true,
	ReasonInvalidIP:                            true,
}

// logUnannouncedLocked logs, once per change of reason, that no node
// announces svc. Every speaker logs it (each sees the same inputs), which is
// what an operator looking at any one speaker needs.
func (o *owners) logUnannouncedLocked(svc string, e *svcEntry) {
	reason := ""
	if e != nil {
		reason = e.in.Reason
		if reason == "" && o.eng.Synced() && !slices.ContainsFunc(e.slots, func(s Slot) bool {
			owner, serving := o.eng.Owner(s.Key)
			return owner != "" && serving
		}) {
			reason = election.ReasonNoCandidates
		}
	}
	if !notAnnouncedReasons[reason] {
		delete(o.unannounced, svc)
		return
	}
	if o.unannounced[svc] == reason {
		return
	}
	o.unannounced[svc] = reason
	var ips []netip.Addr
	pool := ""
	if e != nil {
		ips, pool = e.in.IPs, e.in.Pool
	}
	o.log.Info("serviceNotAnnounced: no node announces this Service", "service", svc, "reason", reason, "ips", ips, "pool", pool)
}

func (o *owners) setAnnouncedMetric(svc string, old, next []netip.Addr) {
	for _, ip := range old {
		if !slices.Contains(next, ip) {
			o.metrics.announced.DeleteLabelValues(ip.String(), o.self, Protocol, svc)
		}
	}
	for _, ip := range next {
		o.metrics.announced.WithLabelValues(ip.String(), o.self, Protocol, svc).Set(1)
	}
}

// refreshProxiesLocked makes this node answer, with the owner's MAC, for the
// IPs of every held node it is the deputy of, and for no other.
func (o *owners) refreshProxiesLocked() {
	o.proxyDirty = false
	want := map[string]proxied{}
	for _, n := range o.eng.Nodes() {
		if n == o.self || !o.eng.Held(n) || o.eng.Deputy(n) != o.self || len(o.macs[n]) == 0 {
			continue
		}
		var ips []netip.Addr
		for _, k := range o.eng.Owned(n) {
			ips = append(ips, o.keyIPsLocked(k)...)
		}
		if len(ips) == 0 {
			continue // its IPs moved (its data path is down): nothing to answer for
		}
		slices.SortFunc(ips, netip.Addr.Compare)
		want[n] = proxied{ips: slices.Compact(ips), macs: o.macs[n]}
	}
	total := 0
	for n, p := range want {
		total += len(p.ips)
		if cur, ok := o.proxies[n]; ok && slices.Equal(cur.ips, p.ips) && macsEqual(cur.macs, p.macs) {
			continue
		}
		o.ann.SetProxy("held/"+n, p.ips, p.macs)
		o.log.Info("answering for a held node with its MAC", "node", n, "ips", p.ips, "macs", fmt.Sprint(p.macs))
	}
	for n := range o.proxies {
		if _, ok := want[n]; !ok {
			o.ann.DeleteProxy("held/" + n)
			o.log.Info("no longer answering for node", "node", n)
		}
	}
	o.proxies = want
	o.metrics.proxied.Set(float64(total))
}

func macsEqual(a, b map[string]net.HardwareAddr) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || v.String() != w.String() {
			return false
		}
	}
	return true
}

// SetSpeaker records a member's liveness. A member gone can no longer delete
// its own ServiceL2Status records, which owners leave to live members
// (PlanStatus): this node's Services get their status synced again, so that
// a leftover of the gone member is deleted now rather than at the next
// reconcile.
func (o *owners) SetSpeaker(node string, s ownership.Speaker, now time.Time) {
	o.do(func(sc *scope) []ownership.Change {
		o.proxyDirty = true
		changes := o.eng.SetSpeaker(node, s, now)
		if s == ownership.SpeakerGone && node != o.self {
			for _, key := range o.eng.Owned(o.self) {
				for svc := range o.byKey[key] {
					o.status(svc)
				}
			}
		}
		return changes
	})
}

// Vote records a watcher's finding on a node's data path (evidence.go in
// internal/ownership: it counts only from the node's watchers). For this
// node's own findings, iface and mac are what the node's kernel answered
// with, whatever the vote (its kube-proxy may not have proven healthy yet):
// what a deputy answers with, and where a connection through it is tried.
func (o *owners) Vote(v ownership.Vote, iface string, mac net.HardwareAddr) ownership.VoteResult {
	var res ownership.VoteResult
	o.do(func(sc *scope) []ownership.Change {
		if iface != "" && len(mac) == 6 && o.macs[v.Node][iface].String() != mac.String() {
			// A new map, not an update in place: the proxy entries applied
			// keep the old one, to see that the MACs changed.
			m := maps.Clone(o.macs[v.Node])
			if m == nil {
				m = map[string]net.HardwareAddr{}
			}
			m[iface] = mac
			o.macs[v.Node] = m
		}
		o.proxyDirty = true
		var changes []ownership.Change
		changes, res = o.eng.Vote(v, time.Now())
		return changes
	})
	return res
}

// KeepsStatus returns, for PlanStatus, whether a node's ServiceL2Status
// record of svc is left to that node: it will delete it itself when it
// stops announcing (its speaker is a live member and its data path is not
// down: a node whose kernel went silent is dead or cut off, whatever
// memberlist has not yet noticed), or it owns another slot of svc and
// announces it.
func (o *owners) KeepsStatus(svc string) func(node string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	var slotOwners []string
	if e := o.services[svc]; e != nil && len(e.slots) > 1 {
		for _, s := range e.slots {
			if ow, serving := o.eng.Owner(s.Key); serving && ow != o.self {
				slotOwners = append(slotOwners, ow)
			}
		}
	}
	return func(node string) bool {
		if slices.Contains(slotOwners, node) {
			return true
		}
		o.mu.Lock()
		defer o.mu.Unlock()
		sp, path := o.eng.Speaker(node)
		return sp != ownership.SpeakerGone && path != ownership.PathDown
	}
}

// ProbeTarget returns an IP and TCP port of a Service that node owns, to try
// a connection through node (delivery.go): the first that the map order
// yields, which Go randomizes, so successive calls sample node's Services.
func (o *owners) ProbeTarget(node string) (netip.AddrPort, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out netip.AddrPort
	o.eng.AnyOwned(node, func(key string) bool {
		for svc := range o.byKey[key] {
			if e := o.services[svc]; e != nil && e.in.Reason == "" && e.in.TCPPort != 0 {
				out = netip.AddrPortFrom(netip.MustParseAddr(key), e.in.TCPPort)
				return true
			}
		}
		return false
	})
	return out, out.IsValid()
}

// ControlMAC returns the MAC, on this node's interface iface, of a node other
// than node and this one whose data path is up: a connection to a Service
// through it tells a broken Service from a node that does not deliver it.
func (o *owners) ControlMAC(node, iface string) (net.HardwareAddr, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for n, m := range o.macs {
		if n == node || n == o.self {
			continue
		}
		if _, p := o.eng.Speaker(n); p == ownership.PathUp && len(m[iface]) == 6 {
			return m[iface], true
		}
	}
	return nil, false
}

// SetTrusted says whether this speaker trusts its own view (health: carrier,
// stalls); while it does not, it learns but decides nothing.
func (o *owners) SetTrusted(ok bool) {
	o.do(func(sc *scope) []ownership.Change { return o.eng.SetTrusted(ok) })
}

// SetSpeakerNodes tells ownership which nodes run a speaker Pod.
func (o *owners) SetSpeakerNodes(nodes []string) {
	o.do(func(sc *scope) []ownership.Change { return o.eng.SetSpeakerNodes(nodes) })
}

// Forget removes a node whose Node object was deleted from the membership
// the quorum counts.
func (o *owners) Forget(node string) {
	o.do(func(sc *scope) []ownership.Change { return o.eng.Forget(node) })
}

// VotesBy returns the votes watcher cast that this replica holds.
func (o *owners) VotesBy(watcher string) []ownership.Vote {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.eng.VotesBy(watcher)
}

// Tick advances the clock (hold expiry) and refreshes the gauges.
func (o *owners) Tick(now time.Time) {
	o.do(func(sc *scope) []ownership.Change {
		changes := o.eng.Tick(now)
		every := o.rebalanceEvery
		if now.Before(o.rebalanceUntil) {
			every = rebalanceBurstEvery
		}
		if every > 0 && now.Sub(o.lastRebalance) >= every {
			o.lastRebalance = now
			changes = append(changes, o.eng.Rebalance(1, o.drainingLocked)...)
		}
		if now.Sub(o.lastSpread) >= spreadEvery {
			o.lastSpread = now
			changes = append(changes, o.eng.Spread(1, o.drainingLocked)...)
		}
		if len(changes) > 0 {
			o.proxyDirty = true
		}
		o.updateGaugesLocked()
		expired := false
		for key, d := range o.drains {
			if !now.Before(d.until) {
				delete(o.drains, key)
				expired = true
			}
		}
		if expired {
			o.handDrainsLocked()
		}
		for key, until := range o.handovers {
			if !now.Before(until) {
				o.ann.DeleteProxy(handoverName(key))
				delete(o.handovers, key)
			}
		}
		if now.Sub(o.lastSweep) >= setSweepEvery {
			o.sweepSetsLocked()
			o.lastSweep = now
		}
		return changes
	})
}

// setSweepEvery paces dropping interned node sets no key uses any more
// (endpoint and node changes make new ones all the time).
const setSweepEvery = time.Minute

func (o *owners) sweepSetsLocked() {
	used := make(map[*ownership.NodeSet]bool, len(o.byKey))
	for k := range o.byKey {
		if s := o.eng.Eligible(k); s != nil {
			used[s] = true
		}
	}
	for _, e := range o.services {
		used[e.eligible] = true
	}
	o.sets.Sweep(func(s *ownership.NodeSet) bool { return used[s] })
}

func (o *owners) updateGaugesLocked() {
	lo, hi, held := -1, 0, 0
	for _, n := range o.eng.Nodes() {
		if o.eng.Held(n) {
			held++
		}
		if s, p := o.eng.Speaker(n); s == ownership.SpeakerGone || p == ownership.PathDown {
			continue
		}
		l := o.eng.Load(n)
		hi = max(hi, l)
		if lo < 0 || l < lo {
			lo = l
		}
	}
	total, _ := o.eng.Members()
	o.metrics.quorum.Set(boolGauge(o.eng.Quorum()))
	o.metrics.acting.Set(boolGauge(o.eng.Acting()))
	o.metrics.knownMembers.Set(float64(total))
	drops := o.eng.Drops()
	for _, d := range ownership.AllDrops() {
		if n := drops[d] - o.dropsSeen[d]; n > 0 {
			o.metrics.dropped.WithLabelValues(d.String()).Add(float64(n))
		}
	}
	o.dropsSeen = drops
	o.metrics.ownedMax.Set(float64(hi))
	o.metrics.ownedMin.Set(float64(max(lo, 0)))
	o.metrics.heldNodes.Set(float64(held))
}

// Merge folds claims from a peer.
func (o *owners) Merge(claims []ownership.Claim) {
	if len(claims) == 0 {
		return
	}
	o.do(func(sc *scope) []ownership.Change {
		o.proxyDirty = true
		return o.eng.Merge(claims)
	})
}

// Claims returns the replica's claims.
func (o *owners) Claims() []ownership.Claim {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.eng.Claims()
}

// State returns the replica's claims and votes, for push/pull.
func (o *owners) State() ([]ownership.Claim, []ownership.Vote) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.eng.Claims(), o.eng.AllVotes()
}

// MergeVotes records votes received from peers, returning how many were
// dropped by reason.
func (o *owners) MergeVotes(votes []ownership.Vote) map[ownership.VoteResult]int {
	out := map[ownership.VoteResult]int{}
	if len(votes) == 0 {
		return out
	}
	now := time.Now()
	o.do(func(sc *scope) []ownership.Change {
		o.proxyDirty = true
		var changes []ownership.Change
		for _, v := range votes {
			c, res := o.eng.Vote(v, now)
			changes = append(changes, c...)
			out[res]++
		}
		return changes
	})
	return out
}

// Seed is what one ServiceL2Status record shows: the node announcing a
// Service and, when the record says (v1beta1.ServiceL2StatusIPsAnnotation),
// which of its IPs.
type Seed struct {
	Node string
	IPs  []netip.Addr
}

// seedClaims turns a Service's records into epoch-0 claims of its slots: a
// slot goes to the record listing its key; a Service with one slot goes to
// its first record also when the record lists no IPs (MetalLB's, or one
// written before the annotation).
func seedClaims(slots []Slot, seeds []Seed) []ownership.Claim {
	var out []ownership.Claim
	for _, s := range slots {
		key, _ := netip.ParseAddr(s.Key)
		i := slices.IndexFunc(seeds, func(sd Seed) bool { return slices.Contains(sd.IPs, key) })
		if i < 0 && len(slots) == 1 && len(seeds) > 0 {
			i = 0
		}
		if i >= 0 {
			out = append(out, ownership.Claim{Key: s.Key, Owner: seeds[i].Node})
		}
	}
	return out
}

// Sync starts deciding. seeds are the owners ServiceL2Status records show,
// by Service (seedClaims); they become epoch-0 claims, so any claim learned
// from a peer wins over them.
func (o *owners) Sync(now time.Time, seeds map[string][]Seed) {
	seeded := map[string]string{} // key -> owner its record names
	o.do(func(sc *scope) []ownership.Change {
		var claims []ownership.Claim
		for svc, sds := range seeds {
			if e := o.services[svc]; e != nil {
				for _, c := range seedClaims(e.slots, sds) {
					claims = append(claims, c)
					seeded[c.Key] = c.Owner
				}
			}
		}
		changes := o.eng.Merge(claims)
		return append(changes, o.eng.SetSynced(now)...)
	})
	// The keys this node owned before and still owns changed nothing: start
	// announcing them too, without events when the ServiceL2Status already
	// named this node (a restart resumes; nothing was assigned). A key a peer
	// placed here before this speaker synced (learned, not a transition of
	// its own) is a new assignment all the same: its event is due.
	o.do(func(sc *scope) []ownership.Change {
		for _, e := range o.services {
			for _, k := range e.slotKeys() {
				if c, ok := o.eng.Claim(k); ok && c.Owner == o.self && seeded[k] != o.self {
					sc.assigned[k] = true
				}
			}
		}
		for svc := range o.services {
			o.refreshServiceLocked(sc, svc)
		}
		o.proxyDirty = true
		o.started = true
		return nil
	})
}

// Synced reports whether Sync was called.
func (o *owners) Synced() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.eng.Synced()
}

// Known reports whether the speaker has seen Service svc.
func (o *owners) Known(svc string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	_, ok := o.services[svc]
	return ok
}

// Interested reports whether this node needs a verdict on node's data path.
func (o *owners) Interested(node string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.eng.Synced() && o.eng.Interested(node)
}

// Want is what this node does for svc, for the status writer.
func (o *owners) Want(svc string) Want {
	o.mu.Lock()
	defer o.mu.Unlock()
	a, ok := o.announced[svc]
	if !ok {
		return Want{}
	}
	return Want{Announce: true, AllInterfaces: a.interfaces == nil, Interfaces: a.interfaces, IPs: a.ips}
}

// AnnouncingIP returns the Services this node announces that use ip.
func (o *owners) AnnouncingIP(ip netip.Addr) []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []string
	for svc, a := range o.announced {
		if slices.Contains(a.ips, ip) {
			out = append(out, svc)
		}
	}
	slices.Sort(out)
	return out
}

// Stop forgets the announced metrics (a stopped speaker announces nothing).
func (o *owners) Stop() {
	o.mu.Lock()
	defer o.mu.Unlock()
	for svc, a := range o.announced {
		o.setAnnouncedMetric(svc, a.ips, nil)
	}
}

// ServiceKeys returns every Service the speaker knows.
func (o *owners) ServiceKeys() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := make([]string, 0, len(o.services))
	for s := range o.services {
		out = append(out, s)
	}
	return out
}
