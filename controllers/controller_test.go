package controllers_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/ironlb/ironlb/api/v1beta1"
	"github.com/ironlb/ironlb/controllers"
	"github.com/ironlb/ironlb/internal/service"
)

const (
	annoPool      = "metallb.io/ip-allocated-from-pool"
	annoIPs       = "metallb.io/loadBalancerIPs"
	annoShared    = "metallb.io/allow-shared-ip"
	annoLegacyIPs = "metallb.universe.tf/loadBalancerIPs"
	annoAddrPool  = "metallb.io/address-pool"
)

// The seed walkthrough: one pool, three Services created one after another get
// .200, .201, .202; a restart of the controller moves nothing and is silent; the
// pool status counts them; a fourth Service after the restart gets .203.
func TestWalkthroughAndRestart(t *testing.T) {
	h := newHarness(t)
	h.pool("first-pool", "172.18.255.200-172.18.255.250")
	h.l2adv("example")
	h.start()

	for i, want := range []string{"172.18.255.200", "172.18.255.201", "172.18.255.202"} {
		name := fmt.Sprintf("svc%d", i+1)
		h.create(h.service(name, nil))
		svc := h.waitIPs(name, want)
		if got := svc.Annotations[annoPool]; got != "first-pool" {
			t.Errorf("%s: annotation %s = %q, want first-pool", name, annoPool, got)
		}
		if m := svc.Status.LoadBalancer.Ingress[0].IPMode; m == nil || *m != corev1.LoadBalancerIPModeVIP {
			t.Errorf("%s: ipMode = %v, want VIP", name, m)
		}
		h.waitEvent(name, corev1.EventTypeNormal, controllers.ReasonIPAllocated, want, "first-pool")
	}
	p := h.waitPoolStatus("first-pool", 3, 48, 0, 0)
	if c := meta.FindStatusCondition(p.Status.Conditions, controllers.ConditionReady); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("pool Ready condition = %+v, want True", c)
	}

	// Restart: a new controller rebuilds from status before handling anything.
	before := map[string]string{}
	for _, n := range []string{"svc1", "svc2", "svc3"} {
		before[n] = h.get(n).ResourceVersion
	}
	h.stop()
	h.start()
	h.create(h.service("svc4", nil))
	h.waitIPs("svc4", "172.18.255.203")
	for i, n := range []string{"svc1", "svc2", "svc3"} {
		svc := h.waitIPs(n, fmt.Sprintf("172.18.255.20%d", i))
		if svc.ResourceVersion != before[n] {
			t.Errorf("%s was written after the restart (resourceVersion %s -> %s)", n, before[n], svc.ResourceVersion)
		}
		if c := h.countEvents(n, controllers.ReasonIPAllocated); c != 1 {
			t.Errorf("%s: %d IPAllocated events, want exactly 1 (restart must be silent)", n, c)
		}
	}
	h.waitPoolStatus("first-pool", 4, 47, 0, 0)
	if v := gauge(t, "metallb_allocator_addresses_in_use_total", "first-pool"); v != 4 {
		t.Errorf("metallb_allocator_addresses_in_use_total{pool=first-pool} = %v, want 4", v)
	}
	if v := gauge(t, "metallb_allocator_addresses_total", "first-pool"); v != 51 {
		t.Errorf("metallb_allocator_addresses_total{pool=first-pool} = %v, want 51", v)
	}
}

// Two Services, TCP/53 and UDP/53, share one requested IP under one sharing key; a
// third one wanting TCP/53 on the same IP is refused with the port named.
func TestSharingTCPAndUDP(t *testing.T) {
	h := newHarness(t)
	h.pool("first-pool", "172.18.255.200-172.18.255.250")
	h.start()
	dns := func(name string, proto corev1.Protocol) *corev1.Service {
		svc := h.service(name, map[string]string{annoShared: "dns", annoIPs: "172.18.255.210"},
			corev1.ServicePort{Name: "dns", Port: 53, Protocol: proto, TargetPort: intstr.FromInt32(53)})
		svc.Spec.Selector = map[string]string{"app": "dns"}
		return svc
	}
	h.create(dns("dns-tcp", corev1.ProtocolTCP))
	h.create(dns("dns-udp", corev1.ProtocolUDP))
	h.waitIPs("dns-tcp", "172.18.255.210")
	h.waitIPs("dns-udp", "172.18.255.210")

	h.create(dns("dns-tcp2", corev1.ProtocolTCP))
	h.waitEvent("dns-tcp2", corev1.EventTypeWarning, controllers.ReasonAllocationFailed, "172.18.255.210", "TCP/53")
	if got := ingress(h.get("dns-tcp2")); len(got) != 0 {
		t.Errorf("dns-tcp2 status = %v, want none", got)
	}
	h.waitPoolStatus("first-pool", 1, 50, 0, 0)
}

