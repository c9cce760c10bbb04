//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ironlb/ironlb/api/v1beta1"
)

const excludeLBLabel = "node.kubernetes.io/exclude-from-external-load-balancers"

// TestControllerRestarts restarts the controller Deployment 5 times: no
// Service's IP changes, and a Service created afterwards gets the next free
// address (the state was rebuilt from the Services' status).
func TestControllerRestarts(t *testing.T) {
	e := requireEnv(t)
	applyWalkthrough(t, e)
	dumpOnFailure(t, e, nil)
	ctx := ctxT(t)
	snapshot := func() map[string]string {
		var svcs corev1.ServiceList
		if err := e.C.List(ctx, &svcs); err != nil {
			t.Fatal(err)
		}
		m := map[string]string{}
		for _, s := range svcs.Items {
			if s.Spec.Type == corev1.ServiceTypeLoadBalancer {
				var ips []string
				for _, in := range s.Status.LoadBalancer.Ingress {
					ips = append(ips, in.IP)
				}
				m[s.Namespace+"/"+s.Name] = strings.Join(ips, ",")
			}
		}
		return m
	}
	before := snapshot()
	for i := 1; i <= 5; i++ {
		if out, err := e.kubectl(ctx, "", "rollout", "restart", "deployment/"+Release+"-controller", "-n", Namespace); err != nil {
			t.Fatalf("restart %d: %v\n%s", i, err, out)
		}
		if out, err := e.kubectl(ctx, "", "rollout", "status", "deployment/"+Release+"-controller", "-n", Namespace, "--timeout=3m"); err != nil {
			t.Fatalf("restart %d: rollout status: %v\n%s", i, err, out)
		}
		if after := snapshot(); fmt.Sprint(after) != fmt.Sprint(before) {
			t.Fatalf("after controller restart %d the Services' IPs changed:\nbefore %v\nafter  %v", i, before, after)
		}
	}
	// A new Service after the restarts gets a free address, not a taken one.
	taken := map[string]bool{}
	for _, v := range before {
		for _, ip := range strings.Split(v, ",") {
			taken[ip] = true
		}
	}
	e.create(t, lbService("e2e-after-restart", "webpod", ""))
	ip := e.waitIngressIP(t, "default", "e2e-after-restart")
	if taken[ip] {
		t.Errorf("a Service created after the restarts got %s, already held by another Service (%v)", ip, before)
	}
	time.Sleep(2 * time.Second)
	after := snapshot()
	delete(after, "default/e2e-after-restart")
	if fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("IPs changed:\nbefore %v\nafter  %v", before, after)
	}
}

// TestETPLocal: a Service with externalTrafficPolicy Local is announced only
// from a node with a ready endpoint; when the endpoint moves to another node,
// the announcement follows it.
func TestETPLocal(t *testing.T) {
	e := requireEnv(t)
	applyWalkthrough(t, e)
	var watch []string
	dumpOnFailure(t, e, func() []string { return watch })
	tp := e.topology(t)
	workers := without(tp.nodes, tp.controlPlane)
	ip := tp.freeIP(t)
	macs, err := e.nodeMACs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	svc := lbService("e2e-local", "e2e-local", ip)
	svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	for i, podNode := range workers[:2] {
		watch = append(watch, podNode)
		pod := whoamiPod(fmt.Sprintf("e2e-local-pod%d", i+1), "e2e-local", podNode)
		e.create(t, pod)
		if i == 0 {
			e.create(t, svc)
			e.waitIngressIP(t, "default", "e2e-local")
		}
		e.waitAnnouncer(t, "default", "e2e-local", podNode)
		e.waitServing(t, ip)
		e.waitNeighbour(t, ip, podNode, macs)
		t.Logf("e2e-local (%s): announced from %s, the only node with an endpoint", ip, podNode)
		if err := e.C.Delete(context.Background(), pod); err != nil {
			t.Fatal(err)
		}
	}
}

