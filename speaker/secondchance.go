package speaker

import (
	"context"
	"maps"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/ironlb/ironlb/internal/secondchance"
	"github.com/ironlb/ironlb/internal/statusview"
)

// DefaultDrainTimeout is how long, after an IP moved here from a node that
// still delivers, the TCP flows this node does not know keep going to that
// node (--drain-timeout): long enough for requests in flight and most
// keep-alive connections to end, short enough that a node drained for
// maintenance is free soon.
const DefaultDrainTimeout = 5 * time.Minute

// Drain is one planned move in its drain period: the IPs of a key this node
// took over from a node whose data path was up, and until when the flows
// this node did not see start are handed to that node (secondchance).
type Drain struct {
	Key   string
	From  string
	IPs   []netip.Addr
	Until time.Time
	// MACs are From's MACs by interface as this node's probes saw them
	// (nil: unknown; secondChance then asks the segment).
	MACs map[string]net.HardwareAddr
}

// secondChance is the data path of planned moves: it owns the second-chance
// nftables tables of this node's interfaces and makes them forward what the
// ownership layer's drains say. The ownership layer hands it a value (Set),
// which is programmed at once with the MACs already known, before the new
// owner answers for the IPs; a previous owner whose MAC is unknown is asked
// on the segment by run, off the ownership lock, and programmed then.
type secondChance struct {
	log logr.Logger
	// resolve asks the segment for a node's MACs when the drain does not
	// carry them. It is all secondChance calls: the drains are a value, so
	// it never calls back into the ownership layer, which holds its lock
	// while it calls Set.
	resolve func(ctx context.Context, node string) map[string]net.HardwareAddr
	metrics *metrics
	kick    chan struct{}

	// mu guards everything below: Set and run both program the tables.
	mu       sync.Mutex
	want     []Drain
	tables   map[string]*secondchance.Table // by interface
	resolved map[string]map[string]net.HardwareAddr
	reported map[string]bool // drains whose start was logged, by key
}

func newSecondChance(log logr.Logger, m *metrics, resolve func(context.Context, string) map[string]net.HardwareAddr) *secondChance {
	return &secondChance{log: log, metrics: m, resolve: resolve, kick: make(chan struct{}, 1),
		tables: map[string]*secondchance.Table{}, resolved: map[string]map[string]net.HardwareAddr{}, reported: map[string]bool{}}
}

// Set makes the drains in effect and programs them with the MACs known now
// (a few netlink messages); a previous owner whose MAC is unknown is left to
// run. It never waits for the segment.
func (s *secondChance) Set(drains []Drain) {
	s.mu.Lock()
	s.want = drains
	missing := s.applyLocked(time.Now())
	s.mu.Unlock()
	if missing {
		select {
		case s.kick <- struct{}{}:
		default:
		}
	}
}

// statsEvery is how often the tables' counters are read into the metrics
// and expired drains are removed.
const statsEvery = 5 * time.Second

// run resolves the MACs Set did not know and refreshes the tables and their
// metrics until ctx ends, then removes the tables: a speaker that stops
// forwards nothing.
func (s *secondChance) run(ctx context.Context) {
	t := time.NewTicker(statsEvery)
	defer t.Stop()
	defer s.closeAll()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.kick:
		case <-t.C:
		}
		s.mu.Lock()
		var ask []string
		for _, d := range s.want {
			if len(d.MACs) == 0 && len(s.resolved[d.From]) == 0 && !slices.Contains(ask, d.From) {
				ask = append(ask, d.From)
			}
		}
		s.mu.Unlock()
		got := map[string]map[string]net.HardwareAddr{}
		for _, node := range ask {
			if m := s.resolve(ctx, node); len(m) > 0 {
				got[node] = m
			}
		}
		s.mu.Lock()
		maps.Copy(s.resolved, got)
		s.applyLocked(time.Now())
		s.mu.Unlock()
	}
}

