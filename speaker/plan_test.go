package speaker

import (
	"fmt"
	"net/netip"
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ironlb/ironlb/api/v1beta1"
	"github.com/ironlb/ironlb/internal/config"
	"github.com/ironlb/ironlb/internal/election"
)

func mustParse(t *testing.T, pools []v1beta1.IPAddressPool, ads []v1beta1.L2Advertisement) *config.Config {
	t.Helper()
	cfg, err := config.Parse(pools, ads, nil)
	if err != nil {
		t.Fatalf("config.Parse: %v", err)
	}
	return cfg
}

func pool(name string, addrs ...string) v1beta1.IPAddressPool {
	return v1beta1.IPAddressPool{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "metallb-system"},
		Spec: v1beta1.IPAddressPoolSpec{Addresses: addrs}}
}

func l2ad(name string, pools []string, ifaces []string, nodeSel map[string]string) v1beta1.L2Advertisement {
	ad := v1beta1.L2Advertisement{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "metallb-system"},
		Spec: v1beta1.L2AdvertisementSpec{IPAddressPools: pools, Interfaces: ifaces}}
	if nodeSel != nil {
		ad.Spec.NodeSelectors = []metav1.LabelSelector{{MatchLabels: nodeSel}}
	}
	return ad
}

func lbService(ips ...string) *corev1.Service {
	s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns1", Name: "web"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyCluster}}
	for _, ip := range ips {
		s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: ip})
	}
	return s
}

func readySlice(node string) *discoveryv1.EndpointSlice {
	t := true
	return &discoveryv1.EndpointSlice{Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.10.1.2"}, NodeName: &node,
		Conditions: discoveryv1.EndpointConditions{Ready: &t}}}}
}

func TestInputs(t *testing.T) {
	cfg := mustParse(t,
		[]v1beta1.IPAddressPool{pool("p1", "172.18.255.200-172.18.255.250", "fc00:f853:ccd:e799::/124"), pool("p2", "192.168.10.0/24")},
		[]v1beta1.L2Advertisement{
			l2ad("ad1", []string{"p1"}, []string{"eth0"}, nil),
			l2ad("ad2", []string{"p1"}, []string{"eth1"}, map[string]string{"zone": "b"}),
		})
	nodes := map[string]*corev1.Node{}
	for _, n := range []string{"w1", "w2", "w3"} {
		nodes[n] = &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}
	}
	nodes["w2"].Labels = map[string]string{"zone": "b"}
	excluded := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "w4", Labels: map[string]string{corev1.LabelNodeExcludeBalancers: ""}}}
	nodes["w4"] = excluded
	snap := func(self string) Snapshot { return Snapshot{Config: cfg, Nodes: nodes, Self: self} }
	eps := []*discoveryv1.EndpointSlice{readySlice("w1")}
	dual := lbService("172.18.255.201", "fc00:f853:ccd:e799::3")

	t.Run("every speaker computes the same eligible nodes; each its own interfaces", func(t *testing.T) {
		for _, self := range []string{"w1", "w2", "w3"} {
			in := Inputs(snap(self), dual, eps)
			want := []netip.Addr{netip.MustParseAddr("172.18.255.201"), netip.MustParseAddr("fc00:f853:ccd:e799::3")}
			if in.Reason != "" || !reflect.DeepEqual(in.IPs, want) || in.Pool != "p1" || in.Key() != "172.18.255.201" {
				t.Fatalf("%s: %+v", self, in)
			}
			if !reflect.DeepEqual(in.Eligible, []string{"w1", "w2", "w3"}) {
				t.Errorf("%s: eligible %v, want w1-w3 (w4 is excluded)", self, in.Eligible)
			}
			wantIfaces := []string{"eth0"}
			if self == "w2" {
				wantIfaces = []string{"eth0", "eth1"}
			}
			if !in.Self || in.AllInterfaces || !reflect.DeepEqual(in.Interfaces, wantIfaces) {
				t.Errorf("%s: self %v interfaces %v all %v, want %v", self, in.Self, in.Interfaces, in.AllInterfaces, wantIfaces)
			}
		}
		if in := Inputs(snap("w4"), dual, eps); in.Self {
			t.Errorf("excluded w4 thinks it is eligible: %+v", in)
		}
	})

	t.Run("externalTrafficPolicy Local: only nodes with a ready endpoint", func(t *testing.T) {
		s := dual.DeepCopy()
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		if in := Inputs(snap("w1"), s, eps); !reflect.DeepEqual(in.Eligible, []string{"w1"}) {
			t.Fatalf("eligible %v, want [w1]", in.Eligible)
		}
	})

	t.Run("preferredNodeSelectors become scores, parsed from the CRs", func(t *testing.T) {
		prefAd := l2ad("ad1", []string{"p1"}, nil, nil)
		prefAd.Spec.PreferredNodeSelectors = []v1beta1.PreferredNodeSelector{
			{Weight: 80, Preference: metav1.LabelSelector{MatchLabels: map[string]string{"zone": "b"}}},
		}
		s := snap("w1")
		s.Config = mustParse(t, []v1beta1.IPAddressPool{pool("p1", "172.18.255.200-172.18.255.250", "fc00:f853:ccd:e799::/124")}, []v1beta1.L2Advertisement{prefAd})
		if in := Inputs(s, dual, eps); !reflect.DeepEqual(in.Scores, map[string]int64{"w2": 80}) {
			t.Fatalf("scores %v, want w2: 80", in.Scores)
		}
		if in := Inputs(snap("w1"), dual, eps); in.Scores != nil {
			t.Fatalf("scores %v without preferences", in.Scores)
		}
	})

	cases := []struct {
		name   string
		svc    *corev1.Service
		snap   Snapshot
		reason string
	}{
		{"deleted", nil, snap("w1"), ReasonServiceDeleted},
		{"not a load balancer", func() *corev1.Service {
			s := lbService("172.18.255.201")
			s.Spec.Type = corev1.ServiceTypeClusterIP
			return s
		}(), snap("w1"), ReasonNotLoadBalancer},
		{"other class", func() *corev1.Service {
			s := lbService("172.18.255.201")
			c := "other"
			s.Spec.LoadBalancerClass = &c
			return s
		}(), snap("w1"), ReasonOtherClass},
		{"no IP yet", lbService(), snap("w1"), ReasonNoIPAllocated},
		{"garbage IP", lbService("not-an-ip"), snap("w1"), ReasonInvalidIP},
		{"IP in no pool", lbService("10.99.0.1"), snap("w1"), ReasonIPNotAllowed},
		{"pool without advertisement", lbService("192.168.10.5"), snap("w1"), election.ReasonNoMatchingAdvertisement},
		{"no config yet", lbService("172.18.255.201"), Snapshot{Nodes: nodes, Self: "w1"}, ReasonNoConfig},
		{"no endpoints", dual, snap("w1"), election.ReasonNoReadyEndpoints},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := eps
			if tc.name == "no endpoints" {
				e = nil
			}
			in := Inputs(tc.snap, tc.svc, e)
			if in.Reason != tc.reason || len(in.Eligible) != 0 {
				t.Fatalf("Inputs = %+v, want reason %q", in, tc.reason)
			}
		})
	}

	t.Run("class filter", func(t *testing.T) {
		s := lbService("172.18.255.201")
		c := "ironlb"
		s.Spec.LoadBalancerClass = &c
		sn := snap("w1")
		sn.LoadBalancerClass = "ironlb"
		if in := Inputs(sn, s, eps); in.Reason != "" {
			t.Fatalf("service of our class not announceable: %+v", in)
		}
	})
}

