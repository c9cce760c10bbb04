// Package labnet builds the lab's network: one network namespace per host, a switch namespace
// holding a bridge, veths between them, node addresses, direct routes between the nodes' pod
// CIDRs, and a TCP forwarder that lets the root namespace reach a lab address without any
// route into the lab subnets.
//
// Everything it creates is named with the "ilb" prefix (namespaces "ilb-<host>", the switch
// "ilb-sw", the bridge "ilbbr0", switch ports "ilbp<n>") and lives inside namespaces it made,
// so tearing down is deleting those namespaces. It drives iproute2 (`ip`), which the lab
// installs as a prerequisite, because that keeps every step visible and reproducible by hand.
package labnet

import (
	"fmt"
	"net/netip"
	"regexp"
	"strings"
)

// Fixed names and subnets of the lab (they mirror the kind cluster of the walkthrough).
const (
	// NSPrefix prefixes every namespace the lab (and its node agent) creates.
	NSPrefix = "ilb-"
	// SwitchNS holds the bridge every host hangs off.
	SwitchNS = "ilb-sw"
	// Bridge is the bridge device inside SwitchNS.
	Bridge = "ilbbr0"
	// HostIf is the host side of each host's veth, inside the host namespace.
	HostIf = "eth0"
	// ClusterPrefixLen is the node subnet's prefix length (172.18.0.0/16, as kind's network).
	ClusterPrefixLen = 16
	// ControlPlaneName is the name of the control-plane node.
	ControlPlaneName = "myk8s-control-plane"
	// ClientName is the host outside the cluster.
	ClientName = "mypc"
	// SecondClientName is a second host outside the cluster on the same segment: the
	// nemesis's checker watches every IP from both clients, so an answer only one of
	// them hears, or a gratuitous ARP only one of them gets, shows.
	SecondClientName = "mypc2"
	// PrometheusName is the monitoring host (lab up --prometheus): outside the cluster
	// like mypc, with routes to the pod CIDRs so it can scrape pods.
	PrometheusName = "prometheus"
	// DNSName is the lab's DNS host (lab up --dns): outside the cluster like mypc, it runs
	// BIND, authoritative for the lab's zone, and external-dns, which publishes
	// LoadBalancer Services' ingress IPs there.
	DNSName = "dns"
	// MaxWorkers bounds the worker count so every host keeps an address below mypc's.
	MaxWorkers = 90
)

var (
	// NodeSubnet is the L2 segment of the nodes and the client.
	NodeSubnet = netip.MustParsePrefix("172.18.0.0/16")
	// PodSubnet is the cluster's pod CIDR; node N gets 10.10.N.0/24.
	PodSubnet = netip.MustParsePrefix("10.10.0.0/16")
	// DefaultServiceSubnet is the service CIDR unless another is asked for (lab up
	// --service-cidr): kind's walkthrough config.
	DefaultServiceSubnet = netip.MustParsePrefix("10.200.1.0/24")
	// ClientIP is mypc's address.
	ClientIP = netip.MustParseAddr("172.18.0.100")
	// SecondClientIP is mypc2's address.
	SecondClientIP = netip.MustParseAddr("172.18.0.102")

	// NodeSubnet6 is the segment's IPv6 prefix: kind's network is dual-stack with this ULA.
	// A host's IPv6 address ends in the digits of its IPv4 address's last octet
	// (172.18.0.3 -> fc00:f853:ccd:e793::3, mypc -> ::100), so either is easy to read off the other.
	NodeSubnet6 = netip.MustParsePrefix("fc00:f853:ccd:e793::/64")
	// PodSubnet6 is the IPv6 pod CIDR; node N gets fd00:10:10:N::/64.
	PodSubnet6 = netip.MustParsePrefix("fd00:10:10::/56")
	// ServiceSubnet6 is the IPv6 service CIDR of a dual-stack lab.
	ServiceSubnet6 = netip.MustParsePrefix("fd00:10:200::/112")
	// PrometheusIP is the monitoring host's address.
	PrometheusIP = netip.MustParseAddr("172.18.0.101")
	// DNSIP is the DNS host's address (the DNS server mypc and mypc2 resolve through).
	DNSIP = netip.MustParseAddr("172.18.0.103")
)

