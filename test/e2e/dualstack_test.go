//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ironlb/ironlb/api/v1beta1"
	"github.com/ironlb/ironlb/test/e2e/probe"
)

// The dual-stack tests (issue 11): IPv6 carried through ironlb and kube-proxy from mypc,
// and NDP as a client's kernel sees it on the wire. They need a dual-stack cluster (the
// lab is one unless LAB_IP_FAMILY=ipv4).

// dualStackFamilies are the families each Service of examples/dualstack must get, in order.
var dualStackFamilies = map[string][]corev1.IPFamily{
	"svc-v6":      {corev1.IPv6Protocol},
	"svc-prefer":  {corev1.IPv4Protocol, corev1.IPv6Protocol},
	"svc-require": {corev1.IPv4Protocol, corev1.IPv6Protocol},
}

// applyDualStack applies examples/dualstack and removes it when the test ends.
func applyDualStack(t *testing.T, e *Env) {
	t.Helper()
	ctx := ctxT(t)
	dir := filepath.Join(e.Root, "examples", "dualstack")
	for _, f := range []string{"pool.yaml", "services.yaml"} {
		path := filepath.Join(dir, f)
		poll(t, time.Minute, f+" applied", func() (bool, string) {
			out, err := e.kubectl(ctx, "", "apply", "-f", path)
			return err == nil, out
		})
		t.Cleanup(func() {
			if out, err := e.kubectl(context.Background(), "", "delete", "--ignore-not-found", "-f", path); err != nil {
				t.Errorf("deleting %s: %v\n%s", f, err, out)
			}
		})
	}
}

// TestDualStackWalkthrough applies examples/dualstack next to the walkthrough: each
// Service gets the families its ipFamilyPolicy asks for, `kubectl get svc` shows them,
// 100 of 100 requests from mypc to every IP succeed with both backends seen, mypc's
// neighbour entry for every IP is the MAC of the node ServiceL2Status names, and the IPv4
// and IPv6 addresses of one Service are announced by the same node.
func TestDualStackWalkthrough(t *testing.T) {
	e := requireEnv(t)
	e.requireIPv6(t)
	applyWalkthrough(t, e)
	applyDualStack(t, e)
	var watch []string
	dumpOnFailure(t, e, func() []string { return watch })
	ctx := ctxT(t)
	macs, err := e.nodeMACs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	names := slices.Sorted(maps.Keys(dualStackFamilies))
	ingress := map[string][]string{}
	for _, name := range names {
		want := dualStackFamilies[name]
		poll(t, 2*time.Minute, fmt.Sprintf("%s: one ingress IP per family %v", name, want), func() (bool, string) {
			var svc corev1.Service
			if err := e.C.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, &svc); err != nil {
				return false, err.Error()
			}
			var ips []string
			var got []corev1.IPFamily
			for _, in := range svc.Status.LoadBalancer.Ingress {
				ips = append(ips, in.IP)
				if a, err := netip.ParseAddr(in.IP); err == nil && a.Is6() {
					got = append(got, corev1.IPv6Protocol)
				} else {
					got = append(got, corev1.IPv4Protocol)
				}
			}
			ingress[name] = ips
			return slices.Equal(got, want), fmt.Sprintf("ingress %v, spec.ipFamilies %v", ips, svc.Spec.IPFamilies)
		})
	}
	out, err := e.kubectl(ctx, "", "get", "svc", "-n", "default")
	if err != nil {
		t.Fatalf("kubectl get svc: %v\n%s", err, out)
	}
	t.Logf("kubectl get svc:\n%s", out)
	for _, name := range names {
		if !strings.Contains(out, strings.Join(ingress[name], ",")) {
			t.Errorf("kubectl get svc does not show %s's EXTERNAL-IP %s", name, strings.Join(ingress[name], ","))
		}
	}

	for _, name := range names {
		owner := e.waitAnnouncer(t, "default", name, "")
		watch = append(watch, owner)
		for _, ip := range ingress[name] {
			e.waitServing(t, ip) // kube-proxy's rules follow the Service within its sync period
			seen, failed, err := e.curlMany(ctx, ip, 100)
			if err != nil {
				t.Fatal(err)
			}
			if len(failed) > 0 || len(seen) != len(walkthroughPods) {
				t.Errorf("%s %s: %d of 100 requests failed (%v), backends seen %v (want both webpods)", name, ip, len(failed), failed, seen)
			}
			mac, line, err := e.neighMAC(ctx, ip)
			if err != nil || mac != macs[owner] {
				t.Errorf("%s %s: %s's neighbour entry %q (err %v), want the announcer %s's MAC %s", name, ip, ClientHost, line, err, owner, macs[owner])
			}
		}
		t.Logf("%s: %v announced from %s (%s), 100/100 requests to each", name, ingress[name], owner, macs[owner])
	}
}

