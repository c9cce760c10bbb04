package layer2

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
)

// proxy is one SetProxy entry: IPs answered on behalf of another host, and
// that host's MAC per interface (only those interfaces answer).
type proxy struct {
	ips  []netip.Addr
	macs map[string][6]byte
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
	p := proxy{macs: make(map[string][6]byte, len(macs))}
	for _, ip := range ips {
		ip = ip.Unmap().WithZone("")
		if ip.IsValid() && !slices.Contains(p.ips, ip) {
			p.ips = append(p.ips, ip)
		}
	}
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
	mac, ok := a.proxyMACLocked(ip, r.link.Name)
	if !ok {
		return nil
	}
	if cur := r.owned.Load().get(ip); cur != nil && cur.proxied && cur.mac == mac {
		return cur
	}
	return &ownedIP{addr: ip, m: a.metricsFor(ip), proxied: true, mac: mac}
}

// proxyMACLocked returns the MAC to answer ip with on iface on another
// host's behalf. Should two entries name ip on iface (a transition between
// two hosts, normally), the first by name wins, so the answer is stable.
func (a *Announcer) proxyMACLocked(ip netip.Addr, iface string) ([6]byte, bool) {
	var (
		best string
		mac  [6]byte
		ok   bool
	)
	for n := range a.proxyRefs[ip] {
		if m, has := a.proxies[n].macs[iface]; has && (!ok || n < best) {
			best, mac, ok = n, m, true
		}
	}
	return mac, ok
}