// RequireDualStack with a pool holding both families gets one IP of each, primary
// family first.
func TestDualStack(t *testing.T) {
	h := newHarness(t)
	h.pool("mixed", "172.18.255.200-172.18.255.250", "fc00:f853:ccd:e799::/124")
	h.start()
	svc := h.service("dual", nil)
	svc.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicyRequireDualStack)
	svc.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol, corev1.IPv4Protocol}
	h.create(svc)
	h.waitIPs("dual", "fc00:f853:ccd:e799::", "172.18.255.200")
	h.waitPoolStatus("mixed", 1, 50, 1, 15)
}

// A requested IP outside every pool and an unparsable annotation both leave the
// status empty and say why in a Warning event; a legacy annotation works and is
// reported once as deprecated.
func TestRefusedRequests(t *testing.T) {
	h := newHarness(t)
	h.pool("first-pool", "172.18.255.200-172.18.255.250")
	h.start()

	h.create(h.service("outside", map[string]string{annoIPs: "192.168.77.7"}))
	h.create(h.service("garbage", map[string]string{annoIPs: "not-an-ip"}))
	h.create(h.service("legacy", map[string]string{annoLegacyIPs: "172.18.255.220"}))
	h.waitEvent("outside", corev1.EventTypeWarning, controllers.ReasonAllocationFailed, "192.168.77.7")
	h.waitEvent("garbage", corev1.EventTypeWarning, controllers.ReasonAllocationFailed, annoIPs, "not-an-ip")
	h.waitIPs("legacy", "172.18.255.220")
	h.waitEvent("legacy", corev1.EventTypeWarning, controllers.ReasonDeprecatedAnnotation, annoLegacyIPs)

	// A later event for the same services must not repeat the warnings.
	for _, n := range []string{"outside", "garbage", "legacy"} {
		h.update(n, func(s *corev1.Service) { s.Labels = map[string]string{"touched": "yes"} })
	}
	h.create(h.service("after", nil))
	h.waitIPs("after", "172.18.255.200")
	for _, n := range []string{"outside", "garbage"} {
		if got := ingress(h.get(n)); len(got) != 0 {
			t.Errorf("%s status = %v, want none", n, got)
		}
		if c := h.countEvents(n, controllers.ReasonAllocationFailed); c != 1 {
			t.Errorf("%s: %d AllocationFailed events, want 1", n, c)
		}
	}
	if c := h.countEvents("legacy", controllers.ReasonDeprecatedAnnotation); c != 1 {
		t.Errorf("legacy: %d DeprecatedAnnotation events, want 1", c)
	}

	// Fixing the annotation allocates.
	h.update("garbage", func(s *corev1.Service) { s.Annotations[annoIPs] = "172.18.255.230" })
	h.waitIPs("garbage", "172.18.255.230")
}

// A bad annotation on a Service that already has an IP keeps the IP.
func TestBadAnnotationKeepsIP(t *testing.T) {
	h := newHarness(t)
	h.pool("first-pool", "172.18.255.200-172.18.255.250")
	h.start()
	h.create(h.service("svc", nil))
	h.waitIPs("svc", "172.18.255.200")
	h.update("svc", func(s *corev1.Service) { s.Annotations = map[string]string{annoAddrPool: "Bad_Pool!"} })
	h.waitEvent("svc", corev1.EventTypeWarning, controllers.ReasonAllocationFailed, annoAddrPool, "Bad_Pool!")
	h.waitIPs("svc", "172.18.255.200")
}

