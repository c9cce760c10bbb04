//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ironlb/ironlb/api/v1beta1"
	"github.com/ironlb/ironlb/internal/service"
	"github.com/ironlb/ironlb/internal/statusview"
	"github.com/ironlb/ironlb/speaker"
	"github.com/ironlb/ironlb/test/lab/labctl"
)

// The spread Service's pool: three addresses per family are taken (the
// lowest), of four; every node, the control plane too, may announce them.
const (
	spreadPool4 = "172.18.254.184/30"
	spreadPool6 = "fc00:f853:ccd:e793:fffe::120/126"
	spreadCount = 3
	spreadName  = "e2e-spread"
	spreadHost  = "spread" // published as spread.lb.lab
)

// requireDNS returns the lab whose DNS host (BIND and external-dns) runs,
// starting it on a lab brought up without it; in CI a lab that cannot run
// it fails the test.
func requireDNS(t *testing.T, e *Env) *labctl.Lab {
	t.Helper()
	skip := skipOutsideCI(t)
	lh, ok := e.Hosts.(LabHosts)
	if !ok {
		skip("needs the lab's DNS host (E2E_HOSTS=lab)")
	}
	if !lh.Lab.DNSRunning() {
		if err := lh.Lab.EnableDNS(ctxT(t)); err != nil {
			skip("the lab's DNS host does not run and cannot be started (%v): `make external-dns`, then `make lab-up LAB_DNS=1`", err)
		}
	}
	return lh.Lab
}

// ipAnnouncers maps each IP of the Service to the node whose ServiceL2Status
// lists it (speaker.ParseStatusIPs of the ironlb.io/ips annotation).
func (e *Env) ipAnnouncers(ctx context.Context, ns, name string) (map[string][]string, error) {
	var l2 v1beta1.ServiceL2StatusList
	if err := e.C.List(ctx, &l2, client.InNamespace(Namespace)); err != nil {
		return nil, err
	}
	out := map[string][]string{}
	for _, s := range l2.Items {
		if s.Status.ServiceName != name || s.Status.ServiceNamespace != ns {
			continue
		}
		for _, ip := range speaker.ParseStatusIPs(s.Annotations[v1beta1.ServiceL2StatusIPsAnnotation]) {
			out[ip.String()] = append(out[ip.String()], s.Status.Node)
		}
	}
	return out, nil
}

