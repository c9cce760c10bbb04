package layer2

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"time"
)

// proxy is one SetProxy entry: IPs answered on behalf of another host, and
// that host's MAC per interface (only those interfaces answer); or one
// SetHandover entry (own): IPs answered with this node's MAC on the
// interfaces in ifaces (nil: every one).
type proxy struct {
	ips    []netip.Addr
	macs   map[string][6]byte
	own    bool
	ifaces map[string]bool
}

// SetProxy makes this node answer ARP requests / Neighbor Solicitations for
// ips on behalf of another host: on each interface named in macs (and only
// those), replies carry macs[iface] as ARP sender hardware address / NA
// target link-layer address, with this node's MAC as Ethernet source, so
// switches keep learning the other host's MAC from its own port. No
// gratuitous announcements and no RFC 5227 probes are sent for proxied IPs,
// and frames claiming a proxied IP with macs[iface] are not conflicts. An IP
// that is also owned (Apply) is answered as owned (own MAC). Replaces
// any previous proxy entry name. A MAC that is not 6 bytes long is logged
// and its interface skipped.
func (a *Announcer) SetProxy(name string, ips []netip.Addr, macs map[string]net.HardwareAddr) {
	p := proxy{ips: entryIPs(ips, nil), macs: make(map[string][6]byte, len(macs))}
	for iface, mac := range macs {
		if len(mac) != 6 {
			a.log.Error(fmt.Errorf("proxy %s: interface %s: MAC %q is not a 6-byte Ethernet address", name, iface, mac.String()),
				"ignoring the interface for this proxy entry")
			continue
		}
		p.macs[iface] = [6]byte(mac)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	old := a.proxies[name]
	a.proxies[name] = p
	a.applyProxyLocked(name, old.ips, p.ips)
}

// SetHandover makes this node keep answering ARP requests / Neighbor
// Solicitations for ips, with its own MAC, after it gave them to another
// node: the new owner learns of the move by gossip a moment later, and
// until it announces them nobody would answer a client whose neighbour
// entry expired meanwhile. Like a proxied IP, a handed-over IP is never
// announced, probed for or defended, and its advertisements never override;
// the first frame claiming it from another MAC (the new owner's gratuitous
// announcement) ends its hand-over at once and is no conflict. An IP that
// is also owned (Apply) is answered as owned. An IP another host claimed
// within the last ConflictGrace (at least 1 s) is not handed over: the new
// owner announced it already. interfaces are those the IPs were announced
// on (empty: all eligible, as for a balancer). Replaces any previous entry
// name (proxy or hand-over); DeleteProxy removes it.
func (a *Announcer) SetHandover(name string, ips []netip.Addr, interfaces []string) {
	now := time.Now()
	p := proxy{own: true, ips: entryIPs(ips, func(ip netip.Addr) bool { return !a.claimedSince(ip, now) })}
	if len(interfaces) > 0 {
		p.ifaces = map[string]bool{}
		for _, i := range interfaces {
			p.ifaces[i] = true
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	old := a.proxies[name]
	a.proxies[name] = p
	a.applyProxyLocked(name, old.ips, p.ips)
}

// claimedSince reports whether another host claimed ip shortly before now,
// while this node still owned it: the new owner announced it before this
// node gave it away (it decided the same move a moment earlier), and a
// hand-over would answer after its announcement, sending back to this
// node clients whose connections started at the new owner.
func (a *Announcer) claimedSince(ip netip.Addr, now time.Time) bool {
	window := max(a.opts.ConflictGrace, time.Second)
	a.cmu.Lock()
	defer a.cmu.Unlock()
	for _, t := range []time.Time{a.firstSeen[ip], a.lastConflict[ip]} {
		if !t.IsZero() && now.Sub(t) < window {
			return true
		}
	}
	return false
}

// entryIPs returns the valid IPs of ips, unmapped, without zones or
// duplicates, that keep accepts (nil: all).
func entryIPs(ips []netip.Addr, keep func(netip.Addr) bool) []netip.Addr {
	var out []netip.Addr
	for _, ip := range ips {
		ip = ip.Unmap().WithZone("")
		if ip.IsValid() && !slices.Contains(out, ip) && (keep == nil || keep(ip)) {
			out = append(out, ip)
		}
	}
	return out
}

// yield ends the hand-over of ip (see SetHandover): another host announced
// it. It is called by the read loops, which must not block: the change is
// made by Run's goroutine.
func (a *Announcer) yield(ip netip.Addr, mac [6]byte, iface string) {
	select {
	case a.yieldCh <- yielded{ip, mac, iface}:
	default: // full: the hand-over ends at its deadline instead
	}
}

// yielded is a hand-over ended by another host's claim.
type yielded struct {
	ip    netip.Addr
	mac   [6]byte
	iface string
}

// endHandover removes y's IP from every hand-over entry.
func (a *Announcer) endHandover(y yielded) {
	a.mu.Lock()
	defer a.mu.Unlock()
	ended := false
	for name := range a.proxyRefs[y.ip] {
		p := a.proxies[name]
		if !p.own {
			continue
		}
		ended = true
		old := p.ips
		p.ips = slices.DeleteFunc(slices.Clone(old), func(ip netip.Addr) bool { return ip == y.ip })
		if len(p.ips) == 0 {
			delete(a.proxies, name)
		} else {
			a.proxies[name] = p
		}
		a.applyProxyLocked(name, old, p.ips)
	}
	if ended {
		a.log.V(1).Info("hand-over ended: the new owner announces the IP", "ip", y.ip.String(),
			"mac", net.HardwareAddr(y.mac[:]).String(), "interface", y.iface)
	}
}

// DeleteProxy forgets proxy entry name; its IPs are not answered (unless
// owned, or named by another entry) once it returns.
func (a *Announcer) DeleteProxy(name string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	old, ok := a.proxies[name]
	if !ok {
		return
	}
	delete(a.proxies, name)
	a.applyProxyLocked(name, old.ips, nil)
}

// applyProxyLocked updates the reverse index for proxy entry name moving
// from oldIPs to newIPs and pushes every IP of either to the responders (the
// MACs may have changed even where the IPs did not).
func (a *Announcer) applyProxyLocked(name string, oldIPs, newIPs []netip.Addr) {
	affected := slices.Clone(oldIPs)
	for _, ip := range oldIPs {
		delete(a.proxyRefs[ip], name)
		if len(a.proxyRefs[ip]) == 0 {
			delete(a.proxyRefs, ip)
		}
	}
	for _, ip := range newIPs {
		if a.proxyRefs[ip] == nil {
			a.proxyRefs[ip] = map[string]struct{}{}
		}
		a.proxyRefs[ip][name] = struct{}{}
		if !slices.Contains(affected, ip) {
			affected = append(affected, ip)
		}
	}
	if len(affected) > 0 {
		a.pushLocked(affected)
	}
}

// entryLocked is what r answers ip with: the shared owned entry if a
// balancer owns ip on r's interface, else a proxied entry if a proxy entry
// names r's interface (r's current one when its MAC is unchanged), else nil.
func (a *Announcer) entryLocked(r *responder, ip netip.Addr) *ownedIP {
	if (ip.Is4() && r.arp == nil) || (ip.Is6() && r.ndp == nil) {
		return nil
	}
	if st := a.ips[ip]; st != nil && (st.all || st.interfaces[r.link.Name]) {
		return st.owned
	}
	mac, own, ok := a.proxyMACLocked(ip, r)
	if !ok {
		return nil
	}
	if cur := r.owned.Load().get(ip); cur != nil && cur.proxied && cur.mac == mac && cur.handover == own {
		return cur
	}
	return &ownedIP{addr: ip, m: a.metricsFor(ip), proxied: true, mac: mac, handover: own}
}

// proxyMACLocked returns the MAC to answer ip with on r's interface on
// another host's behalf, or r's own for a hand-over (own). Should two
// entries name ip on the interface (a transition between two hosts,
// normally), another host's wins over a hand-over, and then the first by
// name, so the answer is stable.
func (a *Announcer) proxyMACLocked(ip netip.Addr, r *responder) (mac [6]byte, own, ok bool) {
	best := ""
	for n := range a.proxyRefs[ip] {
		p := a.proxies[n]
		m, has := p.macs[r.link.Name]
		if p.own {
			m, has = r.mac, p.ifaces == nil || p.ifaces[r.link.Name]
		}
		if !has {
			continue
		}
		if !ok || (own && !p.own) || (own == p.own && n < best) {
			best, mac, own, ok = n, m, p.own, true
		}
	}
	return mac, own, ok
}