// Changing the type to ClusterIP releases the IP and clears what we wrote.
func TestTypeChangeReleases(t *testing.T) {
	h := newHarness(t)
	h.pool("first-pool", "172.18.255.200-172.18.255.250")
	h.start()
	h.create(h.service("svc", nil))
	h.waitIPs("svc", "172.18.255.200")
	h.update("svc", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeClusterIP
		s.Spec.AllocateLoadBalancerNodePorts = nil
	})
	h.eventually("status and annotation cleared", func() (bool, string) {
		s := h.get("svc")
		_, has := s.Annotations[annoPool]
		return len(s.Status.LoadBalancer.Ingress) == 0 && !has, fmt.Sprintf("ingress %v annotations %v", ingress(s), s.Annotations)
	})
	h.create(h.service("next", nil))
	h.waitIPs("next", "172.18.255.200")
	h.waitPoolStatus("first-pool", 1, 50, 0, 0)

	// Deleting releases too.
	if err := k8s.Delete(h.ctx, h.get("next")); err != nil {
		t.Fatal(err)
	}
	h.waitPoolStatus("first-pool", 0, 51, 0, 0)
}

// Shrinking the pool moves the Service whose IP left it, with a Warning; the others
// keep theirs.
func TestPoolShrinkMovesService(t *testing.T) {
	h := newHarness(t)
	pool := h.pool("first-pool", "172.18.255.200-172.18.255.250")
	h.start()
	for i := 1; i <= 3; i++ {
		name := fmt.Sprintf("svc%d", i)
		h.create(h.service(name, nil))
		h.waitIPs(name, fmt.Sprintf("172.18.255.%d", 199+i))
	}
	if err := k8s.Get(h.ctx, client.ObjectKeyFromObject(pool), pool); err != nil {
		t.Fatal(err)
	}
	pool.Spec.Addresses = []string{"172.18.255.201-172.18.255.250"}
	if err := k8s.Update(h.ctx, pool); err != nil {
		t.Fatal(err)
	}
	h.waitIPs("svc1", "172.18.255.203")
	h.waitEvent("svc1", corev1.EventTypeWarning, controllers.ReasonIPWithdrawn, "172.18.255.200", "172.18.255.203")
	h.waitIPs("svc2", "172.18.255.201")
	h.waitIPs("svc3", "172.18.255.202")
	h.waitPoolStatus("first-pool", 3, 47, 0, 0)
}

// An invalid configuration (a second pool overlapping the first; the webhook is off
// here) is refused: allocation continues from the last good one, the stale metric
// says so and the new pool's condition names the problem.
func TestInvalidConfigKeepsLastGood(t *testing.T) {
	h := newHarness(t)
	h.pool("first-pool", "172.18.255.200-172.18.255.250")
	h.start()
	h.create(h.service("svc1", nil))
	h.waitIPs("svc1", "172.18.255.200")
	h.pool("overlap", "172.18.255.240/28")
	h.eventually("overlap pool Ready=False", func() (bool, string) {
		var p v1beta1.IPAddressPool
		if err := k8s.Get(h.ctx, client.ObjectKey{Namespace: h.installNS, Name: "overlap"}, &p); err != nil {
			return false, err.Error()
		}
		c := meta.FindStatusCondition(p.Status.Conditions, controllers.ConditionReady)
		return c != nil && c.Status == metav1.ConditionFalse && strings.Contains(c.Message, "overlap"), fmt.Sprintf("%+v", c)
	})
	if v := gauge(t, "metallb_k8s_client_config_stale_bool", ""); v != 1 {
		t.Errorf("metallb_k8s_client_config_stale_bool = %v, want 1", v)
	}
	h.create(h.service("svc2", nil))
	h.waitIPs("svc2", "172.18.255.201")
	if err := k8s.Delete(h.ctx, &v1beta1.IPAddressPool{ObjectMeta: metav1.ObjectMeta{Namespace: h.installNS, Name: "overlap"}}); err != nil {
		t.Fatal(err)
	}
	h.eventually("stale metric back to 0", func() (bool, string) {
		v := gauge(t, "metallb_k8s_client_config_stale_bool", "")
		return v == 0, fmt.Sprint(v)
	})
	if v := gauge(t, "metallb_k8s_client_config_loaded_bool", ""); v != 1 {
		t.Errorf("metallb_k8s_client_config_loaded_bool = %v, want 1", v)
	}
}

// Services of another loadBalancerClass are left alone; with --lb-class only that
// class is served.
func TestLoadBalancerClass(t *testing.T) {
	h := newHarness(t, func(o *controllers.Options) { o.LoadBalancerClass = "ironlb.io/test" })
	h.pool("first-pool", "172.18.255.200-172.18.255.250")
	h.start()
	other := h.service("other", nil)
	other.Spec.LoadBalancerClass = ptr.To("example.com/other")
	h.create(other)
	h.create(h.service("classless", nil))
	ours := h.service("ours", nil)
	ours.Spec.LoadBalancerClass = ptr.To("ironlb.io/test")
	h.create(ours)
	h.waitIPs("ours", "172.18.255.200")
	for _, n := range []string{"other", "classless"} {
		if got := ingress(h.get(n)); len(got) != 0 {
			t.Errorf("%s status = %v, want none", n, got)
		}
	}
}