// TestExcludeLBLabel: labelling the announcer
// node.kubernetes.io/exclude-from-external-load-balancers moves the IP to
// another node; removing the label moves nothing (no failback).
func TestExcludeLBLabel(t *testing.T) {
	e := requireEnv(t)
	applyWalkthrough(t, e)
	var watch []string
	dumpOnFailure(t, e, func() []string { return watch })
	tp := e.topology(t)
	ip := tp.freeIP(t)
	e.create(t, lbService("e2e-exclude", "webpod", ip))
	e.waitIngressIP(t, "default", "e2e-exclude")
	first := e.waitAnnouncer(t, "default", "e2e-exclude", "")
	watch = []string{first}
	macs, err := e.nodeMACs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	e.waitNeighbour(t, ip, first, macs)

	setLabel := func(on bool) { setExcludeLabel(t, e, first, on) }
	setLabel(true)
	t.Cleanup(func() { setLabel(false) })
	var second string
	poll(t, 2*time.Minute, "e2e-exclude announced from a node other than the labelled "+first, func() (bool, string) {
		nodes, err := e.announcers(context.Background(), "default", "e2e-exclude")
		if err != nil {
			return false, err.Error()
		}
		if len(nodes) != 1 || nodes[0] == first {
			return false, fmt.Sprintf("announcers %v", nodes)
		}
		second = nodes[0]
		return true, ""
	})
	watch = append(watch, second)
	e.waitNeighbour(t, ip, second, macs)
	e.waitServing(t, ip)

	mv := e.watchMoves(t, "default", "e2e-exclude", second)
	setLabel(false)
	time.Sleep(settle)
	if mc := mv.stop(t); mc.StatusMoves != 0 || mc.EventMoves != 0 {
		t.Errorf("removing the label from %s moved e2e-exclude (%s) again (target: no failback): %d ServiceL2Status moves, %d nodeAssigned moves (timeline logged above)", first, ip, mc.StatusMoves, mc.EventMoves)
	}
	e.curlOnce(context.Background(), ip)
	if mac, line, err := e.neighMAC(context.Background(), ip); err != nil || mac != macs[second] {
		t.Errorf("%s's neighbour entry for %s: %q (err %v), want %s's MAC %s", ClientHost, ip, line, err, second, macs[second])
	}
}

// TestL2AdvertisementNodeSelector: an advertisement with nodeSelectors
// announces its pool only from the selected node; pointed at another node,
// the announcement follows.
func TestL2AdvertisementNodeSelector(t *testing.T) {
	e := requireEnv(t)
	applyWalkthrough(t, e)
	var watch []string
	dumpOnFailure(t, e, func() []string { return watch })
	tp := e.topology(t)
	workers := without(tp.nodes, tp.controlPlane)
	ip := "172.18.254.10"
	pool := &v1beta1.IPAddressPool{
		ObjectMeta: metav1.ObjectMeta{Name: "e2e-selector-pool", Namespace: Namespace},
		Spec:       v1beta1.IPAddressPoolSpec{Addresses: []string{"172.18.254.10-172.18.254.19"}, AutoAssign: ptr(false)},
	}
	selectNode := func(node string) []metav1.LabelSelector {
		return []metav1.LabelSelector{{MatchLabels: map[string]string{"kubernetes.io/hostname": node}}}
	}
	adv := &v1beta1.L2Advertisement{
		ObjectMeta: metav1.ObjectMeta{Name: "e2e-selector-adv", Namespace: Namespace},
		Spec:       v1beta1.L2AdvertisementSpec{IPAddressPools: []string{pool.Name}, NodeSelectors: selectNode(workers[1])},
	}
	e.create(t, pool)
	e.create(t, adv)
	svc := lbService("e2e-selector", "webpod", ip)
	svc.Annotations["metallb.io/address-pool"] = pool.Name
	e.create(t, svc)
	if got := e.waitIngressIP(t, "default", "e2e-selector"); got != ip {
		t.Fatalf("e2e-selector got %s, requested %s", got, ip)
	}
	macs, err := e.nodeMACs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for i, selected := range []string{workers[1], workers[2]} {
		watch = append(watch, selected)
		if i > 0 {
			var cur v1beta1.L2Advertisement
			if err := e.C.Get(context.Background(), client.ObjectKeyFromObject(adv), &cur); err != nil {
				t.Fatal(err)
			}
			patch := client.MergeFrom(cur.DeepCopy())
			cur.Spec.NodeSelectors = selectNode(selected)
			if err := e.C.Patch(context.Background(), &cur, patch); err != nil {
				t.Fatal(err)
			}
		}
		e.waitAnnouncer(t, "default", "e2e-selector", selected)
		e.waitServing(t, ip)
		e.waitNeighbour(t, ip, selected, macs)
		t.Logf("e2e-selector (%s): announced from the selected %s", ip, selected)
	}
}