// IP families the lab can run.
const (
	// FamilyDual gives every host, pod and the service CIDR an IPv4 and an IPv6 address,
	// IPv4 first (Services stay single-stack IPv4 unless they ask), as on kind's network.
	FamilyDual = "dual"
	// FamilyIPv4 is the IPv4-only lab.
	FamilyIPv4 = "ipv4"
)

// ParseIPFamily checks a lab IP family name; "" is FamilyDual.
func ParseIPFamily(s string) (string, error) {
	switch s {
	case "", FamilyDual:
		return FamilyDual, nil
	case FamilyIPv4:
		return FamilyIPv4, nil
	}
	return "", fmt.Errorf("IP family %q: the lab runs %q (IPv4 and IPv6) or %q", s, FamilyDual, FamilyIPv4)
}

// Host is one machine of the lab: a node or the client.
type Host struct {
	// Name is the host name: a Kubernetes node name or "mypc".
	Name string
	// IP is the address of eth0 in 172.18.0.0/16.
	IP netip.Addr
	// IP6 is the address of eth0 in NodeSubnet6; invalid in an IPv4-only lab.
	IP6 netip.Addr
	// MAC is eth0's address, derived from IP like Docker does (02:42:ac:12:00:NN), so tests can
	// predict which MAC answers for an address.
	MAC string
	// PodCIDR is the node's pod range; invalid for the client.
	PodCIDR netip.Prefix
	// PodCIDR6 is the node's IPv6 pod range; invalid for the client and in an IPv4-only lab.
	PodCIDR6 netip.Prefix
	// Node is true for Kubernetes nodes.
	Node bool
	// ControlPlane is true for the control-plane node.
	ControlPlane bool
	// ReachesPods is true for a host outside the cluster that routes every node's pod
	// CIDR via that node, as the nodes do (the monitoring host scrapes pod IPs).
	ReachesPods bool

	nsPrefix string
}

// IPs are the host's addresses, IPv4 first (the primary family, as on kind's nodes).
func (h Host) IPs() []netip.Addr {
	if h.IP6.IsValid() {
		return []netip.Addr{h.IP, h.IP6}
	}
	return []netip.Addr{h.IP}
}

// PodCIDRs are the node's pod ranges, IPv4 first.
func (h Host) PodCIDRs() []netip.Prefix {
	if h.PodCIDR6.IsValid() {
		return []netip.Prefix{h.PodCIDR, h.PodCIDR6}
	}
	return []netip.Prefix{h.PodCIDR}
}

// NS is the host's network namespace name.
func (h Host) NS() string { return h.nsPrefix + h.Name }

// SwitchPort is the name of the host's veth end in the switch namespace.
func (h Host) SwitchPort() string { return fmt.Sprintf("ilbp%d", h.IP.As4()[3]) }

// Topology is the set of hosts of one lab.
type Topology struct {
	Hosts []Host
	// Prefix prefixes the namespace names (NSPrefix for the lab).
	Prefix string
	// ServiceSubnet is the service CIDR (DefaultServiceSubnet unless set);
	// the kubernetes Service is its first address.
	ServiceSubnet netip.Prefix
	// Family is FamilyDual or FamilyIPv4.
	Family string
}

// DualStack reports whether hosts, pods and Services have IPv6 addresses too.
func (t *Topology) DualStack() bool { return t.Family == FamilyDual }

// ServiceSubnets are the service CIDRs, IPv4 first.
func (t *Topology) ServiceSubnets() []netip.Prefix {
	if t.DualStack() {
		return []netip.Prefix{t.ServiceSubnet, ServiceSubnet6}
	}
	return []netip.Prefix{t.ServiceSubnet}
}