// TestSpreadOneService (issue 23): a Service asking for three addresses per
// family (ironlb.io/address-count) on four nodes gets three IPv4 (and
// IPv6) addresses, each slot announced by a different node: mypc resolves
// each to a different MAC, ServiceL2Status and `kubectl ironlb status` name
// each IP's announcer. external-dns publishes them all in the lab's DNS,
// and curl by name from mypc lands on several nodes. Killing one announcer
// moves only its IP, to the fourth node, while requests to the other two
// IPs do not fail once.
func TestSpreadOneService(t *testing.T) {
	e := requireEnv(t)
	killer, ok := e.Hosts.(NodeKiller)
	if !ok {
		t.Skip("these hosts cannot kill a node (the lab can)")
	}
	lab := requireDNS(t, e)
	applyWalkthrough(t, e)
	ctx := ctxT(t)
	tp := e.topology(t)
	watch := tp.nodes // until the announcers are known
	dumpOnFailure(t, e, func() []string { return watch })
	if len(tp.nodes) < spreadCount+1 {
		t.Fatalf("nodes %v: the test needs %d (make lab-up LAB_WORKERS=3 or more)", tp.nodes, spreadCount+1)
	}

	dual := e.hasIPv6(t)
	pools := []string{spreadPool4}
	if dual {
		pools = append(pools, spreadPool6)
	}
	sp := e.newSpreadService(t, spreadName, spreadCount, pools, map[string]string{labctl.HostnameAnnotation: labctl.DNSFQDN(spreadHost)})
	f, ips, owner := sp.f, sp.ips, sp.owner
	watch = slices.Compact(slices.Sorted(maps.Values(owner)))
	t.Logf("announcers: %v", owner)
	macs, err := e.nodeMACs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, ip := range ips {
		e.waitNeighbour(t, ip, owner[ip], macs) // a different MAC per slot
	}

	// kubectl ironlb status: one row per slot, its announcer, no problem.
	plugin := e.buildPlugin(t)
	poll(t, 2*time.Minute, "kubectl ironlb status names each slot's announcer", func() (bool, string) {
		run := e.status(t, plugin, "-o", "json", "default/"+spreadName)
		var r statusview.Report
		if err := json.Unmarshal([]byte(run.stdout), &r); err != nil {
			return false, fmt.Sprintf("-o json: %v\n%s", err, run)
		}
		got := map[string]string{}
		for _, s := range r.Services {
			for _, ip := range s.IPs {
				got[ip] = s.Announcer
			}
		}
		return run.code == 0 && maps.Equal(got, owner), fmt.Sprintf("announcers %v, want %v\n%s", got, owner, run)
	})

	// external-dns publishes every ingress address; curl by name spreads.
	var all []netip.Addr
	for _, ip := range ips {
		all = append(all, netip.MustParseAddr(ip))
	}
	name := labctl.DNSFQDN(spreadHost)
	if got, err := lab.WaitDNS(ctx, name, all, 2*time.Minute); err != nil {
		t.Fatalf("external-dns did not publish %s as %v: %v (last answer %v; logs: .lab/logs/external-dns.log)", name, all, err, got)
	}
	hit := map[string]int{} // announcer -> requests by name it carried
	const byName = 30
	for range byName {
		r, err := e.Hosts.Run(ctx, ClientHost, "curl", "-4", "-s", "-o", "/dev/null", "--max-time", "2", "-w", "%{remote_ip}", "http://"+strings.TrimSuffix(name, ".")+"/")
		if err != nil || r.Code != 0 {
			t.Fatalf("curl %s from %s: %v %s", name, ClientHost, err, r.Stderr)
		}
		hit[owner[strings.TrimSpace(r.Stdout)]]++
	}
	t.Logf("curl by name, %d requests: by announcer %v", byName, hit)
	if len(hit) < 2 || hit[""] > 0 {
		t.Errorf("curl by name from %s reached the nodes %v, want several announcers (BIND answers in random order)", ClientHost, hit)
	}

	// Kill one announcer (a worker: the control plane runs the API
	// server): only its slot moves, to the node that held none.
	var victim, free string
	for _, n := range tp.nodes {
		if !slices.Contains(slices.Collect(maps.Values(owner)), n) {
			free = n
		} else if n != tp.controlPlane && victim == "" {
			victim = n
		}
	}
	watch = append(watch, free)
	e.placeBackends(t, f, victim) // its backend would take requests through the others down with it
	var moved, kept []string      // IPv4 addresses
	for _, ip := range ips {
		if !netip.MustParseAddr(ip).Is4() {
			continue
		}
		if owner[ip] == victim {
			moved = append(moved, ip)
		} else {
			kept = append(kept, ip)
		}
	}
	var traffic []*traffic
	for _, ip := range kept {
		e.waitServing(t, ip)
		traffic = append(traffic, e.startTrafficEvery(t, ip, 50*time.Millisecond))
	}
	speakerBefore := containerID(e.speakerPodObj(t, victim), "speaker")
	restored := false
	t.Cleanup(func() {
		if !restored {
			_ = killer.RestoreNode(context.Background(), victim)
		}
	})
	t.Logf("killing %s (announcer of %v); %s holds none", victim, moved, free)
	if err := killer.KillNode(ctx, victim); err != nil {
		t.Fatalf("killing %s: %v", victim, err)
	}
	poll(t, 2*time.Minute, fmt.Sprintf("%v announced from %s", moved, free), func() (bool, string) {
		by, err := e.ipAnnouncers(ctx, "default", spreadName)
		if err != nil {
			return false, err.Error()
		}
		for ip, n := range owner {
			w := n
			if n == victim {
				w = free
			}
			if !slices.Equal(by[ip], []string{w}) {
				return false, fmt.Sprintf("%s listed by %v, want %s only", ip, by[ip], w)
			}
		}
		return true, ""
	})
	for _, ip := range moved {
		e.waitNeighbour(t, ip, free, macs)
		e.waitServing(t, ip)
	}
	time.Sleep(settle) // traffic on the kept IPs past the failover
	for i, tr := range traffic {
		requireUnbroken(t, fmt.Sprintf("%s (announced from %s) while %s was killed", kept[i], owner[kept[i]], victim), tr.stop(t))
	}
	for _, ip := range kept {
		if mac, line, err := e.neighMAC(ctx, ip); err != nil || mac != macs[owner[ip]] {
			t.Errorf("%s's neighbour entry for %s: %q (err %v), want %s's MAC: it moved", ClientHost, ip, line, err, owner[ip])
		}
	}
	if err := killer.RestoreNode(ctx, victim); err != nil {
		t.Fatalf("restoring %s: %v", victim, err)
	}
	restored = true
	e.waitSpeakerRestarted(t, victim, speakerBefore)

	// Fewer eligible nodes than slots: two slots share a node, which an
	// AddressesShareNode event says; once the nodes are eligible again the
	// node holding two gives one away. Every move is planned: no
	// connection to any of the addresses breaks.
	e.spreadBack(t, sp, macs)
}