// TestNDPOnTheWire checks ironlb's NDP the way clients' kernels use it, on an IPv6
// Service whose candidate nodes each carry a second global address listed before the
// lab's (MetalLB #2685 answered from the wrong address):
//   - a multicast Neighbor Solicitation is answered with the owner's MAC, Solicited set,
//     Router never set;
//   - the owner has joined the IP's solicited-node group;
//   - the client's unicast re-validation of a STALE entry (NUD probes to the owner's MAC,
//     with multicast re-solicitation turned off) makes the entry REACHABLE (MetalLB #2920);
//   - on a takeover the new owner's unsolicited advertisement (Override set, Router not)
//     moves the client's existing entry to its MAC, with no traffic from the client;
//   - no node has an address stuck tentative or failed duplicate address detection.
func TestNDPOnTheWire(t *testing.T) {
	e := requireEnv(t)
	e.requireIPv6(t)
	applyWalkthrough(t, e)
	var watch []string
	dumpOnFailure(t, e, func() []string { return watch })
	ctx := ctxT(t)
	tp := e.topology(t)
	for _, n := range without(tp.nodes, tp.controlPlane) {
		e.addFirstIPv6(t, n)
	}
	f := e.newLBFixture(t, "e2e-ndp", "fc00:f853:ccd:e793:fffe::110")
	watch = []string{f.owner}

	t.Run("multicast solicitation", func(t *testing.T) {
		recs, out, err := e.arpFromClient(ctx, f.ip, 300*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) == 0 {
			t.Fatalf("no Neighbor Advertisement for %s:\n%s", f.ip, out)
		}
		solicited := 0
		for _, r := range recs {
			// The owner may still be repeating its unsolicited announcements (Override
			// set) of the new IP; solicited answers carry Override clear, as MetalLB's.
			if r.MAC.String() != f.macs[f.owner] || r.Router || (!r.Solicited && !r.Override) {
				t.Errorf("advertisement %+v: want the owner %s's MAC %s, not Router, Override on unsolicited ones; all:\n%s", r, f.owner, f.macs[f.owner], out)
			}
			if r.Solicited {
				solicited++
			}
		}
		if solicited == 0 {
			t.Errorf("no solicited advertisement answered the solicitations for %s:\n%s", f.ip, out)
		}
	})

	t.Run("solicited-node group", func(t *testing.T) {
		a := netip.MustParseAddr(f.ip).As16()
		group := netip.AddrFrom16([16]byte{0xff, 0x02, 10: 0, 11: 1, 12: 0xff, 13: a[13], 14: a[14], 15: a[15]})
		r, err := e.Hosts.Run(ctx, f.owner, "ip", "-6", "maddr", "show", "dev", "eth0")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(r.Stdout, group.String()) {
			t.Errorf("%s has not joined %s's solicited-node group %s:\n%s", f.owner, f.ip, group, r.Stdout)
		}
	})

	t.Run("unicast NUD", func(t *testing.T) {
		e.unicastNUD(t, f.ip, f.macs[f.owner])
	})

	t.Run("takeover", func(t *testing.T) {
		// Advertisements before and during the move, one solicitation every 2 s: the
		// solicited answers (Override clear) cannot flip an existing entry, so a flip
		// proves the unsolicited one did.
		if e.Probe == "" {
			t.Skip("no e2e-probe on the client (E2E_PROBE)")
		}
		loop := e.runProbe("--arp", f.ip, "--interval", "2s")
		t.Cleanup(func() { _ = loop.end() })
		e.curlOnce(ctx, f.ip) // the client's entry exists and points at the owner
		e.setExcludeLabel(t, f.owner, true)
		t.Cleanup(func() { e.setExcludeLabel(t, f.owner, false) })
		var next string
		poll(t, 2*time.Minute, f.name+" announced from a node other than the excluded "+f.owner, func() (bool, string) {
			nodes, err := e.announcers(ctx, "default", f.name)
			if err != nil {
				return false, err.Error()
			}
			if len(nodes) != 1 || nodes[0] == f.owner {
				return false, fmt.Sprintf("announcers %v", nodes)
			}
			next = nodes[0]
			return true, ""
		})
		watch = append(watch, next)
		poll(t, 30*time.Second, fmt.Sprintf("%s's neighbour entry for %s = %s's MAC %s without traffic", ClientHost, f.ip, next, f.macs[next]), func() (bool, string) {
			mac, line, err := e.neighMAC(ctx, f.ip)
			if err != nil {
				return false, err.Error()
			}
			return mac == f.macs[next], line
		})
		loop.finish(t)
		var unsolicited int
		for _, r := range probe.ParseARP(loop.res.Stdout) {
			if r.Router {
				t.Errorf("advertisement with the Router flag: %+v", r)
			}
			if r.MAC.String() == f.macs[next] && !r.Solicited && r.Override {
				unsolicited++
			}
		}
		if unsolicited == 0 {
			t.Errorf("no unsolicited Override advertisement from %s (%s) seen by %s:\n%s", next, f.macs[next], ClientHost, loop.res.Stdout)
		}
		e.waitServing(t, f.ip)
	})

	t.Run("no DAD trouble", func(t *testing.T) {
		for _, n := range tp.nodes {
			r, err := e.Hosts.Run(ctx, n, "ip", "-6", "addr", "show", "dev", "eth0")
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(r.Stdout, "dadfailed") || strings.Contains(r.Stdout, "tentative") {
				t.Errorf("%s: an address failed or is still in duplicate address detection:\n%s", n, r.Stdout)
			}
		}
	})
}

