package layer2

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/mdlayher/ndp"
	"github.com/prometheus/client_golang/prometheus"
)

// Options configure an Announcer. The zero value of every field is a sensible
// default.
type Options struct {
	// NodeName is this node's name, for logs.
	NodeName string
	// ExcludeInterfaces are interface name patterns never announced on. nil
	// means DefaultExcludeInterfaces; an empty non-nil slice excludes nothing.
	ExcludeInterfaces []*regexp.Regexp
	// GratuitousCount is the number of gratuitous bursts sent when an IP is
	// taken over (default 5; negative: none). The first goes out at once.
	GratuitousCount int
	// GratuitousInterval separates the bursts (default 1.1 s: longer than the
	// 1 s locktime during which old kernels ignore ARP updates, so a burst
	// landing inside it is followed by one after it).
	GratuitousInterval time.Duration
	// RefreshInterval, when positive, repeats one gratuitous burst this often
	// while an IP is owned (for switches with a short FDB ageing time).
	RefreshInterval time.Duration
	// RescanInterval is the periodic interface rescan, a safety net behind the
	// netlink subscription (default 30 s).
	RescanInterval time.Duration
	// ConflictGrace: a foreign claim is reported only if it persists
	// (default 3 s; negative: report at once). The first sighting starts
	// the grace; when it ends one probe re-checks, and a claim seen again
	// after it (the other host answering the probe, or announcing again) is
	// reported. During a normal handover the old and the new owner overlap
	// for a moment, each speaker processing the membership change at a
	// slightly different time, and the old one falls silent within the
	// grace; a real conflict or split brain does not.
	ConflictGrace time.Duration
	// ConflictInterval rate-limits conflict reports and defensive
	// announcements per IP (default 10 s, RFC 5227's DEFEND_INTERVAL).
	ConflictInterval time.Duration
	// Registerer receives the metrics; nil registers nothing.
	Registerer prometheus.Registerer
	// OnLinksChanged, if set, is called from Run's goroutine after every
	// interface rescan in which a link appeared, disappeared, or changed
	// its Up, Carrier or Prefixes; Links then returns the new list. It must
	// not block.
	OnLinksChanged func()

	// Links lists the node's interfaces (default: netlink). Test seam.
	Links func() ([]Link, error)
	// WatchLinks calls changed whenever interfaces or addresses may have
	// changed, until ctx ends. Default: netlink subscriptions when Links is
	// the default, none otherwise. Test seam.
	WatchLinks func(ctx context.Context, changed func())
	// ListenARP opens the raw Ethernet socket for ARP frames on a link
	// (default: AF_PACKET, kernel-filtered). Test seam.
	ListenARP func(Link) (net.PacketConn, error)
	// ListenNDP opens the raw Ethernet socket for IPv6 Neighbor Discovery
	// frames on a link and the handle used to join multicast groups
	// (default: AF_PACKET plus an mdlayher/ndp socket). Test seam.
	ListenNDP func(Link) (net.PacketConn, MulticastGroups, error)

	// userSpaceFilterOnly keeps the generic ARP socket filter instead of the
	// owned-IP one, to measure the user-space fast path alone.
	userSpaceFilterOnly bool
}

func (o *Options) defaults() {
	if o.ExcludeInterfaces == nil {
		o.ExcludeInterfaces, _ = CompileExcludes(DefaultExcludeInterfaces)
	}
	if o.GratuitousCount == 0 {
		o.GratuitousCount = 5
	}
	if o.GratuitousInterval <= 0 {
		o.GratuitousInterval = 1100 * time.Millisecond
	}
	if o.RescanInterval <= 0 {
		o.RescanInterval = 30 * time.Second
	}
	if o.ConflictGrace == 0 {
		o.ConflictGrace = 3 * time.Second
	}
	if o.ConflictInterval <= 0 {
		o.ConflictInterval = 10 * time.Second
	}
	if o.Links == nil {
		o.Links = netlinkLinks
	}
	if o.ListenARP == nil {
		o.ListenARP = listenARP
	}
	if o.ListenNDP == nil {
		o.ListenNDP = listenNDP
	}
}