// PodSubnets are the cluster's pod CIDRs, IPv4 first.
func (t *Topology) PodSubnets() []netip.Prefix {
	if t.DualStack() {
		return []netip.Prefix{PodSubnet, PodSubnet6}
	}
	return []netip.Prefix{PodSubnet}
}

// Join is the comma-separated list (of addresses or prefixes) Kubernetes' dual-stack flags take.
func Join[T fmt.Stringer](xs []T) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = x.String()
	}
	return strings.Join(s, ",")
}

// KubernetesServiceIP is the ClusterIP of the default/kubernetes Service: the
// service CIDR's first address, as the API server allocates it.
func (t *Topology) KubernetesServiceIP() netip.Addr { return t.ServiceSubnet.Masked().Addr().Next() }

// ParseServiceSubnet checks a service CIDR for the lab: IPv4, a network
// address, between /12 (the API server's largest) and /28, outside the node
// and pod subnets.
func ParseServiceSubnet(s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	switch {
	case err != nil:
		return netip.Prefix{}, fmt.Errorf("service CIDR %q: %w", s, err)
	case !p.Addr().Is4():
		return netip.Prefix{}, fmt.Errorf("service CIDR %q: the lab is IPv4 only", s)
	case p.Masked() != p:
		return netip.Prefix{}, fmt.Errorf("service CIDR %q: not a network address (did you mean %s?)", s, p.Masked())
	case p.Bits() < 12 || p.Bits() > 28:
		return netip.Prefix{}, fmt.Errorf("service CIDR %q: the prefix length must be between 12 and 28", s)
	case p.Overlaps(NodeSubnet) || p.Overlaps(PodSubnet):
		return netip.Prefix{}, fmt.Errorf("service CIDR %q overlaps the node subnet %s or the pod subnet %s", s, NodeSubnet, PodSubnet)
	}
	return p, nil
}

// New returns the lab's topology: a control plane, the given number of workers, mypc and
// mypc2, dual-stack. Workers are named like kind's: myk8s-worker, myk8s-worker2, myk8s-worker3, ...
func New(workers int) (*Topology, error) { return NewWithPrefix(workers, NSPrefix, FamilyDual) }

// NewWithPrefix returns the same topology with other namespace names (prefix + host name,
// prefix + "sw"), so a test can build one next to a running lab, and the given IP family.
func NewWithPrefix(workers int, prefix, family string) (*Topology, error) {
	if workers < 0 || workers > MaxWorkers {
		return nil, fmt.Errorf("worker count %d: must be between 0 and %d", workers, MaxWorkers)
	}
	family, err := ParseIPFamily(family)
	if err != nil {
		return nil, err
	}
	t := &Topology{Prefix: prefix, ServiceSubnet: DefaultServiceSubnet, Family: family}
	for i := 0; i <= workers; i++ {
		name := ControlPlaneName
		if i == 1 {
			name = "myk8s-worker"
		} else if i > 1 {
			name = fmt.Sprintf("myk8s-worker%d", i)
		}
		t.Hosts = append(t.Hosts, t.newHost(name, byte(i+2), i, i == 0))
	}
	t.Hosts = append(t.Hosts, t.newHost(ClientName, ClientIP.As4()[3], -1, false),
		t.newHost(SecondClientName, SecondClientIP.As4()[3], -1, false))
	return t, nil
}

// AddPrometheus adds the monitoring host (PrometheusName, PrometheusIP) to the topology.
func (t *Topology) AddPrometheus() {
	if _, ok := t.Host(PrometheusName); ok {
		return
	}
	h := t.newHost(PrometheusName, PrometheusIP.As4()[3], -1, false)
	h.ReachesPods = true
	t.Hosts = append(t.Hosts, h)
}

// AddDNS adds the DNS host (DNSName, DNSIP) to the topology.
func (t *Topology) AddDNS() {
	if _, ok := t.Host(DNSName); ok {
		return
	}
	t.Hosts = append(t.Hosts, t.newHost(DNSName, DNSIP.As4()[3], -1, false))
}