func st(name, node string, age time.Duration) *v1beta1.ServiceL2Status {
	return &v1beta1.ServiceL2Status{
		ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(time.Unix(1000, 0).Add(-age)),
			Labels: map[string]string{v1beta1.ServiceL2StatusNodeLabel: node}},
		Status: v1beta1.MetalLBServiceL2Status{Node: node},
	}
}

func TestPlanStatus(t *testing.T) {
	names := func(s []*v1beta1.ServiceL2Status) []string {
		var out []string
		for _, x := range s {
			out = append(out, x.Name)
		}
		return out
	}
	mineOld, mineNew, other := st("l2-old", "w1", time.Hour), st("l2-new", "w1", time.Minute), st("l2-other", "w2", time.Hour)

	p := PlanStatus([]*v1beta1.ServiceL2Status{mineNew, other, mineOld}, "w1", true, "", nil)
	if p.Keep != mineOld || !reflect.DeepEqual(names(p.Delete), []string{"l2-other", "l2-new"}) {
		t.Errorf("owner: keep %v delete %v; want keep l2-old, delete the other node's and the duplicate", p.Keep, names(p.Delete))
	}
	p = PlanStatus([]*v1beta1.ServiceL2Status{mineNew, other}, "w1", false, "", nil)
	if p.Keep != nil || !reflect.DeepEqual(names(p.Delete), []string{"l2-new"}) {
		t.Errorf("non-owner: keep %v delete %v; want only its own deleted", p.Keep, names(p.Delete))
	}
	p = PlanStatus([]*v1beta1.ServiceL2Status{other}, "w1", true, "", nil)
	if p.Keep != nil || !reflect.DeepEqual(names(p.Delete), []string{"l2-other"}) {
		t.Errorf("new owner: keep %v delete %v; want create (no keep) and delete the old owner's", p.Keep, names(p.Delete))
	}
	fresh := st("l2-fresh", "w1", 0)
	fresh.Status.Node = "" // created, status not written yet
	if p := PlanStatus([]*v1beta1.ServiceL2Status{fresh}, "w1", true, "", nil); p.Keep != fresh {
		t.Errorf("an own object without status yet must be kept, got %+v", p)
	}
	// The object this speaker created last beats older ones, which may be
	// deleted objects a lagging cache still shows: keeping one of those and
	// deleting the new one re-creates a record on every reconcile.
	p = PlanStatus([]*v1beta1.ServiceL2Status{mineOld, fresh, mineNew}, "w1", true, "l2-fresh", nil)
	if p.Keep != fresh || !reflect.DeepEqual(names(p.Delete), []string{"l2-old", "l2-new"}) {
		t.Errorf("confirmed: keep %v delete %v; want keep l2-fresh, delete the older ones", p.Keep, names(p.Delete))
	}
	// The new owner leaves a live member's record to it: that node deletes
	// its own once it stops announcing (deleting it first made the lagging
	// node write it again); a gone member's is deleted.
	live := func(n string) bool { return n == "w2" }
	p = PlanStatus([]*v1beta1.ServiceL2Status{other}, "w1", true, "", live)
	if p.Keep != nil || len(p.Delete) != 0 {
		t.Errorf("new owner, old owner live: keep %v delete %v; want create, delete nothing", p.Keep, names(p.Delete))
	}
	p = PlanStatus([]*v1beta1.ServiceL2Status{other, mineNew}, "w1", true, "", func(string) bool { return false })
	if p.Keep != mineNew || !reflect.DeepEqual(names(p.Delete), []string{"l2-other"}) {
		t.Errorf("new owner, old owner gone: keep %v delete %v; want the old owner's deleted", p.Keep, names(p.Delete))
	}
	// Several address slots: another slot's announcer keeps its object
	// (the caller's cleans says it announces one).
	w3 := st("l2-w3", "w3", time.Hour)
	slot := func(n string) bool { return n == "w3" }
	p = PlanStatus([]*v1beta1.ServiceL2Status{other, w3, mineNew}, "w1", true, "", slot)
	if p.Keep != mineNew || !reflect.DeepEqual(names(p.Delete), []string{"l2-other"}) {
		t.Errorf("slots: keep %v delete %v; want w3's kept (it announces another slot), the gone w2's deleted", p.Keep, names(p.Delete))
	}
	// A non-owner deletes its own objects, the confirmed one too.
	p = PlanStatus([]*v1beta1.ServiceL2Status{fresh, other}, "w1", false, "l2-fresh", nil)
	if p.Keep != nil || !reflect.DeepEqual(names(p.Delete), []string{"l2-fresh"}) {
		t.Errorf("non-owner with a confirmed object: keep %v delete %v; want it deleted", p.Keep, names(p.Delete))
	}
}