// Announcer answers ARP and NDP for the IPs of the balancers it is given, on
// every eligible interface (or the ones a balancer names).
type Announcer struct {
	log       logr.Logger
	opts      Options
	metrics   *metrics
	conflicts chan Conflict
	rescanCh  chan struct{}
	garpCh    chan struct{}
	defendCh  chan burstKey
	recheckCh chan recheck
	yieldCh   chan yielded
	localMACs atomic.Pointer[map[[6]byte]struct{}]
	// holdUntil (UnixNano; 0: none) is the end of a Hold: until then no
	// request is answered and no announcement is sent.
	holdUntil atomic.Int64

	mu         sync.Mutex
	started    bool
	links      []Link // as last scanned, sorted by name
	balancers  map[string]balancer
	ips        map[netip.Addr]*ipState
	refs       map[netip.Addr]map[string]struct{} // IP -> balancers using it
	ipMetrics  map[netip.Addr]*ipMetrics
	responders map[string]*responder // by interface name
	bursts     map[burstKey]*burst
	rechecks   map[burstKey]time.Time             // probes due after a conflict grace
	proxies    map[string]proxy                   // see proxy.go
	proxyRefs  map[netip.Addr]map[string]struct{} // IP -> proxy entries naming it

	cmu          sync.Mutex
	lastConflict map[netip.Addr]time.Time // last report, for the rate limit
	firstSeen    map[netip.Addr]time.Time // claims within their grace
}

type balancer struct {
	ips        []netip.Addr
	interfaces []string
}

// ipState is one owned IP: where it may be announced and its shared
// per-frame state.
type ipState struct {
	all        bool
	interfaces map[string]bool
	owned      *ownedIP
}

// NewAnnouncer returns an Announcer; nothing is sent before Run.
func NewAnnouncer(log logr.Logger, opts Options) *Announcer {
	defaultWatch := opts.Links == nil && opts.WatchLinks == nil
	opts.defaults()
	a := &Announcer{
		log:          log,
		opts:         opts,
		metrics:      newMetrics(opts.Registerer),
		conflicts:    make(chan Conflict, 64),
		rescanCh:     make(chan struct{}, 1),
		garpCh:       make(chan struct{}, 1),
		defendCh:     make(chan burstKey, 64),
		recheckCh:    make(chan recheck, 64),
		yieldCh:      make(chan yielded, 256),
		balancers:    map[string]balancer{},
		ips:          map[netip.Addr]*ipState{},
		refs:         map[netip.Addr]map[string]struct{}{},
		ipMetrics:    map[netip.Addr]*ipMetrics{},
		responders:   map[string]*responder{},
		bursts:       map[burstKey]*burst{},
		rechecks:     map[burstKey]time.Time{},
		proxies:      map[string]proxy{},
		proxyRefs:    map[netip.Addr]map[string]struct{}{},
		lastConflict: map[netip.Addr]time.Time{},
		firstSeen:    map[netip.Addr]time.Time{},
	}
	if defaultWatch {
		a.opts.WatchLinks = func(ctx context.Context, changed func()) { watchNetlink(ctx, log, changed) }
	}
	empty := map[[6]byte]struct{}{}
	a.localMACs.Store(&empty)
	return a
}

// Hold makes the announcer answer no ARP/NDP request and send no
// announcement until `until`, for every IP it answers for; the zero time ends
// a hold at once. The sets, the conflict watch and the scheduled
// announcements are kept: once the hold ends, the IPs still owned are
// answered and their pending announcements go out.
//
// A node whose link comes back after an outage holds until it has learned
// from its peers which of its IPs moved meanwhile: answering or announcing
// before would send clients back to it for IPs another node now serves.
func (a *Announcer) Hold(until time.Time) {
	var n int64
	if !until.IsZero() {
		n = until.UnixNano()
	}
	a.holdUntil.Store(n)
	a.kickGARP()
}

// held reports whether a Hold is in effect; it reads the clock only while
// one was set (it runs for every request answered).
func (a *Announcer) held() bool {
	u := a.holdUntil.Load()
	return u != 0 && time.Now().UnixNano() < u
}

// BalancerUpdate is one balancer's new IPs and the interfaces to answer on
// (empty: all eligible), or its removal (Delete).
type BalancerUpdate struct {
	Name       string
	IPs        []netip.Addr
	Interfaces []string
	Delete     bool
}