// addFirstIPv6 gives node a second global IPv6 address in another prefix, listed before the
// lab's (Linux lists a newer address of the same scope first), and removes it at the end.
func (e *Env) addFirstIPv6(t *testing.T, node string) {
	t.Helper()
	ctx := ctxT(t)
	ip := netip.MustParseAddr(e.nodeIPOf(t, node)).As4()
	extra := fmt.Sprintf("fd00:99::%d/64", ip[3])
	if r, err := e.Hosts.Run(ctx, node, "ip", "-6", "addr", "replace", extra, "dev", "eth0", "nodad"); err != nil || r.Code != 0 {
		t.Fatalf("adding %s to %s: %v %s", extra, node, err, r.Stderr)
	}
	t.Cleanup(func() {
		if r, err := e.Hosts.Run(context.Background(), node, "ip", "-6", "addr", "del", extra, "dev", "eth0"); err != nil || r.Code != 0 {
			t.Errorf("removing %s from %s: %v %s", extra, node, err, r.Stderr)
		}
	})
	r, err := e.Hosts.Run(ctx, node, "ip", "-6", "-o", "addr", "show", "dev", "eth0", "scope", "global")
	if err != nil {
		t.Fatal(err)
	}
	if first, _, _ := strings.Cut(r.Stdout, "\n"); !strings.Contains(first, "fd00:99::") {
		t.Fatalf("%s: %s is not the first global address, so the test would not test that case:\n%s", node, extra, r.Stdout)
	}
}

// unicastNUD makes mypc's neighbour entry for ip STALE (with mac), turns multicast
// re-solicitation off and sends one UDP datagram: the kernel then re-validates the entry
// with unicast Neighbor Solicitations to mac only, so the entry turns REACHABLE only if
// the owner answers those (UDP gives no upper-layer reachability confirmation).
func (e *Env) unicastNUD(t *testing.T, ip, mac string) {
	t.Helper()
	ctx := ctxT(t)
	const knobs = "net.ipv6.neigh.eth0.mcast_resolicit net.ipv6.neigh.eth0.app_solicit net.ipv6.neigh.eth0.delay_first_probe_time"
	saved, err := e.client(ctx, "sysctl -e "+knobs+" | sed 's/ = /=/'")
	if err != nil || saved.Code != 0 {
		t.Fatalf("reading %s's neighbour settings: %v %s", ClientHost, err, saved.Stderr)
	}
	t.Cleanup(func() {
		_, _ = e.client(context.Background(), "sysctl -q -w "+strings.Join(strings.Fields(saved.Stdout), " "))
	})
	script := fmt.Sprintf(`set -e
sysctl -q -w net.ipv6.neigh.eth0.mcast_resolicit=0 net.ipv6.neigh.eth0.app_solicit=0 net.ipv6.neigh.eth0.delay_first_probe_time=1
ip -6 neigh replace %[1]s lladdr %[2]s dev eth0 nud stale
ip -6 neigh show to %[1]s
bash -c 'echo probe > /dev/udp/%[1]s/9'`, ip, mac)
	if r, err := e.client(ctx, script); err != nil || r.Code != 0 || !strings.Contains(r.Stdout, "STALE") {
		t.Fatalf("making %s's entry for %s STALE: %v %q %q", ClientHost, ip, err, r.Stdout, r.Stderr)
	}
	poll(t, 20*time.Second, fmt.Sprintf("%s's STALE entry for %s re-validated by unicast NUD (REACHABLE, %s)", ClientHost, ip, mac), func() (bool, string) {
		r, err := e.Hosts.Run(ctx, ClientHost, "ip", "-6", "-s", "neigh", "show", "to", ip)
		if err != nil {
			return false, err.Error()
		}
		line := strings.TrimSpace(r.Stdout)
		if strings.Contains(line, "FAILED") {
			t.Fatalf("the unicast probes to %s went unanswered: %s", mac, line)
		}
		return strings.Contains(line, "REACHABLE") && strings.Contains(line, mac), line
	})
}