// spreadBack restricts the Service's advertisement to two of its announcers,
// so that its three slots share two nodes, then lifts the restriction: the
// slots spread over three nodes again, by planned moves that break no
// keep-alive connection and fail no new one.
func (e *Env) spreadBack(t *testing.T, sp *spreadService, macs map[string]string) {
	ctx := ctxT(t)
	now := e.waitSpread(t, sp, spreadCount)
	var v4 []string
	for _, ip := range sp.ips {
		if netip.MustParseAddr(ip).Is4() {
			v4 = append(v4, ip)
		}
	}
	// Keep the announcers of the first two slots: the third slot moves to
	// one of them by a planned move, drained there for --drain-timeout,
	// during which it stays (a second hop would break the connections
	// still forwarded); the slot that node already had is the one given
	// away when the restriction is lifted.
	keep := []string{now[v4[0]], now[v4[1]]}
	var traffic []*traffic
	for _, ip := range v4 {
		traffic = append(traffic, e.startTrafficEvery(t, ip, 100*time.Millisecond))
	}
	// One change of the advertisement, not a label per node: labelled one
	// after the other, a node could take the slot for a moment and hand it
	// on, and the second new owner would forward its connections to a node
	// that has no state for them (a drain is one hop).
	t.Logf("advertising %s from %v only: %d slots on 2 nodes", sp.f.name, keep, spreadCount)
	e.setAdvertisementNodes(t, sp.f.name+"-adv", keep)
	shared := e.waitSpread(t, sp, len(keep))
	t.Logf("announcers while restricted: %v", shared)
	var svc corev1.Service
	if err := e.C.Get(ctx, client.ObjectKey{Namespace: "default", Name: sp.f.name}, &svc); err != nil {
		t.Fatal(err)
	}
	poll(t, time.Minute, "an AddressesShareNode event on "+sp.f.name, func() (bool, string) {
		evs, err := e.serviceEvents(ctx, "default", sp.f.name, speaker.EventAddressesShareNode)
		if err != nil {
			return false, err.Error()
		}
		evs = slices.DeleteFunc(evs, func(ev corev1.Event) bool { return ev.InvolvedObject.UID != svc.UID })
		return len(evs) > 0, fmt.Sprintf("%d events", len(evs))
	})
	e.setAdvertisementNodes(t, sp.f.name+"-adv", nil)
	back := e.waitSpread(t, sp, spreadCount)
	t.Logf("announcers once every node is advertised again: %v", back)
	for _, ip := range v4 {
		e.waitNeighbour(t, ip, back[ip], macs)
	}
	time.Sleep(settle)
	for i, tr := range traffic {
		requireUnbroken(t, fmt.Sprintf("%s while its Service's slots shared nodes and spread back", v4[i]), tr.stop(t))
	}
}

// waitSpread waits until every address of the spread Service is announced
// (ServiceL2Status), each slot by one node, over exactly nodes distinct
// nodes, and returns the announcer of each address.
func (e *Env) waitSpread(t testing.TB, sp *spreadService, nodes int) map[string]string {
	t.Helper()
	ctx := ctxT(t)
	slots := speakerSlots(t, sp.ips)
	owner := map[string]string{}
	poll(t, 2*time.Minute, fmt.Sprintf("%s's %d address slots announced from %d nodes", sp.f.name, len(slots), nodes), func() (bool, string) {
		by, err := e.ipAnnouncers(ctx, "default", sp.f.name)
		if err != nil {
			return false, err.Error()
		}
		clear(owner)
		for _, sl := range slots {
			n := by[sl[0]]
			if len(n) != 1 {
				return false, fmt.Sprintf("%s listed by %v", sl[0], by)
			}
			for _, ip := range sl {
				if !slices.Equal(by[ip], n) {
					return false, fmt.Sprintf("slot %v split: %v", sl, by)
				}
				owner[ip] = n[0]
			}
		}
		got := slices.Compact(slices.Sorted(maps.Values(owner)))
		return len(got) == nodes, fmt.Sprintf("announcers %v", by)
	})
	return owner
}

// spreadService is a Service spread over several nodes (newSpreadService).
type spreadService struct {
	f     *lbFixture
	ips   []string          // its ingress addresses
	owner map[string]string // address -> the node announcing it
}

