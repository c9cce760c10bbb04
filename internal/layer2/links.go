package layer2

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"time"

	"github.com/go-logr/logr"
	"github.com/mdlayher/ndp"
	"github.com/mdlayher/packet"
	"github.com/vishvananda/netlink"
	"golang.org/x/net/bpf"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"
)

// Link is a network interface as the announcer sees it.
type Link struct {
	Name      string
	Index     int
	MAC       net.HardwareAddr
	Up        bool // administratively up (IFF_UP)
	Carrier   bool // IFF_LOWER_UP or operational state up: frames can flow
	Broadcast bool // IFF_BROADCAST: ARP is possible
	NoARP     bool // IFF_NOARP
	Slave     bool // enslaved to a bridge, bond or VRF: the master answers
	// LinkLocal is a usable (not tentative, not failed DAD) IPv6 link-local
	// address: the interface does IPv6, so it gets an NDP responder; invalid if none.
	LinkLocal netip.Addr
	// Prefixes are the interface's global and unique-local addresses (IPv4
	// and IPv6, not tentative, not failed DAD) with their prefix length,
	// sorted: the on-link networks, which the Prober matches targets
	// against.
	Prefixes []netip.Prefix
}

// sameState reports whether two scans of a link agree on what the
// OnLinksChanged callers care about: Up, Carrier and Prefixes.
func (l Link) sameState(o Link) bool {
	return l.Up == o.Up && l.Carrier == o.Carrier && slices.Equal(l.Prefixes, o.Prefixes)
}

// DefaultExcludeInterfaces is MetalLB's default list of interface name
// patterns never used for announcements (container, CNI and virtual
// interfaces, loopback).
var DefaultExcludeInterfaces = []string{
	"^docker.*", "^cbr.*", "^dummy.*", "^virbr.*", "^lxcbr.*", "^veth.*", "^lo$",
	"^cali.*", "^tunl.*", "^flannel.*", "^kube-ipvs.*", "^cni.*", "^nodelocaldns.*", "^lxc.*",
}

// CompileExcludes compiles interface name patterns, naming the bad one.
func CompileExcludes(patterns []string) ([]*regexp.Regexp, error) {
	out := make([]*regexp.Regexp, 0, len(patterns))
	for _, p := range patterns {
		re, err := regexp.Compile(p)
		if err != nil {
			return nil, fmt.Errorf("exclude-interface pattern %q: %w", p, err)
		}
		out = append(out, re)
	}
	return out, nil
}

// eligibility says whether a link gets an ARP and an NDP responder, and if
// not, why (for logs).
func eligibility(l Link, exclude []*regexp.Regexp) (arp, nd bool, reason string) {
	for _, re := range exclude {
		if re.MatchString(l.Name) {
			return false, false, "excluded by " + re.String()
		}
	}
	switch {
	case !l.Up:
		return false, false, "down"
	case l.Slave:
		return false, false, "enslaved to a master interface"
	case l.NoARP:
		return false, false, "NOARP"
	case len(l.MAC) != 6:
		return false, false, "no Ethernet address"
	}
	arp = l.Broadcast
	nd = l.LinkLocal.IsValid()
	if !arp && !nd {
		return false, false, "neither broadcast nor IPv6 link-local"
	}
	return arp, nd, ""
}

// netlinkLinks lists links with their usable IPv6 link-local address and
// their global addresses.
func netlinkLinks() ([]Link, error) {
	links, err := netlink.LinkList()
	if err != nil {
		return nil, fmt.Errorf("listing links: %w", err)
	}
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("listing addresses: %w", err)
	}
	byLink := map[int][]netlink.Addr{}
	for _, a := range addrs {
		byLink[a.LinkIndex] = append(byLink[a.LinkIndex], a)
	}
	out := make([]Link, 0, len(links))
	for _, l := range links {
		out = append(out, linkOf(l, byLink[l.Attrs().Index]))
	}
	return out, nil
}

// linkOf describes a netlink link with its addresses: the first IPv6
// link-local one, and the global unicast prefixes, sorted; tentative and
// DAD-failed addresses are left out.
func linkOf(l netlink.Link, addrs []netlink.Addr) Link {
	at := l.Attrs()
	out := Link{
		Name:      at.Name,
		Index:     at.Index,
		MAC:       at.HardwareAddr,
		Up:        at.Flags&net.FlagUp != 0,
		Carrier:   at.RawFlags&unix.IFF_LOWER_UP != 0 || at.OperState == netlink.OperUp,
		Broadcast: at.Flags&net.FlagBroadcast != 0,
		NoARP:     at.RawFlags&unix.IFF_NOARP != 0,
		Slave:     at.MasterIndex != 0,
	}
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok || a.IPNet == nil || a.Flags&(unix.IFA_F_TENTATIVE|unix.IFA_F_DADFAILED) != 0 {
			continue
		}
		ip = ip.Unmap()
		switch {
		case ip.Is6() && ip.IsLinkLocalUnicast():
			if !out.LinkLocal.IsValid() {
				out.LinkLocal = ip
			}
		case ip.IsGlobalUnicast():
			ones, _ := a.Mask.Size()
			out.Prefixes = append(out.Prefixes, netip.PrefixFrom(ip, ones))
		}
	}
	slices.SortFunc(out.Prefixes, comparePrefixes)
	return out
}

