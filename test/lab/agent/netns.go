package agent

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"

	"k8s.io/apimachinery/pkg/types"
)

// Pod network plumbing. Every pod without hostNetwork gets a network
// namespace ilb-p-<8 hex of its UID> and a veth pair: veth<8 hex> stays in the
// node namespace, eth0 lives in the pod namespace with the pod IP as a /32
// (and on a dual-stack node its IPv6 address as a /128).
// The pod reaches everything through the gateway 169.254.1.1 (IPv6: fe80::1), a
// link-local address nobody owns: a permanent neighbour entry maps it to the node-side
// veth's fixed MAC, so no ARP/NDP answer (and no proxy_arp) is needed. The node
// reaches the pod through a /32 (/128) route on the node-side veth, which has no
// address of its own. The same scheme serves any number of pods per node.

const (
	podGateway  = "169.254.1.1"
	podGateway6 = "fe80::1"
	// gatewayMAC is the MAC of every node-side veth; the pod's static
	// neighbour entry for the gateway points at it.
	gatewayMAC = "ee:ee:ee:ee:ee:ee"
)

// PodNetNames returns the pod network namespace and node-side veth names for uid.
func PodNetNames(uid types.UID) (netns, hostVeth string) {
	h := strings.ReplaceAll(string(uid), "-", "")
	if len(h) > 8 {
		h = h[:8]
	}
	return "ilb-p-" + h, "veth" + h
}

// Net runs the ip commands for pod networks. NodeNS is the node's network
// namespace ("" = the agent's own namespace).
type Net struct {
	NodeNS string
}

func (n Net) ipNode(ctx context.Context, args ...string) error {
	if n.NodeNS != "" {
		args = append([]string{"-n", n.NodeNS}, args...)
	}
	return runIP(ctx, args...)
}

func runIP(ctx context.Context, args ...string) error {
	cmd := exec.CommandContext(ctx, "ip", args...)
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return nil
}

type step struct {
	node bool // run in the node's namespace (else the command names its namespace)
	args []string
}

// Setup creates (or recreates) the pod network namespace and veth for uid
// with addresses ips (one per family). It is idempotent: leftovers of an
// earlier attempt are removed first.
func (n Net) Setup(ctx context.Context, uid types.UID, ips []netip.Addr) error {
	ns, veth := PodNetNames(uid)
	n.Teardown(ctx, uid)
	steps := []step{
		{false, []string{"netns", "add", ns}},
		{true, []string{"link", "add", veth, "address", gatewayMAC, "type", "veth", "peer", "name", "eth0", "netns", ns}},
		{true, []string{"link", "set", veth, "up"}},
		{false, []string{"-n", ns, "link", "set", "lo", "up"}},
	}
	for _, ip := range ips {
		if ip.Is4() {
			steps = append(steps, step{false, []string{"-n", ns, "addr", "add", ip.String() + "/32", "dev", "eth0"}})
		} else {
			// nodad: usable at once; the agent's IPAM makes it unique.
			steps = append(steps, step{false, []string{"-n", ns, "addr", "add", ip.String() + "/128", "dev", "eth0", "nodad"}})
		}
	}
	steps = append(steps, step{false, []string{"-n", ns, "link", "set", "eth0", "up"}})
	for _, ip := range ips {
		gw, bits := podGateway, "/32"
		if ip.Is6() {
			gw, bits = podGateway6, "/128"
		}
		if ip.Is4() {
			// IPv6 link-local gateways are on-link by definition; IPv4 needs the route.
			steps = append(steps, step{false, []string{"-n", ns, "route", "add", gw, "dev", "eth0", "scope", "link"}})
		}
		steps = append(steps,
			step{false, []string{"-n", ns, familyFlag(ip), "route", "add", "default", "via", gw, "dev", "eth0"}},
			step{false, []string{"-n", ns, "neigh", "replace", gw, "lladdr", gatewayMAC, "dev", "eth0", "nud", "permanent"}},
			step{true, []string{"route", "replace", ip.String() + bits, "dev", veth}})
	}
	for _, s := range steps {
		var err error
		if s.node {
			err = n.ipNode(ctx, s.args...)
		} else {
			err = runIP(ctx, s.args...)
		}
		if err != nil {
			n.Teardown(ctx, uid)
			return fmt.Errorf("setting up the network of pod %s: %w", uid, err)
		}
	}
	return nil
}

func familyFlag(ip netip.Addr) string {
	if ip.Is4() {
		return "-4"
	}
	return "-6"
}

// Teardown removes the pod's namespace and veth (the route goes with the
// veth). Missing pieces are not an error.
func (n Net) Teardown(ctx context.Context, uid types.UID) {
	ns, veth := PodNetNames(uid)
	_ = n.ipNode(ctx, "link", "del", veth)
	_ = runIP(ctx, "netns", "del", ns)
}

// NetnsExists reports whether the named network namespace exists.
func NetnsExists(name string) bool {
	return exec.Command("ip", "netns", "pids", name).Run() == nil
}