// newSpreadService creates a pool of pools (autoAssign off) advertised from
// every node, the control plane too, a whoami backend on each worker, and
// the LoadBalancer Service name asking for count addresses per family of
// the pool's families (dual-stack when it has both), with annotations; it
// waits until each address slot is announced by its own node.
func (e *Env) newSpreadService(tb testing.TB, name string, count int, pools []string, annotations map[string]string) *spreadService {
	tb.Helper()
	ctx := ctxT(tb)
	tp := e.topology(tb)
	if len(tp.nodes) < count {
		tb.Fatalf("nodes %v: %d addresses on distinct nodes need %d (LAB_WORKERS)", tp.nodes, count, count)
	}
	pool := name + "-pool"
	e.create(tb, &v1beta1.IPAddressPool{ObjectMeta: metav1.ObjectMeta{Name: pool, Namespace: Namespace},
		Spec: v1beta1.IPAddressPoolSpec{Addresses: pools, AutoAssign: ptr(false)}})
	e.create(tb, &v1beta1.L2Advertisement{ObjectMeta: metav1.ObjectMeta{Name: name + "-adv", Namespace: Namespace},
		Spec: v1beta1.L2AdvertisementSpec{IPAddressPools: []string{pool}}})
	svc := lbService(name, name, "")
	svc.Annotations["metallb.io/address-pool"] = pool
	svc.Annotations[service.AnnotationAddressCount] = fmt.Sprint(count)
	maps.Copy(svc.Annotations, annotations)
	want := count * len(pools)
	if len(pools) == 2 {
		policy := corev1.IPFamilyPolicyRequireDualStack
		svc.Spec.IPFamilyPolicy = &policy
		svc.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
	} else if netip.MustParsePrefix(pools[0]).Addr().Is6() {
		singleStack(svc, corev1.IPv6Protocol)
	}
	e.create(tb, svc)
	sp := &spreadService{f: &lbFixture{name: name, workers: without(tp.nodes, tp.controlPlane), proxies: tp.nodes}, owner: map[string]string{}}
	e.placeBackends(tb, sp.f, "")

	poll(tb, 2*time.Minute, fmt.Sprintf("%s gets %d addresses", name, want), func() (bool, string) {
		var s corev1.Service
		if err := e.C.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, &s); err != nil {
			return false, err.Error()
		}
		sp.ips = sp.ips[:0]
		for _, in := range s.Status.LoadBalancer.Ingress {
			sp.ips = append(sp.ips, in.IP)
		}
		return len(sp.ips) == want, fmt.Sprintf("status %v", sp.ips)
	})
	sp.owner = e.waitSpread(tb, sp, count)
	return sp
}

// speakerSlots groups the Service's IPs into its address slots as the
// speaker does (speaker.Input.Slots): the i-th of each family together.
func speakerSlots(t testing.TB, ips []string) [][]string {
	t.Helper()
	var in speaker.Input
	for _, ip := range ips {
		in.IPs = append(in.IPs, netip.MustParseAddr(ip))
	}
	var out [][]string
	for _, s := range in.Slots() {
		var sl []string
		for _, ip := range s.IPs {
			sl = append(sl, ip.String())
		}
		out = append(out, sl)
	}
	return out
}

// hasIPv6 reports whether some node has an IPv6 InternalIP.
func (e *Env) hasIPv6(t testing.TB) bool {
	t.Helper()
	var nodes corev1.NodeList
	if err := e.C.List(context.Background(), &nodes); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes.Items {
		for _, a := range n.Status.Addresses {
			if ip, err := netip.ParseAddr(a.Address); a.Type == corev1.NodeInternalIP && err == nil && ip.Is6() {
				return true
			}
		}
	}
	return false
}

// setAdvertisementNodes makes the L2Advertisement name select only nodes
// (nil: every node), in one update.
func (e *Env) setAdvertisementNodes(t testing.TB, name string, nodes []string) {
	t.Helper()
	var adv v1beta1.L2Advertisement
	if err := e.C.Get(ctxT(t), client.ObjectKey{Namespace: Namespace, Name: name}, &adv); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(adv.DeepCopy())
	adv.Spec.NodeSelectors = nil
	if nodes != nil {
		adv.Spec.NodeSelectors = []metav1.LabelSelector{{MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: corev1.LabelHostname, Operator: metav1.LabelSelectorOpIn, Values: nodes},
		}}}
	}
	if err := e.C.Patch(ctxT(t), &adv, patch); err != nil {
		t.Fatalf("L2Advertisement %s: selecting %v: %v", name, nodes, err)
	}
}