// The memberlist Secret is created with a random 32-byte key, owned by the
// controller Deployment; a restart keeps it, and a deleted one comes back
// with a new key (which the speakers rotate to).
func TestMemberlistSecret(t *testing.T) {
	t.Cleanup(controllers.SetMemberlistSecretCheck(200 * time.Millisecond))
	h := newHarness(t, func(o *controllers.Options) { o.DeploymentName = "ironlb-controller" })
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: h.installNS, Name: "ironlb-controller"},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "c"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "c"}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "ghcr.io/ironlb/ironlb"}}},
			},
		},
	}
	h.create(dep)
	h.start()
	var s corev1.Secret
	h.eventually("memberlist secret", func() (bool, string) {
		err := k8s.Get(h.ctx, client.ObjectKey{Namespace: h.installNS, Name: "ironlb-memberlist"}, &s)
		return err == nil, fmt.Sprint(err)
	})
	if n := len(s.Data[controllers.MemberlistSecretKey]); n != 32 {
		t.Errorf("secret key has %d bytes, want 32", n)
	}
	if len(s.OwnerReferences) != 1 || s.OwnerReferences[0].UID != dep.UID || s.OwnerReferences[0].Kind != "Deployment" {
		t.Errorf("owner references = %+v, want the deployment %s", s.OwnerReferences, dep.UID)
	}
	// A restart keeps the key.
	key := string(s.Data[controllers.MemberlistSecretKey])
	h.stop()
	h.start()
	h.pool("first-pool", "172.18.255.200-172.18.255.250")
	h.create(h.service("svc", nil))
	h.waitIPs("svc", "172.18.255.200") // the new controller is running
	if err := k8s.Get(h.ctx, client.ObjectKeyFromObject(&s), &s); err != nil {
		t.Fatal(err)
	}
	if string(s.Data[controllers.MemberlistSecretKey]) != key {
		t.Error("the memberlist key changed across a restart")
	}

	// Deleted, it comes back with a new key, owned as before.
	oldUID := s.UID
	if err := k8s.Delete(h.ctx, &s); err != nil {
		t.Fatal(err)
	}
	h.eventually("the deleted memberlist secret re-created", func() (bool, string) {
		err := k8s.Get(h.ctx, client.ObjectKeyFromObject(&s), &s)
		return err == nil && s.UID != oldUID, fmt.Sprint(err)
	})
	if got := s.Data[controllers.MemberlistSecretKey]; len(got) != 32 || string(got) == key {
		t.Errorf("re-created secret key has %d bytes (want 32), same as before: %v", len(got), string(got) == key)
	}
	if len(s.OwnerReferences) != 1 || s.OwnerReferences[0].UID != dep.UID {
		t.Errorf("re-created secret's owner references = %+v, want the deployment %s", s.OwnerReferences, dep.UID)
	}
}

// gauge reads one series of a metric from controller-runtime's registry (label
// pool when pool != "").
func gauge(t *testing.T, name, pool string) float64 {
	t.Helper()
	mfs, err := crmetrics.Registry.Gather()
	if err != nil {
		t.Fatalf("gathering metrics: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if pool != "" && labelValue(m, "pool") != pool {
				continue
			}
			if m.GetGauge() != nil {
				return m.GetGauge().GetValue()
			}
			return m.GetCounter().GetValue()
		}
	}
	t.Fatalf("metric %s{pool=%q} not found", name, pool)
	return 0
}