// Apply makes several balancer changes as one: every responder's set is
// swapped and its kernel filter rebuilt once, and the announcements of all
// newly owned IPs are scheduled together. A node taking over hundreds of
// Services at once (a dead owner's) thus answers for all of them after one
// update instead of one per Service, the last no later than the first.
func (a *Announcer) Apply(updates []BalancerUpdate) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var affected []netip.Addr
	for _, u := range updates {
		old, had := a.balancers[u.Name]
		if u.Delete {
			if !had {
				continue
			}
			delete(a.balancers, u.Name)
			affected = a.changeLocked(affected, u.Name, old.ips, nil)
			continue
		}
		b := balancer{interfaces: slices.Clone(u.Interfaces)}
		for _, ip := range u.IPs {
			ip = ip.Unmap().WithZone("")
			if ip.IsValid() && !slices.Contains(b.ips, ip) {
				b.ips = append(b.ips, ip)
			}
		}
		a.balancers[u.Name] = b
		affected = a.changeLocked(affected, u.Name, old.ips, b.ips)
	}
	if len(affected) == 0 {
		return
	}
	slices.SortFunc(affected, netip.Addr.Compare)
	affected = slices.Compact(affected)
	for _, ip := range affected {
		a.recomputeLocked(ip)
	}
	a.pushLocked(affected)
}

