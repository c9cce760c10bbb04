package speaker

import (
	"cmp"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ironlb/ironlb/internal/election"
	"github.com/ironlb/ironlb/internal/layer2"
	"github.com/ironlb/ironlb/internal/membership"
	"github.com/ironlb/ironlb/internal/ownership"
	"github.com/ironlb/ironlb/internal/statusview"
)

// changeHistory is how many owner changes a speaker keeps for `ironlb
// status` (in memory only, lost on restart: the log has them all).
const changeHistory = 50

// recordChangeLocked keeps ch in the bounded history.
func (o *owners) recordChangeLocked(now time.Time, ch ownership.Change) {
	c := statusview.Change{Time: now, Key: ch.Key, Services: o.servicesOfLocked(ch.Key), From: ch.From, To: ch.To,
		Epoch: ch.Epoch, Reason: string(ch.Reason)}
	if len(o.changes) < changeHistory {
		o.changes = append(o.changes, c)
		return
	}
	// A ring: changeNext is the oldest entry.
	o.changes[o.changeNext] = c
	o.changeNext = (o.changeNext + 1) % changeHistory
}

// serviceView is what owners copies out for one Service of a snapshot.
type serviceView struct {
	name string
	in   Input // without Eligible and Scores: see eligible
	// eligible is the Service's interned eligible nodes with their scores
	// (immutable, shared).
	eligible   *ownership.NodeSet
	owner      string
	epoch      uint64
	serving    bool
	announcing bool
	// keys are the Service's ownership keys, one per address slot; slots
	// each slot's claim, when it has several.
	keys  []string
	slots []slotView
}

// slotView is this replica's claim of one address slot.
type slotView struct {
	slot                Slot
	owner               string
	epoch               uint64
	serving, announcing bool
}

// ownersView is the part of a snapshot the ownership layer holds.
type ownersView struct {
	synced, quorum, acting bool
	known                  int // members the quorum counts
	services               []serviceView
	nodes                  []statusview.Node
	proxies                []statusview.Proxy
	changes                []statusview.Change
}

// view copies out, under the lock, what a snapshot shows of the Services
// f selects. It copies references to the Services' inputs, which are never
// modified in place, and leaves every derived field (election order,
// exclusions) to the caller, outside the lock.
func (o *owners) view(f statusview.Filter) ownersView {
	o.mu.Lock()
	defer o.mu.Unlock()
	v := ownersView{synced: o.eng.Synced(), quorum: o.eng.Quorum(), acting: o.eng.Acting()}
	v.known, _ = o.eng.Members()
	for name, e := range o.services {
		if f.Service != "" && f.Service != name {
			continue
		}
		if f.IP != "" && !slices.ContainsFunc(e.in.IPs, func(ip netip.Addr) bool { return ip.String() == f.IP }) {
			continue
		}
		sv := serviceView{name: name, in: e.in, eligible: e.eligible, keys: e.slotKeys()}
		a, announcing := o.announced[name]
		sv.announcing = announcing
		for _, s := range e.slots {
			slv := slotView{slot: s, announcing: announcing && slices.Contains(a.ips, s.IPs[0])}
			if c, ok := o.eng.Claim(s.Key); ok {
				slv.owner, slv.epoch = c.Owner, c.Epoch
			}
			_, slv.serving = o.eng.Owner(s.Key)
			sv.slots = append(sv.slots, slv)
		}
		if len(sv.slots) > 0 {
			sv.owner, sv.epoch, sv.serving = sv.slots[0].owner, sv.slots[0].epoch, sv.slots[0].serving
		}
		if len(sv.slots) < 2 {
			sv.slots = nil
		}
		v.services = append(v.services, sv)
	}
	for _, n := range o.eng.Nodes() {
		sp, path := o.eng.Speaker(n)
		nd := statusview.Node{Name: n, Speaker: sp.String(), Path: path.String(), Held: o.eng.Held(n), Owned: o.eng.Load(n),
			NotPlaceable: !o.eng.Placeable(n)}
		if since := o.eng.PathSince(n); !since.IsZero() {
			nd.PathSince = since.UTC().Format(time.RFC3339)
		}
		if nd.Held {
			nd.Deputy = o.eng.Deputy(n)
		}
		for w, p := range o.eng.Votes(n) {
			if nd.Votes == nil {
				nd.Votes = map[string]string{}
			}
			nd.Votes[w] = p.String()
		}
		v.nodes = append(v.nodes, nd)
	}
	for n, p := range o.proxies {
		ips := make([]string, 0, len(p.ips))
		for _, ip := range p.ips {
			ips = append(ips, ip.String())
		}
		v.proxies = append(v.proxies, statusview.Proxy{Node: n, IPs: ips})
	}
	v.changes = append(slices.Clone(o.changes[o.changeNext:]), o.changes[:o.changeNext]...)
	return v
}