func labelValue(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// Two replicas with leader election: only the leader allocates; when it stops, the
// other takes over, rebuilds from status and continues without moving or
// duplicating an IP.
func TestLeaderElectionTwoReplicas(t *testing.T) {
	h := newHarness(t, func(o *controllers.Options) { o.LeaderElect = true })
	h.pool("first-pool", "172.18.255.200-172.18.255.250")
	h.start()
	stopB := h.startExtra()
	defer stopB()
	h.create(h.service("svc1", nil))
	h.waitIPs("svc1", "172.18.255.200")
	h.create(h.service("svc2", nil))
	h.waitIPs("svc2", "172.18.255.201")

	// Stop the first replica (it releases the Lease if it held it).
	h.stop()
	h.create(h.service("svc3", nil))
	h.waitIPs("svc3", "172.18.255.202")
	h.waitIPs("svc1", "172.18.255.200")
	h.waitIPs("svc2", "172.18.255.201")
	var lease coordinationv1.Lease
	if err := k8s.Get(h.ctx, client.ObjectKey{Namespace: h.installNS, Name: controllers.LeaderElectionID}, &lease); err != nil {
		t.Fatalf("reading the lease: %v", err)
	}
	if ptr.Deref(lease.Spec.HolderIdentity, "") == "" {
		t.Errorf("lease %s has no holder", controllers.LeaderElectionID)
	}
}

// A configuration that is invalid from the start is never used: nothing is
// allocated, the metric says no configuration is loaded, the pool's condition says
// why; fixing it starts allocation.
func TestInvalidConfigAtStart(t *testing.T) {
	h := newHarness(t)
	h.pool("a", "172.18.255.200-172.18.255.250")
	h.pool("b", "172.18.255.250/32")
	h.start()
	h.create(h.service("svc", nil))
	// The parser reports the overlap on one of the two pools; the condition of
	// that one must say so, the other one is simply not loaded.
	h.eventually("a pool Ready=False Invalid naming the overlap", func() (bool, string) {
		var why []string
		for _, name := range []string{"a", "b"} {
			var p v1beta1.IPAddressPool
			if err := k8s.Get(h.ctx, client.ObjectKey{Namespace: h.installNS, Name: name}, &p); err != nil {
				return false, err.Error()
			}
			c := meta.FindStatusCondition(p.Status.Conditions, controllers.ConditionReady)
			if c != nil && c.Status == metav1.ConditionFalse && c.Reason == controllers.ReasonInvalid && strings.Contains(c.Message, "overlaps") {
				return true, ""
			}
			why = append(why, fmt.Sprintf("%s: %+v", name, c))
		}
		return false, strings.Join(why, "; ")
	})
	if got := ingress(h.get("svc")); len(got) != 0 {
		t.Errorf("svc status = %v while no configuration is loaded, want none", got)
	}
	if err := k8s.Delete(h.ctx, &v1beta1.IPAddressPool{ObjectMeta: metav1.ObjectMeta{Namespace: h.installNS, Name: "b"}}); err != nil {
		t.Fatal(err)
	}
	h.waitIPs("svc", "172.18.255.200")
	h.waitPoolStatus("a", 1, 50, 0, 0)
}

// ironlb.io/address-count asks for several addresses per family: all of them
// are published, in address order per family; more than the pool can give is
// an AllocationFailed event naming the count, never a partial status; a bad
// value names the annotation; explicit addresses work too.
func TestAddressCount(t *testing.T) {
	h := newHarness(t)
	h.pool("small", "172.18.255.200-172.18.255.204", "fc00:f853:ccd:e799::/126")
	h.start()

	dual := h.service("three", map[string]string{service.AnnotationAddressCount: "3"})
	dual.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicyRequireDualStack)
	dual.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
	h.create(dual)
	h.waitIPs("three", "172.18.255.200", "172.18.255.201", "172.18.255.202",
		"fc00:f853:ccd:e799::", "fc00:f853:ccd:e799::1", "fc00:f853:ccd:e799::2")

	h.create(h.service("too-many", map[string]string{service.AnnotationAddressCount: "3"}))
	h.waitEvent("too-many", corev1.EventTypeWarning, controllers.ReasonAllocationFailed, service.AnnotationAddressCount, "3 IPv4 addresses")
	if got := ingress(h.get("too-many")); len(got) != 0 {
		t.Errorf("too-many status = %v, want none (no partial result)", got)
	}
	h.create(h.service("bad", map[string]string{service.AnnotationAddressCount: "17"}))
	h.waitEvent("bad", corev1.EventTypeWarning, controllers.ReasonAllocationFailed, service.AnnotationAddressCount, "17")

	h.create(h.service("explicit", map[string]string{annoIPs: "172.18.255.204,172.18.255.203"}))
	h.waitIPs("explicit", "172.18.255.204", "172.18.255.203") // as listed
	h.waitPoolStatus("small", 5, 0, 3, 1)
}