// Interfaces returns the names of the interfaces that currently have a
// responder, sorted. The speaker uses it to warn when an L2Advertisement
// names interfaces this node does not have.
func (a *Announcer) Interfaces() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]string, 0, len(a.responders))
	for n := range a.responders {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Links returns the interfaces as last scanned, sorted by name (nil before
// Run's first scan). The MAC and Prefixes slices are shared: do not modify
// them.
func (a *Announcer) Links() []Link {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.links)
}

// changeLocked updates the reverse index for balancer name moving from
// oldIPs to newIPs and appends the IPs whose state that may change to
// affected. The cost is proportional to the change, not to the number of IPs
// owned.
func (a *Announcer) changeLocked(affected []netip.Addr, name string, oldIPs, newIPs []netip.Addr) []netip.Addr {
	affected = append(affected, oldIPs...)
	for _, ip := range oldIPs {
		delete(a.refs[ip], name)
	}
	for _, ip := range newIPs {
		if a.refs[ip] == nil {
			a.refs[ip] = map[string]struct{}{}
		}
		a.refs[ip][name] = struct{}{}
		affected = append(affected, ip)
	}
	return affected
}

// recomputeLocked derives ip's state (where it is answered) from the
// balancers that own it, or forgets it when none does.
func (a *Announcer) recomputeLocked(ip netip.Addr) {
	if len(a.refs[ip]) == 0 {
		delete(a.refs, ip)
		delete(a.ips, ip)
		return
	}
	st := &ipState{interfaces: map[string]bool{}}
	if old := a.ips[ip]; old != nil {
		st.owned = old.owned
	} else {
		st.owned = &ownedIP{addr: ip, m: a.metricsFor(ip)}
	}
	for n := range a.refs[ip] {
		b := a.balancers[n]
		if len(b.interfaces) == 0 {
			st.all = true
		}
		for _, i := range b.interfaces {
			st.interfaces[i] = true
		}
	}
	a.ips[ip] = st
}

// pushLocked brings every responder in step for the affected IPs and forgets
// the conflict history of those no longer answered at all.
func (a *Announcer) pushLocked(affected []netip.Addr) {
	for _, r := range a.responders {
		a.updateResponderLocked(r, affected)
	}
	a.cmu.Lock()
	for _, ip := range affected {
		if a.ips[ip] == nil && a.proxyRefs[ip] == nil {
			delete(a.lastConflict, ip)
			delete(a.firstSeen, ip)
		}
	}
	a.cmu.Unlock()
	// A takeover's first burst goes out now, from the caller, before it
	// returns to its logs, gossip, events and status writes: handed to
	// garpLoop it would wait for that goroutine to be scheduled, which on a
	// node short of CPU can take far longer than the burst itself
	// (docs/benchmarks-e2e.md, the 5,000-Service failover runs).
	a.sendDueLocked(time.Now())
	a.kickGARP() // garpLoop re-arms its timer for the later bursts
}

func (a *Announcer) metricsFor(ip netip.Addr) *ipMetrics {
	m := a.ipMetrics[ip]
	if m == nil {
		m = a.metrics.forIP(ip)
		a.ipMetrics[ip] = m
	}
	return m
}

// updateResponderLocked brings r's set in step for the affected IPs (nil:
// all, for a new responder): it schedules announcements for IPs r newly owns
// (not for proxied ones), cancels them for IPs it lost or now only proxies,
// keeps solicited-node group memberships in step, and swaps the new set in
// atomically.
func (a *Announcer) updateResponderLocked(r *responder, affected []netip.Addr) {
	old := r.owned.Load()
	if affected == nil {
		for ip := range a.ips {
			affected = append(affected, ip)
		}
		for ip := range a.proxyRefs {
			if a.ips[ip] == nil {
				affected = append(affected, ip)
			}
		}
	}
	var ed *setEditor
	var added, removed, announce, silenced []netip.Addr
	for _, ip := range affected {
		want, cur := a.entryLocked(r, ip), old.get(ip)
		if sameEntry(cur, want) {
			continue
		}
		if ed == nil {
			ed = editSet(old)
		}
		switch {
		case want == nil:
			ed.remove(ip)
			removed = append(removed, ip)
		case cur == nil:
			ed.add(want)
			added = append(added, ip)
		default:
			ed.add(want) // replaces: owned <-> proxied, or another proxied MAC
		}
		switch {
		case want == nil || want.proxied:
			silenced = append(silenced, ip)
		case cur == nil || cur.proxied:
			announce = append(announce, ip)
		}
	}
	if ed == nil {
		if old == nil {
			r.owned.Store(newOwnedSet())
			r.updateKernelFilter()
		}
		return
	}
	set := ed.s
	// Join groups before answering so multicast solicitations arrive; the
	// swap is what starts and stops answers.
	for _, ip := range added {
		if ip.Is6() {
			a.joinLocked(r, ip)
		}
	}
	r.owned.Store(set)
	if old == nil || slices.ContainsFunc(added, netip.Addr.Is4) || slices.ContainsFunc(removed, netip.Addr.Is4) {
		r.updateKernelFilter()
	}
	now := time.Now()
	for _, ip := range announce {
		a.scheduleLocked(burstKey{ip, r.link.Name}, now, ip.Is4())
	}
	for _, ip := range silenced {
		delete(a.bursts, burstKey{ip, r.link.Name})
		delete(a.rechecks, burstKey{ip, r.link.Name})
	}
	for _, ip := range removed {
		if ip.Is6() {
			a.leaveLocked(r, ip)
		}
	}
}

func (a *Announcer) joinLocked(r *responder, ip netip.Addr) {
	g := solicitedNodeGroup(ip)
	r.groups[g]++
	if r.groups[g] == 1 {
		if err := r.group.JoinGroup(g); err != nil {
			a.log.Error(err, "joining solicited-node multicast group failed", "interface", r.link.Name, "ip", ip.String(), "group", g.String())
		}
	}
}

func (a *Announcer) leaveLocked(r *responder, ip netip.Addr) {
	g := solicitedNodeGroup(ip)
	if r.groups[g] == 0 {
		return
	}
	r.groups[g]--
	if r.groups[g] == 0 {
		delete(r.groups, g)
		if err := r.group.LeaveGroup(g); err != nil {
			a.log.Error(err, "leaving solicited-node multicast group failed", "interface", r.link.Name, "ip", ip.String(), "group", g.String())
		}
	}
}

func (a *Announcer) kickRescan() {
	select {
	case a.rescanCh <- struct{}{}:
	default:
	}
}

// Run opens responders on the eligible interfaces, follows interface
// changes, and sends the gratuitous announcements, until ctx ends; then it
// closes every responder. It returns nil after ctx ends.
func (a *Announcer) Run(ctx context.Context) error {
	a.mu.Lock()
	if a.started {
		a.mu.Unlock()
		return errors.New("layer2: Announcer.Run called twice")
	}
	a.started = true
	a.mu.Unlock()

	var wg sync.WaitGroup
	defer func() {
		wg.Wait()
		a.mu.Lock()
		for name, r := range a.responders {
			r.close()
			delete(a.responders, name)
		}
		a.mu.Unlock()
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		a.garpLoop(ctx)
	}()
	if a.opts.WatchLinks != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a.opts.WatchLinks(ctx, a.kickRescan)
		}()
	}
	a.log.Info("layer2 announcer starting", "node", a.opts.NodeName)
	a.rescan()
	t := time.NewTicker(a.opts.RescanInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-a.rescanCh:
			a.rescan()
		case y := <-a.yieldCh:
			a.endHandover(y)
		case <-t.C:
			a.rescan()
		}
	}
}

