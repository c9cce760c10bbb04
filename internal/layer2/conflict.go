package layer2

import (
	"net"
	"net/netip"
	"slices"
	"time"
)

// Conflict is another host claiming an IP this node announces: an ARP frame
// or Neighbor Advertisement for it from a MAC that is not ours. It is also
// how a split brain between two speakers shows.
type Conflict struct {
	IP        netip.Addr
	MAC       net.HardwareAddr // the other host's
	Interface string           // where it was seen
	Time      time.Time
	// Proxied: the IP is one this node answers for on another host's behalf
	// (SetProxy), not one it owns; such claims are not defended.
	Proxied bool
}

// Conflicts delivers address conflicts, at most one per IP per
// ConflictInterval. The channel is buffered; reports are dropped (and
// logged) when nobody reads.
func (a *Announcer) Conflicts() <-chan Conflict { return a.conflicts }

// onConflict is called by the read loops when another MAC claims an owned
// IP. A claim must persist past ConflictGrace to be reported (see Options);
// then it is reported at most once per IP per ConflictInterval, with at most
// one defensive announcement in the same interval: never a fight in a loop.
func (a *Announcer) onConflict(o *ownedIP, mac [6]byte, iface string) {
	if o.handover {
		a.yield(o.addr, mac, iface) // the new owner's announcement: expected, not a conflict
		return
	}
	now := time.Now()
	grace := a.opts.ConflictGrace
	a.cmu.Lock()
	if last, ok := a.lastConflict[o.addr]; ok && now.Sub(last) < a.opts.ConflictInterval {
		a.cmu.Unlock()
		return
	}
	if grace > 0 {
		first, pending := a.firstSeen[o.addr]
		if !pending || now.Sub(first) > 2*grace {
			// A new sighting (or one long after the last, unconfirmed).
			a.firstSeen[o.addr] = now
			a.cmu.Unlock()
			a.log.V(1).Info("another host claims an owned IP; re-checking after the grace period",
				"ip", o.addr.String(), "otherMAC", net.HardwareAddr(mac[:]).String(), "interface", iface)
			select {
			case a.recheckCh <- recheck{burstKey{o.addr, iface}, now.Add(grace)}:
			default:
			}
			return
		}
		if now.Sub(first) < grace {
			a.cmu.Unlock()
			return
		}
		delete(a.firstSeen, o.addr)
	}
	a.lastConflict[o.addr] = now
	a.cmu.Unlock()

	o.m.conflicts.Inc()
	c := Conflict{IP: o.addr, MAC: net.HardwareAddr(slices.Clone(mac[:])), Interface: iface, Time: now, Proxied: o.proxied}
	a.log.Info("address conflict: another host claims an IP this node announces",
		"ip", o.addr.String(), "otherMAC", c.MAC.String(), "interface", iface, "node", a.opts.NodeName, "proxied", o.proxied)
	select {
	case a.conflicts <- c:
	default:
		a.log.Info("conflict report dropped: nobody is reading Conflicts()", "ip", o.addr.String())
	}
	select {
	case a.defendCh <- burstKey{o.addr, iface}:
	default:
	}
}