// setExcludeLabel puts the exclude-from-external-load-balancers label on node or takes it off.
func (e *Env) setExcludeLabel(t testing.TB, node string, on bool) {
	t.Helper()
	var n corev1.Node
	if err := e.C.Get(context.Background(), client.ObjectKey{Name: node}, &n); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(n.DeepCopy())
	if on {
		n.Labels[excludeLBLabel] = ""
	} else {
		delete(n.Labels, excludeLBLabel)
	}
	if err := e.C.Patch(context.Background(), &n, patch); err != nil {
		t.Fatal(err)
	}
}

// TestIPv6PoolOverlapsClusterNetworks: pools inside the cluster's own IPv6 Service network
// or a node's IPv6 pod network are refused by the webhook, naming pool, field, value and
// the network (the envtest corpus, test/adversarial, covers the rest of the IPv6 cases on an
// IPv4-only API server).
func TestIPv6PoolOverlapsClusterNetworks(t *testing.T) {
	e := requireEnv(t)
	e.requireIPv6(t)
	ctx := ctxT(t)
	var svcNet, podNet netip.Prefix
	var cidrs networkingv1.ServiceCIDRList
	if err := e.C.List(ctx, &cidrs); err != nil {
		t.Fatal(err)
	}
	for _, c := range cidrs.Items {
		for _, s := range c.Spec.CIDRs {
			if p, err := netip.ParsePrefix(s); err == nil && p.Addr().Is6() {
				svcNet = p
			}
		}
	}
	var nodes corev1.NodeList
	if err := e.C.List(ctx, &nodes); err != nil {
		t.Fatal(err)
	}
	node := ""
	for _, n := range nodes.Items {
		for _, s := range n.Spec.PodCIDRs {
			if p, err := netip.ParsePrefix(s); err == nil && p.Addr().Is6() {
				podNet, node = p, n.Name
			}
		}
	}
	if !svcNet.IsValid() || !podNet.IsValid() {
		t.Fatalf("dual-stack cluster without an IPv6 Service network (%v) or IPv6 pod CIDR (%v)", svcNet, podNet)
	}
	for _, c := range []struct {
		name, addr string
		want       []string
	}{
		{"e2e-v6-svc-overlap", netip.PrefixFrom(svcNet.Addr(), 120).String(), []string{"Service network", svcNet.String()}},
		{"e2e-v6-pod-overlap", podNet.String(), []string{fmt.Sprintf("pod network of node %q", node)}},
	} {
		pool := &v1beta1.IPAddressPool{
			ObjectMeta: metav1.ObjectMeta{Name: c.name, Namespace: Namespace},
			Spec:       v1beta1.IPAddressPoolSpec{Addresses: []string{c.addr}, AutoAssign: ptr(false)},
		}
		err := e.C.Create(ctx, pool)
		if err == nil {
			_ = e.C.Delete(context.Background(), pool)
			t.Errorf("pool %s with %s (inside the cluster's networks) was accepted", c.name, c.addr)
			continue
		}
		for _, want := range append([]string{fmt.Sprintf("IPAddressPool %q", c.name), "spec.addresses[0]", c.addr}, c.want...) {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("pool %s: error %q lacks %q", c.name, err, want)
			}
		}
	}
}
