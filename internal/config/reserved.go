package config

import (
	"fmt"
	"net/netip"

	"github.com/ironlb/ironlb/api/v1beta1"
	"github.com/ironlb/ironlb/internal/textlimit"
)

// reservedBlock is an address block no LoadBalancer IP can come from: a host
// announcing it with ARP/NDP would either be ignored by every neighbour or break
// its own networking.
type reservedBlock struct {
	prefix netip.Prefix
	what   string
}

// reservedBlocks are the special-purpose blocks (RFC 6890 and its IPv6 counterparts)
// that are never unicast addresses reachable on a LAN. Private, shared (100.64/10),
// documentation and benchmarking ranges stay allowed: labs and real LANs use them.
var reservedBlocks = []reservedBlock{
	{netip.MustParsePrefix("0.0.0.0/8"), `"this network" (0.0.0.0/8, includes the unspecified address 0.0.0.0)`},
	{netip.MustParsePrefix("127.0.0.0/8"), "loopback (127.0.0.0/8)"},
	{netip.MustParsePrefix("169.254.0.0/16"), "link-local (169.254.0.0/16)"},
	{netip.MustParsePrefix("224.0.0.0/4"), "multicast (224.0.0.0/4)"},
	{netip.MustParsePrefix("255.255.255.255/32"), "the limited broadcast address (255.255.255.255)"},
	{netip.MustParsePrefix("::/128"), "the unspecified address (::)"},
	{netip.MustParsePrefix("::1/128"), "loopback (::1)"},
	{netip.MustParsePrefix("::ffff:0:0/96"), "IPv4-mapped (::ffff:0:0/96)"},
	{netip.MustParsePrefix("fe80::/10"), "link-local (fe80::/10)"},
	{netip.MustParsePrefix("ff00::/8"), "multicast (ff00::/8)"},
}

// checkReserved returns an error naming the first special-purpose block r overlaps.
// One overlapping address is enough: the allocator could hand it out.
func checkReserved(r Range) error {
	for _, b := range reservedBlocks {
		if r.Overlaps(prefixRange(b.prefix)) {
			return fmt.Errorf("overlaps %s, which cannot be a LoadBalancer IP", b.what)
		}
	}
	return nil
}

// prefixRange is the range of all addresses of p.
func prefixRange(p netip.Prefix) Range {
	p = p.Masked()
	return Range{First: p.Addr(), Last: lastAddr(p)}
}

// ClusterNetwork is an address block the cluster routes itself: a Service network
// (a ServiceCIDR) or a node's pod network (spec.podCIDRs). An address of a pool
// inside it would be routed by kube-proxy or the CNI, not announced on the LAN.
type ClusterNetwork struct {
	Prefix netip.Prefix
	// What names the block for the error, e.g. `Service network (ServiceCIDR "kubernetes")`.
	What string
}

// CheckClusterNetworks returns one *FieldError per entry of pool's spec.addresses
// that overlaps one of nets (entries that do not parse are Parse's business and are
// skipped). It is separate from Parse because the daemons cannot know the cluster's
// networks when they load a configuration; the webhook checks it on every change of
// a pool.
func CheckClusterNetworks(pool *v1beta1.IPAddressPool, nets []ClusterNetwork) []error {
	e := &errs{kind: kindPool, name: pool.Name}
	for i, s := range pool.Spec.Addresses {
		r, err := ParseAddresses(s)
		if err != nil {
			continue
		}
		for _, n := range nets {
			if r.Overlaps(prefixRange(n.Prefix)) {
				e.add(fmt.Sprintf("spec.addresses[%d]", i), "%s overlaps the cluster's %s %s: its addresses are routed inside the cluster and cannot be LoadBalancer IPs",
					textlimit.Quote(s), n.What, n.Prefix.Masked())
				break
			}
		}
	}
	return e.list
}
