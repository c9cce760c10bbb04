package labnet

import (
	"context"
	"fmt"
	"strings"
)

// Build creates the switch, every host namespace and its wiring. It expects none of the
// topology's namespaces to exist (the caller tears a half-built lab down first).
func (t *Topology) Build(ctx context.Context) error {
	if _, err := IP(ctx, "netns", "add", t.SwitchNS()); err != nil {
		return err
	}
	steps := [][]string{
		{"-n", t.SwitchNS(), "link", "set", "lo", "up"},
		{"-n", t.SwitchNS(), "link", "add", Bridge, "type", "bridge"},
		{"-n", t.SwitchNS(), "link", "set", Bridge, "up"},
	}
	if err := ipAll(ctx, steps); err != nil {
		return err
	}
	// Bridged frames must not go through the switch namespace's netfilter hooks (br_netfilter
	// is loaded on this host): the switch is a plain L2 switch. Best effort, the knob is
	// per-namespace only on recent kernels.
	for _, k := range []string{"net.bridge.bridge-nf-call-iptables", "net.bridge.bridge-nf-call-ip6tables", "net.bridge.bridge-nf-call-arptables"} {
		_ = Sysctl(t.SwitchNS(), k, "0")
	}
	for _, h := range t.Hosts {
		if err := t.BuildHost(ctx, h); err != nil {
			return fmt.Errorf("building host %s: %w", h.Name, err)
		}
	}
	return nil
}

// BuildHost creates one host's namespace and wires it to the switch (which must exist).
func (t *Topology) BuildHost(ctx context.Context, h Host) error {
	ns := h.NS()
	if _, err := IP(ctx, "netns", "add", ns); err != nil {
		return err
	}
	// Create the veth inside the switch namespace with its other end directly in the host
	// namespace: no lab link ever appears in the root namespace.
	if err := ipAll(ctx, [][]string{
		{"-n", t.SwitchNS(), "link", "add", h.SwitchPort(), "type", "veth", "peer", "name", HostIf, "netns", ns},
		{"-n", t.SwitchNS(), "link", "set", h.SwitchPort(), "master", Bridge, "up"},
		{"-n", ns, "link", "set", "lo", "up"},
		{"-n", ns, "link", "set", HostIf, "address", h.MAC},
	}); err != nil {
		return err
	}
	sysctls := [][2]string{
		// No duplicate address detection delay for the link-local address.
		{"net.ipv6.conf.eth0.accept_dad", "0"},
		// A link taken down (DisconnectHost, a pulled cable) keeps its IPv6 addresses, as a
		// carrier loss would; the kernel flushes them on admin-down otherwise.
		{"net.ipv6.conf.eth0.keep_addr_on_down", "1"},
		// Pod traffic and DNATed service traffic arrive on interfaces the reverse path would
		// not choose; kind nodes run with loose filtering too.
		{"net.ipv4.conf.all.rp_filter", "0"},
		{"net.ipv4.conf.default.rp_filter", "0"},
		{"net.ipv4.conf.eth0.rp_filter", "0"},
	}
	if h.Node {
		sysctls = append(sysctls, [2]string{"net.ipv4.ip_forward", "1"}, [2]string{"net.ipv6.conf.all.forwarding", "1"})
	}
	for _, s := range sysctls {
		if err := Sysctl(ns, s[0], s[1]); err != nil {
			return err
		}
	}
	return t.ConnectHost(ctx, h)
}

// ConnectHost brings the host's eth0 and its switch port up and (re)installs its address and
// routes; it is idempotent, so it also restores a host whose link was taken down.
func (t *Topology) ConnectHost(ctx context.Context, h Host) error {
	ns := h.NS()
	steps := [][]string{
		{"-n", t.SwitchNS(), "link", "set", h.SwitchPort(), "up"},
		{"-n", ns, "link", "set", HostIf, "up"},
		{"-n", ns, "addr", "replace", fmt.Sprintf("%s/%d", h.IP, ClusterPrefixLen), "dev", HostIf},
	}
	if h.IP6.IsValid() {
		// nodad: the address is usable at once (DAD would hold it "tentative" for a second
		// after every link-up, and the lab's addresses are unique by construction).
		steps = append(steps, []string{"-n", ns, "addr", "replace", fmt.Sprintf("%s/%d", h.IP6, NodeSubnet6.Bits()), "dev", HostIf, "nodad"})
	}
	if h.Node {
		// A locally generated packet needs a route before kube-proxy's OUTPUT rules DNAT it;
		// with no default route (none is needed otherwise) ClusterIPs would be unreachable
		// from the node itself and its hostNetwork pods.
		for _, s := range t.ServiceSubnets() {
			steps = append(steps, []string{"-n", ns, "route", "replace", s.String(), "dev", HostIf})
		}
	}
	if h.Node || h.ReachesPods {
		// Direct routing: every node reaches the other nodes' pod CIDRs through their node IP.
		for _, o := range t.Nodes() {
			if o.Name == h.Name {
				continue
			}
			steps = append(steps, []string{"-n", ns, "route", "replace", o.PodCIDR.String(), "via", o.IP.String(), "dev", HostIf})
			if o.PodCIDR6.IsValid() {
				steps = append(steps, []string{"-n", ns, "route", "replace", o.PodCIDR6.String(), "via", o.IP6.String(), "dev", HostIf})
			}
		}
	}
	return ipAll(ctx, steps)
}

// DisconnectHost takes the host's link down on both ends, as a pulled cable would.
func (t *Topology) DisconnectHost(ctx context.Context, h Host) error {
	return ipAll(ctx, [][]string{
		{"-n", h.NS(), "link", "set", HostIf, "down"},
		{"-n", t.SwitchNS(), "link", "set", h.SwitchPort(), "down"},
	})
}

// Check verifies that every namespace of the topology exists and each host's eth0 is up.
func (t *Topology) Check(ctx context.Context) error {
	var missing []string
	if !NSExists(t.SwitchNS()) {
		missing = append(missing, t.SwitchNS())
	}
	for _, h := range t.Hosts {
		if !NSExists(h.NS()) {
			missing = append(missing, h.NS())
			continue
		}
		out, err := IP(ctx, "-n", h.NS(), "-br", "addr", "show", "dev", HostIf)
		for _, a := range h.IPs() {
			if err != nil || !strings.Contains(out, a.String()+"/") {
				missing = append(missing, h.NS()+" eth0 address "+a.String())
			}
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("missing: %s", strings.Join(missing, ", "))
	}
	return nil
}

// RootLinks returns links in the root namespace that the lab may have left behind.
func RootLinks(ctx context.Context) ([]string, error) { return Links(ctx, "", IsLabLink) }

// Links returns the names of the links in a namespace ("" = the current one) that match.
func Links(ctx context.Context, ns string, match func(string) bool) ([]string, error) {
	args := []string{"-o", "link", "show"}
	if ns != "" {
		args = append([]string{"-n", ns}, args...)
	}
	out, err := IP(ctx, args...)
	if err != nil {
		return nil, err
	}
	var links []string
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		name := strings.TrimSuffix(f[1], ":")
		if i := strings.Index(name, "@"); i >= 0 {
			name = name[:i]
		}
		if match(name) {
			links = append(links, name)
		}
	}
	return links, nil
}

func ipAll(ctx context.Context, steps [][]string) error {
	for _, s := range steps {
		if _, err := IP(ctx, s...); err != nil {
			return err
		}
	}
	return nil
}