// linksChanged reports whether two scans (sorted by name) differ in the set
// of links or in any link's Up, Carrier or Prefixes.
func linksChanged(old, cur []Link) bool {
	return !slices.EqualFunc(old, cur, func(a, b Link) bool { return a.Name == b.Name && a.sameState(b) })
}

func comparePrefixes(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return a.Bits() - b.Bits()
}

func (l Link) netInterface() *net.Interface {
	return &net.Interface{Index: l.Index, Name: l.Name, HardwareAddr: l.MAC, MTU: 1500}
}

// listenARP opens the AF_PACKET socket an ARP responder reads: ARP only,
// filtered in the kernel, outgoing frames ignored.
func listenARP(l Link) (net.PacketConn, error) {
	return listenFiltered(l, etherTypeARP, arpFilter)
}

// listenFiltered opens an AF_PACKET socket for one EtherType on l with a
// kernel socket filter, ignoring the frames this host sends.
func listenFiltered(l Link, etherType uint16, filter func() ([]bpf.RawInstruction, error)) (net.PacketConn, error) {
	prog, err := filter()
	if err != nil {
		return nil, err
	}
	c, err := packet.Listen(l.netInterface(), packet.Raw, int(etherType), &packet.Config{Filter: prog})
	if err != nil {
		return nil, fmt.Errorf("opening packet socket for EtherType %#04x on %s: %w", etherType, l.Name, err)
	}
	ignoreOutgoing(c)
	return c, nil
}

// listenNDP opens the AF_PACKET socket an NDP responder reads (IPv6 frames
// carrying Neighbor Solicitations and Advertisements, unicast or multicast),
// and an mdlayher/ndp ICMPv6 socket used only to join solicited-node groups:
// the join is what programs the NIC's multicast filter. That socket is set to
// receive nothing, so it never queues data.
func listenNDP(l Link) (net.PacketConn, MulticastGroups, error) {
	c, err := listenFiltered(l, etherTypeIPv6, ndpFilter)
	if err != nil {
		return nil, nil, err
	}
	ifi, err := net.InterfaceByIndex(l.Index)
	if err != nil {
		_ = c.Close()
		return nil, nil, fmt.Errorf("looking up interface %s: %w", l.Name, err)
	}
	nc, _, err := ndp.Listen(ifi, ndp.LinkLocal)
	if err != nil {
		_ = c.Close()
		return nil, nil, fmt.Errorf("opening NDP socket on %s: %w", l.Name, err)
	}
	var f ipv6.ICMPFilter
	f.SetAll(true)
	if err := nc.SetICMPFilter(&f); err != nil {
		_ = c.Close()
		_ = nc.Close()
		return nil, nil, fmt.Errorf("filtering NDP socket on %s: %w", l.Name, err)
	}
	return c, nc, nil
}

// ignoreOutgoing sets PACKET_IGNORE_OUTGOING (Linux 4.20+), so the kernel
// does not clone every frame this host sends to our socket. The BPF filters
// drop outgoing frames anyway; this only saves work, so errors are ignored.
func ignoreOutgoing(c *packet.Conn) {
	rc, err := c.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Control(func(fd uintptr) {
		_ = unix.SetsockoptInt(int(fd), unix.SOL_PACKET, unix.PACKET_IGNORE_OUTGOING, 1)
	})
}

// watchNetlink sends on kick whenever a link or address changes, until ctx
// ends. Subscriptions that fail or end (the socket overflowed) are
// re-established after a pause; the periodic rescan covers the gap.
func watchNetlink(ctx context.Context, log logr.Logger, kick func()) {
	for ctx.Err() == nil {
		done := make(chan struct{})
		lch := make(chan netlink.LinkUpdate, 64)
		ach := make(chan netlink.AddrUpdate, 64)
		onErr := func(err error) { log.V(1).Info("netlink subscription error", "error", err.Error()) }
		err := netlink.LinkSubscribeWithOptions(lch, done, netlink.LinkSubscribeOptions{ErrorCallback: onErr})
		if err == nil {
			err = netlink.AddrSubscribeWithOptions(ach, done, netlink.AddrSubscribeOptions{ErrorCallback: onErr, ReceiveBufferSize: 1 << 20})
		}
		if err != nil {
			log.Error(err, "subscribing to netlink link/address updates failed; relying on periodic rescans")
		} else {
			kick() // changes between the last scan and the subscription
			watchUpdates(ctx, lch, ach, kick)
		}
		close(done)
		// The subscription goroutines exit once their socket is closed;
		// drain so none blocks on a send meanwhile.
		go func() {
			for range lch {
			}
		}()
		go func() {
			for range ach {
			}
		}()
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

func watchUpdates(ctx context.Context, lch <-chan netlink.LinkUpdate, ach <-chan netlink.AddrUpdate, kick func()) {
	for {
		select {
		case <-ctx.Done():
			return
		case _, ok := <-lch:
			if !ok {
				return
			}
			kick()
		case _, ok := <-ach:
			if !ok {
				return
			}
			kick()
		}
	}
}