// SwitchNS is the namespace holding the bridge.
func (t *Topology) SwitchNS() string { return t.Prefix + "sw" }

// newHost makes a host whose addresses end in last; node >= 0 is its index among the nodes
// (its pod CIDRs), -1 for the client.
func (t *Topology) newHost(name string, last byte, node int, cp bool) Host {
	h := Host{
		nsPrefix:     t.Prefix,
		Name:         name,
		IP:           netip.AddrFrom4([4]byte{172, 18, 0, last}),
		MAC:          fmt.Sprintf("02:42:ac:12:00:%02x", last),
		Node:         node >= 0,
		ControlPlane: cp,
	}
	if h.Node {
		h.PodCIDR = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 10, byte(node), 0}), 24)
	}
	if !t.DualStack() {
		return h
	}
	// The decimal digits of the last octet, read as hex: .3 -> ::3, .100 -> ::100.
	var digits uint16
	for _, c := range fmt.Sprint(last) {
		digits = digits<<4 | uint16(c-'0')
	}
	a := NodeSubnet6.Addr().As16()
	a[14], a[15] = byte(digits>>8), byte(digits)
	h.IP6 = netip.AddrFrom16(a)
	if h.Node {
		p := PodSubnet6.Addr().As16()
		p[7] = byte(node)
		h.PodCIDR6 = netip.PrefixFrom(netip.AddrFrom16(p), 64)
	}
	return h
}

// Nodes returns the Kubernetes nodes, control plane first.
func (t *Topology) Nodes() []Host {
	var out []Host
	for _, h := range t.Hosts {
		if h.Node {
			out = append(out, h)
		}
	}
	return out
}

// Host returns the host with the given name; "ilb-" in front of it is accepted too.
func (t *Topology) Host(name string) (Host, bool) {
	name = strings.TrimPrefix(name, t.Prefix)
	for _, h := range t.Hosts {
		if h.Name == name {
			return h, true
		}
	}
	return Host{}, false
}

// ControlPlane returns the control-plane node.
func (t *Topology) ControlPlane() Host { return t.Hosts[0] }

// labNSPattern matches the host namespaces of the lab: the switch, the nodes (myk8s-*), mypc, mypc2,
// the monitoring host and the DNS host. Other "ilb-" namespaces, such as ones a unit test makes, are not
// the lab's.
var labNSPattern = regexp.MustCompile(`^ilb-(sw|mypc2?|prometheus|dns|myk8s-[a-z0-9-]+)$`)

// IsLabNS reports whether a namespace name is one of the lab's host namespaces.
func IsLabNS(name string) bool { return labNSPattern.MatchString(name) }

// podNSPattern matches pod namespaces as node agents name them (ilb-p-<8 hex>). Agents in
// other tests use the same names, so a pod namespace is the lab's only when one of the lab's
// nodes holds its veth or the lab's agent state records it.
var podNSPattern = regexp.MustCompile(`^ilb-p-[0-9a-f]{8}$`)

// IsPodNS reports whether a namespace name has the shape of a pod namespace.
func IsPodNS(name string) bool { return podNSPattern.MatchString(name) }

var podVethPattern = regexp.MustCompile(`^veth([0-9a-f]{8})$`)

// PodNSOfVeth returns the pod namespace behind a node-side pod veth (veth<8 hex>), or "".
func PodNSOfVeth(veth string) string {
	m := podVethPattern.FindStringSubmatch(veth)
	if m == nil {
		return ""
	}
	return NSPrefix + "p-" + m[1]
}

// labRootLinkPattern matches links the lab could leave in the root namespace (it creates its
// veths directly inside namespaces, so normally none).
var labRootLinkPattern = regexp.MustCompile(`^(ilbp[0-9]+|ilbbr0)$`)

// IsLabLink reports whether a link name in the root namespace is one the lab may have made.
func IsLabLink(name string) bool { return labRootLinkPattern.MatchString(name) }