// TestIPSharing: a TCP and a UDP Service sharing one IP
// (metallb.io/allow-shared-ip) get it and are announced from one node.
func TestIPSharing(t *testing.T) {
	e := requireEnv(t)
	applyWalkthrough(t, e)
	var watch []string
	dumpOnFailure(t, e, func() []string { return watch })
	ip := e.topology(t).freeIP(t)
	tcp := lbService("e2e-share-tcp", "webpod", ip)
	tcp.Annotations["metallb.io/allow-shared-ip"] = "e2e-share"
	udp := lbService("e2e-share-udp", "webpod", ip)
	udp.Annotations["metallb.io/allow-shared-ip"] = "e2e-share"
	udp.Spec.Ports = []corev1.ServicePort{{Name: "dns", Port: 53, TargetPort: intstr.FromInt32(53), Protocol: corev1.ProtocolUDP}}
	e.create(t, tcp)
	e.create(t, udp)
	for _, name := range []string{"e2e-share-tcp", "e2e-share-udp"} {
		if got := e.waitIngressIP(t, "default", name); got != ip {
			t.Fatalf("%s got %s, want the shared %s", name, got, ip)
		}
	}
	a := e.waitAnnouncer(t, "default", "e2e-share-tcp", "")
	b := e.waitAnnouncer(t, "default", "e2e-share-udp", "")
	watch = []string{a, b}
	if a != b {
		t.Errorf("the shared IP %s is announced from %s (TCP service) and %s (UDP service), want one node", ip, a, b)
	}
	e.waitServing(t, ip)
	macs, err := e.nodeMACs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	e.waitNeighbour(t, ip, a, macs)
}

// TestOverlappingPoolRejected: the webhook rejects a pool overlapping the
// walkthrough's, naming both.
func TestOverlappingPoolRejected(t *testing.T) {
	e := requireEnv(t)
	applyWalkthrough(t, e)
	dumpOnFailure(t, e, nil)
	ctx := ctxT(t)
	manifest := `apiVersion: metallb.io/v1beta1
kind: IPAddressPool
metadata:
  name: e2e-overlap
  namespace: metallb-system
spec:
  addresses:
  - 172.18.255.240-172.18.255.245
`
	out, err := e.kubectl(ctx, manifest, "apply", "-f", "-")
	if err == nil {
		_, _ = e.kubectl(ctx, "", "delete", "ipaddresspool", "-n", Namespace, "e2e-overlap", "--ignore-not-found")
		t.Fatalf("an overlapping pool was accepted:\n%s", out)
	}
	msg := err.Error()
	t.Logf("kubectl apply said: %s", msg)
	for _, want := range []string{"denied the request", "e2e-overlap", "my-ippool", "overlap"} {
		if !strings.Contains(msg, want) {
			t.Errorf("the rejection does not mention %q: %s", want, msg)
		}
	}
}