// statusSource assembles a speaker's snapshot from the parts that hold it.
type statusSource struct {
	self      string
	own       *owners
	ann       announcer
	ml        *membership.List // nil without memberlist
	conflicts *conflicts
	// exclusions returns, by Service, why the configuration leaves out
	// the nodes that may not announce it (the speaker's cache).
	exclusions func(ctx context.Context, services []string) map[string]map[string]string
	// survey asks the segment who answers for an address
	// (layer2.Prober.Survey); nil: the segment is not asked.
	survey func(ctx context.Context, addr netip.Addr, window time.Duration) ([]layer2.SurveyAnswer, layer2.ProbeReason, error)
	// drains returns the planned moves this node drains (secondChance);
	// nil: none (--drain-timeout=0).
	drains func() []statusview.Drain
}

// Segment survey: surveyWindow is how long answers are collected after the
// last probe, surveyParallel how many addresses are asked at once.
const (
	surveyWindow   = 100 * time.Millisecond
	surveyParallel = 32
)

// Snapshot returns what this speaker sees of the Services f selects.
func (s *statusSource) Snapshot(ctx context.Context, f statusview.Filter) statusview.Snapshot {
	v := s.own.view(f)
	snap := statusview.Snapshot{
		SchemaVersion: statusview.SchemaVersion, Node: s.self, Time: time.Now().UTC(), Synced: v.synced,
		Memberlist: s.ml != nil, Nodes: v.nodes, Interfaces: s.ann.Interfaces(), Services: []statusview.Service{},
		Quorum: v.quorum, Acting: v.acting, KnownMembers: v.known,
	}
	if s.ml != nil {
		snap.HealthScore = s.ml.HealthScore()
		for _, m := range s.ml.States() {
			st := statusview.SpeakerAlive
			if m.State == membership.StateSuspect {
				st = statusview.SpeakerSuspect
			}
			snap.Members = append(snap.Members, statusview.Member{Name: m.Name, Addr: m.Addr, State: st, NotAnswering: !metaAnswers(m.Meta)})
		}
	}
	names := make([]string, 0, len(v.services))
	keys := map[string]bool{}
	for _, sv := range v.services {
		names = append(names, sv.name)
		for _, k := range sv.keys {
			keys[k] = true
		}
	}
	var excl map[string]map[string]string
	if s.exclusions != nil {
		excl = s.exclusions(ctx, names)
	}
	for _, sv := range v.services {
		snap.Services = append(snap.Services, s.service(sv, snap.Interfaces, excl[sv.name]))
	}
	slices.SortFunc(snap.Services, func(a, b statusview.Service) int { return strings.Compare(a.Name, b.Name) })
	slices.SortFunc(v.proxies, func(a, b statusview.Proxy) int { return strings.Compare(a.Node, b.Node) })
	snap.Proxies = v.proxies
	for _, c := range v.changes {
		if (f.Service == "" && f.IP == "") || keys[c.Key] {
			snap.Changes = append(snap.Changes, c)
		}
	}
	if s.drains != nil {
		for _, d := range s.drains() {
			if (f.Service == "" && f.IP == "") || keys[d.Key] {
				snap.Drains = append(snap.Drains, d)
			}
		}
	}
	if f.Segment && s.survey != nil {
		s.surveySegment(ctx, &snap)
	}
	return snap
}