func TestStatusInterfaces(t *testing.T) {
	if got := StatusInterfaces(Want{AllInterfaces: true}); got != nil {
		t.Errorf("all interfaces: %v, want none listed", got)
	}
	got := StatusInterfaces(Want{Interfaces: []string{"eth0", "eth1"}})
	if !reflect.DeepEqual(got, []v1beta1.InterfaceInfo{{Name: "eth0"}, {Name: "eth1"}}) {
		t.Errorf("got %v", got)
	}
}

// BenchmarkInputs measures one Service's input (eligible nodes) on a 100-node
// cluster with 3 advertisements: the per-Service cost of a Service, endpoint,
// node-label or configuration change. Membership events no longer cost it:
// they go to internal/ownership (BenchmarkMembershipEvent there).
//
//	go test ./speaker -run '^$' -bench BenchmarkInputs -benchmem
func BenchmarkInputs(b *testing.B) {
	var ads []v1beta1.L2Advertisement
	for i, zone := range []string{"a", "b", "c"} {
		ads = append(ads, l2ad(fmt.Sprintf("ad%d", i), []string{"p1"}, nil, map[string]string{"zone": zone}))
	}
	cfg, err := config.Parse([]v1beta1.IPAddressPool{pool("p1", "10.0.0.0/16")}, ads, nil)
	if err != nil {
		b.Fatal(err)
	}
	nodes := map[string]*corev1.Node{}
	for i := 0; i < 100; i++ {
		n := fmt.Sprintf("node-%03d", i)
		nodes[n] = &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n, Labels: map[string]string{"zone": []string{"a", "b", "c"}[i%3]}}}
	}
	snap := Snapshot{Config: cfg, Nodes: nodes, Self: "node-000"}
	svc := lbService("10.0.3.7")
	eps := []*discoveryv1.EndpointSlice{readySlice("node-001")}
	b.ReportAllocs()
	for b.Loop() {
		Inputs(snap, svc, eps)
	}
}