// rescan lists the interfaces and opens, replaces or closes responders to
// match.
func (a *Announcer) rescan() {
	links, err := a.opts.Links()
	if err != nil {
		a.log.Error(err, "listing interfaces failed; keeping the current responders")
		return
	}
	macs := map[[6]byte]struct{}{}
	for _, l := range links {
		if len(l.MAC) == 6 {
			macs[[6]byte(l.MAC)] = struct{}{}
		}
	}
	a.localMACs.Store(&macs)
	links = slices.Clone(links)
	slices.SortFunc(links, func(x, y Link) int { return strings.Compare(x.Name, y.Name) })

	a.mu.Lock()
	changed := linksChanged(a.links, links)
	a.links = links
	a.syncRespondersLocked(links)
	a.mu.Unlock()
	if changed && a.opts.OnLinksChanged != nil {
		a.opts.OnLinksChanged()
	}
}

// syncRespondersLocked opens, replaces or closes responders to match links.
func (a *Announcer) syncRespondersLocked(links []Link) {
	present := map[string]bool{}
	for _, l := range links {
		present[l.Name] = true
		wantARP, wantNDP, reason := eligibility(l, a.opts.ExcludeInterfaces)
		cur := a.responders[l.Name]
		if cur != nil && cur.link.Index == l.Index && slices.Equal(cur.link.MAC, l.MAC) &&
			cur.link.LinkLocal == l.LinkLocal && (cur.arp != nil) == wantARP && (cur.ndp != nil) == wantNDP {
			continue
		}
		if cur != nil {
			a.closeResponderLocked(cur, "interface changed")
		}
		if !wantARP && !wantNDP {
			if cur != nil {
				a.log.V(1).Info("interface not eligible", "interface", l.Name, "reason", reason)
			}
			continue
		}
		r, err := a.openResponder(l, wantARP, wantNDP)
		if err != nil {
			a.log.Error(err, "creating responder failed", "interface", l.Name)
			continue
		}
		a.responders[l.Name] = r
		a.updateResponderLocked(r, nil)
		r.start()
		a.log.Info("created responder", "interface", l.Name, "mac", l.MAC.String(), "arp", wantARP, "ndp", wantNDP)
	}
	for name, r := range a.responders {
		if !present[name] {
			a.closeResponderLocked(r, "interface removed")
		}
	}
	a.kickGARP()
}

func (a *Announcer) closeResponderLocked(r *responder, why string) {
	r.close()
	delete(a.responders, r.link.Name)
	for k := range a.bursts {
		if k.iface == r.link.Name {
			delete(a.bursts, k)
		}
	}
	for k := range a.rechecks {
		if k.iface == r.link.Name {
			delete(a.rechecks, k)
		}
	}
	a.log.Info("deleted responder", "interface", r.link.Name, "reason", why)
}

func (a *Announcer) openResponder(l Link, wantARP, wantNDP bool) (*responder, error) {
	r := &responder{
		log:    a.log.WithValues("interface", l.Name),
		link:   l,
		mac:    [6]byte(l.MAC),
		groups: map[netip.Addr]int{},
		isLocal: func(m [6]byte) bool {
			_, ok := (*a.localMACs.Load())[m]
			return ok
		},
		conflict:            a.onConflict,
		held:                a.held,
		noKernelOwnedFilter: a.opts.userSpaceFilterOnly,
	}
	if wantARP {
		c, err := a.opts.ListenARP(l)
		if err != nil {
			return nil, err
		}
		r.arp = c
	}
	if wantNDP {
		c, g, err := a.opts.ListenNDP(l)
		if err != nil {
			if r.arp != nil {
				_ = r.arp.Close()
			}
			return nil, err
		}
		r.ndp, r.group = c, g
	}
	return r, nil
}

// solicitedNodeGroup is the solicited-node multicast group of an IPv6
// address (ff02::1:ffXX:XXXX).
func solicitedNodeGroup(ip netip.Addr) netip.Addr {
	g, _ := ndp.SolicitedNodeMulticast(ip) // ip is IPv6 here: no error
	return g
}