// surveySegment asks the segment who answers for each IP this node
// announces (at most statusview.MaxSurvey, in name order) and reports
// another host answering as the Service's Conflict: this node's own
// responder does not answer its own probes, so any answer is someone else,
// another speaker included (the status then exits non-zero even when the
// speakers agree with each other). A held node's deputy answering with the
// held node's MAC does not announce, and is not asked about.
func (s *statusSource) surveySegment(ctx context.Context, snap *statusview.Snapshot) {
	type target struct {
		svc int
		ip  netip.Addr
	}
	var targets []target
	for i, sv := range snap.Services {
		for _, ip := range sv.AnnouncedIPs() {
			if a, err := netip.ParseAddr(ip); err == nil {
				targets = append(targets, target{i, a})
			}
		}
	}
	if n := len(targets) - statusview.MaxSurvey; n > 0 {
		snap.Unsurveyed = n
		targets = targets[:statusview.MaxSurvey]
	}
	snap.Surveyed = len(targets)
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, surveyParallel)
	now := time.Now().UTC()
	for _, tg := range targets {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			answers, _, _ := s.survey(ctx, tg.ip, surveyWindow)
			if len(answers) == 0 {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if snap.Services[tg.svc].Conflict == nil {
				a := answers[0]
				snap.Services[tg.svc].Conflict = &statusview.Conflict{IP: tg.ip.String(), MAC: a.MAC.String(), Interface: a.Interface, Last: now}
			}
		}()
	}
	wg.Wait()
}

// service turns one Service's view into its snapshot entry.
func (s *statusSource) service(sv serviceView, have []string, excluded map[string]string) statusview.Service {
	in := sv.in
	out := statusview.Service{
		Name: sv.name, Pool: in.Pool, Reason: in.Reason, Owner: sv.owner, Epoch: sv.epoch, Serving: sv.serving,
		Announcing: sv.announcing, Excluded: excluded,
	}
	for _, ip := range in.IPs {
		out.IPs = append(out.IPs, ip.String())
	}
	if in.Reason == "" {
		out.Candidates = candidates(in.Key(), sv.eligible)
	}
	for _, s := range sv.slots {
		sl := statusview.Slot{Owner: s.owner, Epoch: s.epoch, Serving: s.serving, Announcing: s.announcing}
		for _, ip := range s.slot.IPs {
			sl.IPs = append(sl.IPs, ip.String())
		}
		if in.Reason == "" {
			sl.Candidates = candidates(s.slot.Key, sv.eligible)
		}
		out.Slots = append(out.Slots, sl)
	}
	if in.Self {
		out.AllInterfaces, out.Interfaces = in.AllInterfaces, in.Interfaces
		// As owners.checkAnnounced: an announcer that lists no interface
		// yet (still scanning) is not taken for one that lacks them.
		out.MissingInterfaces = !in.AllInterfaces && len(have) > 0 &&
			!slices.ContainsFunc(in.Interfaces, func(i string) bool { return slices.Contains(have, i) })
	}
	if c, ok := s.conflicts.get(sv.name); ok {
		out.Conflict = &statusview.Conflict{IP: c.IP.String(), MAC: c.MAC.String(), Interface: c.Interface, Last: c.last.UTC()}
	}
	return out
}

// candidates is the election order of key's eligible nodes: the highest
// preference score first (preferredNodeSelectors), then the key's hash
// order, as the ownership engine places a failed owner's IP.
func candidates(key string, elig *ownership.NodeSet) []string {
	out := election.Rank(key, elig.Names())
	slices.SortStableFunc(out, func(a, b string) int { return cmp.Compare(elig.Score(b), elig.Score(a)) })
	return out
}

// ServeHTTP serves GET statusview.Path?service=ns/name&ip=addr to loopback
// clients: the snapshot names Services, IPs and nodes, which the health
// server's other endpoints do not, so a health server bound to every
// address (--health-probe-host "") does not hand it to the network.
func (s *statusSource) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		http.Error(w, "only GET", http.StatusMethodNotAllowed)
		return
	}
	if !loopback(r.RemoteAddr) {
		http.Error(w, "the status snapshot is served to loopback clients only (run `ironlb status --local` in the speaker's container)", http.StatusForbidden)
		return
	}
	f := statusview.Filter{Service: r.URL.Query().Get("service"), Segment: r.URL.Query().Get("segment") == "1"}
	if ip := r.URL.Query().Get("ip"); ip != "" {
		a, err := netip.ParseAddr(ip)
		if err != nil {
			http.Error(w, "query parameter ip="+ip+": not an IP address", http.StatusBadRequest)
			return
		}
		f.IP = a.Unmap().String()
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(s.Snapshot(ctx, f)) // a client gone mid-answer has nothing to be told
}

func loopback(remote string) bool {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		return false
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.Unmap().IsLoopback()
}