// applyLocked makes every interface's table forward the drains in effect at
// now, with the MACs known; it reports whether a previous owner's MAC is
// missing.
func (s *secondChance) applyLocked(now time.Time) (missing bool) {
	active := map[string]bool{}
	macsOf := map[string]map[string]net.HardwareAddr{}
	for _, d := range s.want {
		if !now.Before(d.Until) {
			continue
		}
		active[d.Key] = true
		m, ok := macsOf[d.From]
		if !ok {
			if m = d.MACs; len(m) == 0 {
				m = s.resolved[d.From]
			}
			macsOf[d.From] = m
		}
		if len(m) == 0 {
			missing = true
			continue // logged once its MAC is known, or never forwarded
		}
		if !s.reported[d.Key] {
			s.reported[d.Key] = true
			s.log.Info("planned move: forwarding the connections this node did not see start to the previous owner",
				"ips", d.IPs, "from", d.From, "until", d.Until.UTC().Format(time.RFC3339))
		}
	}
	for k := range s.reported {
		if !active[k] {
			delete(s.reported, k)
		}
	}
	if len(active) == 0 {
		clear(s.resolved) // MACs change (a node replaced): asked again at the next drain
	}
	fwds := forwardsOf(s.want, macsOf, now)
	for iface := range s.tables {
		if _, ok := fwds[iface]; !ok {
			fwds[iface] = nil // an interface nothing drains through any more: its table goes
		}
	}
	var stats secondchance.Stats
	for iface, f := range fwds {
		t := s.tables[iface]
		if t == nil {
			if len(f) == 0 {
				continue
			}
			var err error
			if t, err = secondchance.Open(iface); err != nil {
				s.log.Error(err, "planned move: cannot forward connections to the previous owner", "interface", iface)
				continue
			}
			s.tables[iface] = t
		}
		if err := t.Set(f); err != nil {
			s.log.Error(err, "planned move: programming the second-chance table failed", "interface", iface)
			continue
		}
		if len(f) == 0 {
			delete(s.tables, iface)
			continue
		}
		if st, err := t.Stats(); err == nil {
			stats.ForwardedPackets += st.ForwardedPackets
			stats.ForwardedFlows += st.ForwardedFlows
			stats.LocalFlows += st.LocalFlows
		}
	}
	s.metrics.drainIPs.Set(float64(countIPs(s.want, now)))
	s.metrics.drainFlows.Set(float64(stats.ForwardedFlows))
	s.metrics.drainPackets.Set(float64(stats.ForwardedPackets))
	return missing
}

// Drains returns the drains in effect as `ironlb status` shows them, with
// the connections each forwarded within the last 2 minutes, read from the
// kernel now.
func (s *secondChance) Drains() []statusview.Drain {
	s.mu.Lock()
	defer s.mu.Unlock()
	byVIP := map[netip.Addr]int{}
	for _, t := range s.tables {
		if st, err := t.Stats(); err == nil {
			for ip, n := range st.ForwardedByVIP {
				byVIP[ip] += n
			}
		}
	}
	now := time.Now()
	var out []statusview.Drain
	for _, d := range s.want { // sorted by key (owners.handDrainsLocked)
		if !now.Before(d.Until) {
			continue
		}
		v := statusview.Drain{Key: d.Key, From: d.From, Until: d.Until.UTC()}
		for _, ip := range d.IPs {
			v.IPs = append(v.IPs, ip.String())
			v.ForwardedFlows += byVIP[ip]
		}
		out = append(out, v)
	}
	return out
}

func (s *secondChance) closeAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for iface, t := range s.tables {
		if err := t.Close(); err != nil {
			s.log.Error(err, "removing the second-chance table", "interface", iface)
		}
		delete(s.tables, iface)
	}
	s.metrics.drainIPs.Set(0)
	s.metrics.drainFlows.Set(0)
	s.metrics.drainPackets.Set(0)
}

// forwardsOf turns the drains in effect at now into each interface's
// forwards: every IP of a drain goes to its previous owner's MAC on each
// interface where that MAC is known. An IP drained from two nodes at once
// (moved twice within a drain period) goes to the later one's MAC, the one
// whose drain ends last: the middle node forwards what it does not know on.
func forwardsOf(drains []Drain, macs map[string]map[string]net.HardwareAddr, now time.Time) map[string][]secondchance.Forward {
	type pick struct {
		mac   net.HardwareAddr
		until time.Time
	}
	byIface := map[string]map[netip.Addr]pick{}
	for _, d := range drains {
		if !now.Before(d.Until) {
			continue
		}
		for iface, mac := range macs[d.From] {
			if len(mac) != 6 {
				continue
			}
			m := byIface[iface]
			if m == nil {
				m = map[netip.Addr]pick{}
				byIface[iface] = m
			}
			for _, ip := range d.IPs {
				if p, ok := m[ip]; !ok || d.Until.After(p.until) {
					m[ip] = pick{mac: mac, until: d.Until}
				}
			}
		}
	}
	out := make(map[string][]secondchance.Forward, len(byIface))
	for iface, m := range byIface {
		f := make([]secondchance.Forward, 0, len(m))
		for ip, p := range m {
			f = append(f, secondchance.Forward{VIP: ip, OldMAC: p.mac})
		}
		slices.SortFunc(f, func(a, b secondchance.Forward) int { return a.VIP.Compare(b.VIP) })
		out[iface] = f
	}
	return out
}

func countIPs(drains []Drain, now time.Time) int {
	n := 0
	for _, d := range drains {
		if now.Before(d.Until) {
			n += len(d.IPs)
		}
	}
	return n
}