// TestRequestedIPOutsidePool: a Service requesting an address outside every
// pool gets a Warning event and stays pending; nothing else changes.
func TestRequestedIPOutsidePool(t *testing.T) {
	e := requireEnv(t)
	ips := applyWalkthrough(t, e)
	dumpOnFailure(t, e, nil)
	ctx := ctxT(t)
	e.create(t, lbService("e2e-outside", "webpod", "172.18.100.1"))
	var warning string
	poll(t, time.Minute, "a Warning event on e2e-outside", func() (bool, string) {
		evs, err := e.serviceEvents(ctx, "default", "e2e-outside", "")
		if err != nil {
			return false, err.Error()
		}
		for _, ev := range evs {
			if ev.Type == corev1.EventTypeWarning {
				warning = ev.Reason + ": " + ev.Message
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d events, none a Warning", len(evs))
	})
	t.Logf("event: %s", warning)
	if !strings.Contains(warning, "172.18.100.1") {
		t.Errorf("the warning does not name the requested address: %s", warning)
	}
	// Still pending a while later, and the walkthrough's IPs are unchanged.
	time.Sleep(3 * time.Second)
	if ip, err := e.ingressIP(ctx, "default", "e2e-outside"); err != nil || ip != "" {
		t.Errorf("e2e-outside: ingress %q (err %v), want pending", ip, err)
	}
	for i, s := range walkthroughServices {
		if ip, _ := e.ingressIP(ctx, "default", s); ip != ips[i] {
			t.Errorf("%s: IP changed from %s to %s", s, ips[i], ip)
		}
	}
	if nodes, _ := e.announcers(ctx, "default", "e2e-outside"); len(nodes) != 0 {
		t.Errorf("e2e-outside is announced by %v", nodes)
	}
}

func ptr[T any](v T) *T { return &v }

// TestL2AdvertisementInterfaces: an advertisement limited to eth0 announces
// there and says so in ServiceL2Status; one limited to an interface no node
// has is not answered, and the announcer reports announceFailed (MetalLB).
func TestL2AdvertisementInterfaces(t *testing.T) {
	e := requireEnv(t)
	applyWalkthrough(t, e)
	var watch []string
	dumpOnFailure(t, e, func() []string { return watch })
	ctx := ctxT(t)
	macs, err := e.nodeMACs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, iface, ip string
		works           bool
	}{
		{"e2e-if-eth0", "eth0", "172.18.254.30", true},
		{"e2e-if-none", "ilbnone0", "172.18.254.40", false},
	} {
		pool := &v1beta1.IPAddressPool{
			ObjectMeta: metav1.ObjectMeta{Name: c.name + "-pool", Namespace: Namespace},
			Spec:       v1beta1.IPAddressPoolSpec{Addresses: []string{c.ip + "/32"}, AutoAssign: ptr(false)},
		}
		adv := &v1beta1.L2Advertisement{
			ObjectMeta: metav1.ObjectMeta{Name: c.name + "-adv", Namespace: Namespace},
			Spec:       v1beta1.L2AdvertisementSpec{IPAddressPools: []string{pool.Name}, Interfaces: []string{c.iface}},
		}
		e.create(t, pool)
		e.create(t, adv)
		svc := lbService(c.name, "webpod", "")
		svc.Annotations["metallb.io/address-pool"] = pool.Name
		e.create(t, svc)
		if got := e.waitIngressIP(t, "default", c.name); got != c.ip {
			t.Fatalf("%s got %s, want %s", c.name, got, c.ip)
		}
		node := e.waitAnnouncer(t, "default", c.name, "")
		watch = append(watch, node)
		if c.works {
			e.waitServing(t, c.ip)
			e.waitNeighbour(t, c.ip, node, macs)
			poll(t, time.Minute, "ServiceL2Status interfaces [eth0]", func() (bool, string) {
				var l2 v1beta1.ServiceL2StatusList
				if err := e.C.List(ctx, &l2, client.InNamespace(Namespace), client.MatchingLabels{"metallb.io/service-name": c.name}); err != nil {
					return false, err.Error()
				}
				if len(l2.Items) == 0 {
					return false, "no ServiceL2Status"
				}
				if s := l2.Items[0]; len(s.Status.Interfaces) != 1 || s.Status.Interfaces[0].Name != "eth0" {
					return false, fmt.Sprintf("interfaces %v", s.Status.Interfaces)
				}
				return true, ""
			})
			continue
		}
		poll(t, time.Minute, "an announceFailed event on "+c.name, func() (bool, string) {
			evs, err := e.serviceEvents(ctx, "default", c.name, "announceFailed")
			if err != nil {
				return false, err.Error()
			}
			if len(evs) == 0 {
				return false, "none yet"
			}
			t.Logf("%s: %s: %s", c.name, evs[0].Reason, evs[0].Message)
			return true, ""
		})
		if _, ok := e.curlOnce(ctx, c.ip); ok {
			t.Errorf("%s (%s) answers although its advertisement's interface %s exists on no node", c.name, c.ip, c.iface)
		}
		if mac, line, _ := e.neighMAC(ctx, c.ip); mac != "" {
			t.Errorf("%s: %s resolved %s: %s", c.name, ClientHost, c.ip, line)
		}
	}
}
