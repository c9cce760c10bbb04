package election

import (
	"crypto/sha256"
	"fmt"
	"math/rand"
	"reflect"
	"slices"
	"testing"
	"testing/quick"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/ironlb/ironlb/internal/config"
)

func node(name string, lbls map[string]string, networkUnavailable bool) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: lbls}}
	if networkUnavailable {
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeNetworkUnavailable, Status: corev1.ConditionTrue}}
	}
	return n
}

func nodes(ns ...*corev1.Node) map[string]*corev1.Node {
	m := map[string]*corev1.Node{}
	for _, n := range ns {
		m[n.Name] = n
	}
	return m
}

func ptr[T any](v T) *T { return &v }

type ep struct {
	node           string
	ready, serving *bool
}

func slice(eps ...ep) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{}
	for _, e := range eps {
		var nn *string
		if e.node != "" {
			nn = ptr(e.node)
		}
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{"10.10.1.5"},
			NodeName:   nn,
			Conditions: discoveryv1.EndpointConditions{Ready: e.ready, Serving: e.serving},
		})
	}
	return s
}

func sel(t testing.TB, s string) labels.Selector {
	t.Helper()
	out, err := labels.Parse(s)
	if err != nil {
		t.Fatalf("parse selector %q: %v", s, err)
	}
	return out
}

func ad(name string, pools []string, nodeSel []labels.Selector, ifaces []string, svcSel []labels.Selector) *config.L2Advertisement {
	return &config.L2Advertisement{Name: name, Pools: sets.New(pools...), NodeSelectors: nodeSel, Interfaces: ifaces, ServiceSelectors: svcSel}
}

func svc(etp corev1.ServiceExternalTrafficPolicy, lbls, annotations map[string]string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns1", Name: "svc1", Labels: lbls, Annotations: annotations},
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, ExternalTrafficPolicy: etp},
	}
}

// bruteWinner is the rule written out independently: smallest hash wins.
func bruteWinner(ip string, ns []string) string {
	best := ""
	var bestHex string
	for _, n := range ns {
		h := fmt.Sprintf("%x", sha256.Sum256([]byte(n+"#"+ip)))
		if best == "" || h < bestHex {
			best, bestHex = n, h
		}
	}
	return best
}

// winner is Rank's first node, "" for no nodes.
func winner(ip string, ns []string) string {
	if r := Rank(ip, ns); len(r) > 0 {
		return r[0]
	}
	return ""
}

func TestWinnerMatchesRule(t *testing.T) {
	ns := []string{"myk8s-control-plane", "myk8s-worker", "myk8s-worker2", "myk8s-worker3"}
	for _, ip := range []string{"172.18.255.200", "172.18.255.201", "fc00:f853:ccd:e799::1", "10.0.0.1"} {
		want := bruteWinner(ip, ns)
		if got := winner(ip, ns); got != want {
			t.Errorf("Rank(%q)[0] = %q, want %q", ip, got, want)
		}
	}
	if got := winner("1.2.3.4", nil); got != "" {
		t.Errorf("winner(no nodes) = %q, want empty", got)
	}
}

func TestRankDeduplicates(t *testing.T) {
	got := Rank("1.2.3.4", []string{"a", "b", "a", "c", "b"})
	if len(got) != 3 {
		t.Fatalf("Rank kept duplicates: %v", got)
	}
}

// Removing a node that is not the winner never moves the IP; removing the winner
// moves it to the runner-up (the documented MetalLB behaviour).
func TestRankStability(t *testing.T) {
	ns := []string{"n1", "n2", "n3", "n4", "n5"}
	for i := 0; i < 50; i++ {
		ip := fmt.Sprintf("192.168.1.%d", i)
		r := Rank(ip, ns)
		for _, gone := range r[1:] {
			rest := slices.DeleteFunc(slices.Clone(ns), func(n string) bool { return n == gone })
			if w := winner(ip, rest); w != r[0] {
				t.Fatalf("ip %s: removing non-winner %s moved winner %s -> %s", ip, gone, r[0], w)
			}
		}
		rest := slices.DeleteFunc(slices.Clone(ns), func(n string) bool { return n == r[0] })
		if w := winner(ip, rest); w != r[1] {
			t.Fatalf("ip %s: removing winner %s gave %s, want runner-up %s", ip, r[0], w, r[1])
		}
	}
}

func TestEligible(t *testing.T) {
	all := []string{"cp", "w1", "w2", "w3"}
	baseNodes := nodes(
		node("cp", map[string]string{"role": "cp"}, false),
		node("w1", map[string]string{"role": "worker", "zone": "a"}, false),
		node("w2", map[string]string{"role": "worker", "zone": "b"}, false),
		node("w3", map[string]string{"role": "worker", "zone": "b"}, false),
	)
	ready := []*discoveryv1.EndpointSlice{slice(ep{node: "w2", ready: ptr(true)})}
	cluster := svc(corev1.ServiceExternalTrafficPolicyCluster, map[string]string{"app": "web"}, nil)
	local := svc(corev1.ServiceExternalTrafficPolicyLocal, map[string]string{"app": "web"}, nil)
	allAd := []*config.L2Advertisement{ad("all", []string{"p1"}, nil, nil, nil)}

	tests := []struct {
		name       string
		in         Input
		want       []string // as a set; order is checked against Rank
		wantReason string
	}{
		{
			name: "cluster policy: every node",
			in:   Input{Service: cluster, Pool: "p1", Advertisements: allAd, Nodes: baseNodes, EndpointSlices: ready},
			want: all,
		},
		{
			name:       "no endpoints at all",
			in:         Input{Service: cluster, Pool: "p1", Advertisements: allAd, Nodes: baseNodes},
			wantReason: ReasonNoReadyEndpoints,
		},
		{
			name: "only not-ready endpoints",
			in: Input{Service: cluster, Pool: "p1", Advertisements: allAd, Nodes: baseNodes,
				EndpointSlices: []*discoveryv1.EndpointSlice{slice(ep{node: "w1", ready: ptr(false)}, ep{node: "w2", ready: ptr(false), serving: ptr(false)})}},
			wantReason: ReasonNoReadyEndpoints,
		},
		{
			name: "terminating but serving endpoint counts",
			in: Input{Service: cluster, Pool: "p1", Advertisements: allAd, Nodes: baseNodes,
				EndpointSlices: []*discoveryv1.EndpointSlice{slice(ep{node: "w1", ready: ptr(false), serving: ptr(true)})}},
			want: all,
		},
		{
			name: "unset ready counts as ready",
			in: Input{Service: cluster, Pool: "p1", Advertisements: allAd, Nodes: baseNodes,
				EndpointSlices: []*discoveryv1.EndpointSlice{slice(ep{node: "w1"})}},
			want: all,
		},
		{
			name: "ETP Local: only nodes with a serving endpoint",
			in: Input{Service: local, Pool: "p1", Advertisements: allAd, Nodes: baseNodes,
				EndpointSlices: []*discoveryv1.EndpointSlice{
					slice(ep{node: "w1", ready: ptr(true)}, ep{node: "w2", ready: ptr(false)}),
					slice(ep{node: "w3", ready: ptr(false), serving: ptr(true)}),
				}},
			want: []string{"w1", "w3"},
		},
		{
			name: "ETP Local: endpoint without nodeName gives no candidate",
			in: Input{Service: local, Pool: "p1", Advertisements: allAd, Nodes: baseNodes,
				EndpointSlices: []*discoveryv1.EndpointSlice{slice(ep{ready: ptr(true)})}},
			wantReason: ReasonNoCandidates,
		},
		{
			name: "node selectors restrict candidates (OR across selectors and ads)",
			in: Input{Service: cluster, Pool: "p1", Nodes: baseNodes, EndpointSlices: ready,
				Advertisements: []*config.L2Advertisement{
					ad("a", []string{"p1"}, []labels.Selector{sel(t, "zone=a")}, nil, nil),
					ad("b", []string{"p1"}, []labels.Selector{sel(t, "role=cp")}, nil, nil),
				}},
			want: []string{"w1", "cp"},
		},
		{
			name: "advertisement of another pool does not count",
			in: Input{Service: cluster, Pool: "p1", Nodes: baseNodes, EndpointSlices: ready,
				Advertisements: []*config.L2Advertisement{ad("other", []string{"p2"}, nil, nil, nil)}},
			wantReason: ReasonNoMatchingAdvertisement,
		},
		{
			name: "service selector not matching",
			in: Input{Service: cluster, Pool: "p1", Nodes: baseNodes, EndpointSlices: ready,
				Advertisements: []*config.L2Advertisement{ad("a", []string{"p1"}, nil, nil, []labels.Selector{sel(t, "app=db")})}},
			wantReason: ReasonNoMatchingAdvertisement,
		},
		{
			name: "service selector matching",
			in: Input{Service: cluster, Pool: "p1", Nodes: baseNodes, EndpointSlices: ready,
				Advertisements: []*config.L2Advertisement{ad("a", []string{"p1"}, []labels.Selector{sel(t, "zone=b")}, nil, []labels.Selector{sel(t, "app=db"), sel(t, "app=web")})}},
			want: []string{"w2", "w3"},
		},
		{
			name: "shared IP with a service-selecting advertisement",
			in: Input{Service: svc(corev1.ServiceExternalTrafficPolicyCluster, map[string]string{"app": "web"}, map[string]string{AnnotationAllowSharedIP: "k"}),
				Pool: "p1", Nodes: baseNodes, EndpointSlices: ready,
				Advertisements: []*config.L2Advertisement{ad("a", []string{"p1"}, nil, nil, []labels.Selector{sel(t, "app=web")})}},
			wantReason: ReasonSharedIPWithServiceSelector,
		},
		{
			name: "shared IP (deprecated key) without service selectors is fine",
			in: Input{Service: svc(corev1.ServiceExternalTrafficPolicyCluster, nil, map[string]string{AnnotationAllowSharedIPDeprecated: "k"}),
				Pool: "p1", Nodes: baseNodes, EndpointSlices: ready, Advertisements: allAd},
			want: all,
		},
		{
			name: "excluded and network-unavailable nodes are dropped",
			in: Input{Service: cluster, Pool: "p1", Advertisements: allAd, EndpointSlices: ready,
				Nodes: nodes(
					node("cp", map[string]string{corev1.LabelNodeExcludeBalancers: ""}, false),
					node("w1", nil, true),
					node("w2", nil, false),
					node("w3", map[string]string{corev1.LabelNodeExcludeBalancers: "true"}, false),
				)},
			want: []string{"w2"},
		},
		{
			name: "IgnoreExcludeLB keeps labelled nodes",
			in: Input{Service: cluster, Pool: "p1", Advertisements: allAd, EndpointSlices: ready, IgnoreExcludeLB: true,
				Nodes: nodes(
					node("cp", map[string]string{corev1.LabelNodeExcludeBalancers: ""}, false),
					node("w1", nil, true),
					node("w2", nil, false),
					node("w3", map[string]string{corev1.LabelNodeExcludeBalancers: "true"}, false),
				)},
			want: []string{"cp", "w2", "w3"},
		},
		{
			name: "all excluded",
			in: Input{Service: cluster, Pool: "p1", Advertisements: allAd, EndpointSlices: ready,
				Nodes: nodes(node("w1", nil, true))},
			wantReason: ReasonNoCandidates,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res := Eligible(tc.in)
			if res.Reason != tc.wantReason {
				t.Fatalf("reason = %q, want %q (nodes %v)", res.Reason, tc.wantReason, res.Nodes)
			}
			want := slices.Sorted(slices.Values(tc.want))
			if len(want) == 0 {
				want = nil
			}
			if !reflect.DeepEqual(res.Nodes, want) {
				t.Fatalf("nodes = %v, want %v", res.Nodes, want)
			}
			// Explain gives a reason for exactly the nodes left out,
			// unless the Service as a whole is not announced.
			ex := Explain(tc.in)
			if res.Reason != "" && res.Reason != ReasonNoCandidates {
				if ex != nil {
					t.Fatalf("Explain = %v for a Service not announced at all (%s)", ex, res.Reason)
				}
				return
			}
			for name := range tc.in.Nodes {
				if _, out := ex[name]; out == slices.Contains(res.Nodes, name) {
					t.Errorf("node %s: eligible %v, Explain reason %q", name, slices.Contains(res.Nodes, name), ex[name])
				}
			}
		})
	}
}

// drainedW2 is ns with w2 drained (DrainAnnotation); "false" drains nothing.
func drainedW2(ns map[string]*corev1.Node) map[string]*corev1.Node {
	out := map[string]*corev1.Node{}
	for name, n := range ns {
		c := n.DeepCopy()
		switch name {
		case "w2":
			c.Annotations = map[string]string{DrainAnnotation: "true"}
		case "w4":
			c.Annotations = map[string]string{DrainAnnotation: "false"}
		}
		out[name] = c
	}
	return out
}

// TestExplain: each node left out gets the reason an operator would fix.
func TestExplain(t *testing.T) {
	ready := []*discoveryv1.EndpointSlice{slice(ep{node: "w2", ready: ptr(true)})}
	ns := nodes(
		node("cp", map[string]string{corev1.LabelNodeExcludeBalancers: "", "zone": "a"}, false),
		node("w1", map[string]string{"zone": "a"}, true),
		node("w2", map[string]string{"zone": "a"}, false),
		node("w3", map[string]string{"zone": "b"}, false),
		node("w4", map[string]string{"zone": "a"}, false),
	)
	zoneA := []*config.L2Advertisement{ad("a", []string{"p1"}, []labels.Selector{sel(t, "zone=a")}, nil, nil)}
	tests := []struct {
		name string
		in   Input
		want map[string]string
	}{
		{
			name: "cluster policy",
			in:   Input{Service: svc(corev1.ServiceExternalTrafficPolicyCluster, nil, nil), Pool: "p1", Advertisements: zoneA, Nodes: ns, EndpointSlices: ready},
			want: map[string]string{"cp": NodeExcludedByLabel, "w1": NodeNetworkUnavailable, "w3": NodeNotSelected},
		},
		{
			name: "local policy",
			in:   Input{Service: svc(corev1.ServiceExternalTrafficPolicyLocal, nil, nil), Pool: "p1", Advertisements: zoneA, Nodes: ns, EndpointSlices: ready},
			want: map[string]string{"cp": NodeExcludedByLabel, "w1": NodeNetworkUnavailable, "w3": NodeNoLocalEndpoint, "w4": NodeNoLocalEndpoint},
		},
		{
			name: "ignore the exclude label",
			in: Input{Service: svc(corev1.ServiceExternalTrafficPolicyCluster, nil, nil), Pool: "p1", Advertisements: zoneA, Nodes: ns, EndpointSlices: ready,
				IgnoreExcludeLB: true},
			want: map[string]string{"w1": NodeNetworkUnavailable, "w3": NodeNotSelected},
		},
		{
			name: "a drained node, even when the exclude label is ignored",
			in: Input{Service: svc(corev1.ServiceExternalTrafficPolicyCluster, nil, nil), Pool: "p1", Advertisements: zoneA, Nodes: drainedW2(ns), EndpointSlices: ready,
				IgnoreExcludeLB: true},
			want: map[string]string{"w1": NodeNetworkUnavailable, "w2": NodeDrained, "w3": NodeNotSelected},
		},
		{
			name: "no endpoints: the Service's reason, not the nodes'",
			in:   Input{Service: svc(corev1.ServiceExternalTrafficPolicyCluster, nil, nil), Pool: "p1", Advertisements: zoneA, Nodes: ns},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := Explain(tc.in); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Explain = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestNodeInterfaces(t *testing.T) {
	ns := nodes(node("w1", map[string]string{"zone": "a"}, false), node("w2", map[string]string{"zone": "b"}, false),
		node("w3", map[string]string{"zone": "c"}, false))
	ads := []*config.L2Advertisement{
		ad("a1", []string{"p1"}, []labels.Selector{sel(t, "zone=a")}, []string{"eth1", "eth0"}, nil),
		ad("a2", []string{"p1"}, []labels.Selector{sel(t, "zone=a")}, []string{"eth0"}, nil),
		ad("b", []string{"p1"}, []labels.Selector{sel(t, "zone=b")}, nil, nil),
	}
	res := Eligible(Input{Service: svc(corev1.ServiceExternalTrafficPolicyCluster, nil, nil), Pool: "p1", Advertisements: ads, Nodes: ns,
		EndpointSlices: []*discoveryv1.EndpointSlice{slice(ep{node: "w1", ready: ptr(true)})}})
	if !reflect.DeepEqual(res.Nodes, []string{"w1", "w2"}) {
		t.Fatalf("eligible %v, want [w1 w2]", res.Nodes)
	}
	if ok, all, ifaces := NodeInterfaces(res, ns["w1"]); !ok || all || !reflect.DeepEqual(ifaces, []string{"eth0", "eth1"}) {
		t.Errorf("w1: %v %v %v, want the union [eth0 eth1]", ok, all, ifaces)
	}
	if ok, all, _ := NodeInterfaces(res, ns["w2"]); !ok || !all {
		t.Errorf("w2: %v %v, want all interfaces", ok, all)
	}
	if ok, _, _ := NodeInterfaces(res, ns["w3"]); ok {
		t.Error("w3: no advertisement selects it")
	}
}

// Dual-stack and shared IPs move together because only the key IP counts: the
// same key gives the same winner whatever other IPs the Service has.
func TestWinnerDependsOnlyOnKey(t *testing.T) {
	ns := []string{"a", "b", "c", "d"}
	seen := map[string]bool{}
	for i := 0; i < 64; i++ {
		seen[winner(fmt.Sprintf("10.0.0.%d", i), ns)] = true
	}
	if len(seen) < 3 {
		t.Errorf("64 keys spread over only %d of 4 nodes: %v", len(seen), seen)
	}
}

// Permutation invariance: shuffling advertisements, slices and endpoints
// never changes the eligible nodes.
func TestPermutationInvariance(t *testing.T) {
	f := func(seed int64, nNodes uint8, ipByte uint8, local bool) bool {
		rnd := rand.New(rand.NewSource(seed))
		n := int(nNodes%12) + 1
		ns := map[string]*corev1.Node{}
		var eps []ep
		for i := 0; i < n; i++ {
			name := fmt.Sprintf("node-%d", i)
			lbls := map[string]string{"zone": []string{"a", "b", "c"}[rnd.Intn(3)]}
			if rnd.Intn(6) == 0 {
				lbls[corev1.LabelNodeExcludeBalancers] = ""
			}
			ns[name] = node(name, lbls, rnd.Intn(7) == 0)
			if rnd.Intn(2) == 0 {
				eps = append(eps, ep{node: name, ready: ptr(rnd.Intn(3) != 0)})
			}
		}
		etp := corev1.ServiceExternalTrafficPolicyCluster
		if local {
			etp = corev1.ServiceExternalTrafficPolicyLocal
		}
		ads := []*config.L2Advertisement{
			ad("x", []string{"p1"}, []labels.Selector{labels.SelectorFromSet(labels.Set{"zone": "a"})}, nil, nil),
			ad("y", []string{"p1"}, []labels.Selector{labels.SelectorFromSet(labels.Set{"zone": "b"})}, []string{"eth0"}, nil),
			ad("z", []string{"p2"}, nil, nil, nil),
		}
		var slices1 []*discoveryv1.EndpointSlice
		for i := 0; i < len(eps); i += 2 {
			slices1 = append(slices1, slice(eps[i:min(i+2, len(eps))]...))
		}
		in := Input{Service: svc(etp, nil, nil), Pool: "p1", Advertisements: ads, Nodes: ns, EndpointSlices: slices1}
		want := Eligible(in)

		for k := 0; k < 5; k++ {
			p := in
			p.Advertisements = shuffled(rnd, ads)
			p.EndpointSlices = nil
			for _, s := range shuffled(rnd, slices1) {
				c := s.DeepCopy()
				rnd.Shuffle(len(c.Endpoints), func(i, j int) { c.Endpoints[i], c.Endpoints[j] = c.Endpoints[j], c.Endpoints[i] })
				p.EndpointSlices = append(p.EndpointSlices, c)
			}
			got := Eligible(p)
			if got.Reason != want.Reason || !reflect.DeepEqual(got.Nodes, want.Nodes) {
				t.Logf("seed %d: %v/%q vs %v/%q", seed, got.Nodes, got.Reason, want.Nodes, want.Reason)
				return false
			}
		}
		return true
	}
	if err := quick.Check(f, &quick.Config{MaxCount: 300}); err != nil {
		t.Fatal(err)
	}
}

func shuffled[T any](rnd *rand.Rand, in []T) []T {
	out := slices.Clone(in)
	rnd.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

// FuzzWinner checks Rank's first node against the written-out rule and the order
// independence of Rank for arbitrary names and keys.
func FuzzWinner(f *testing.F) {
	f.Add("172.18.255.200", "myk8s-worker", "myk8s-worker2", "myk8s-worker3", int64(1))
	f.Add("fc00::1", "a", "a", "", int64(7))
	f.Fuzz(func(t *testing.T, ip, a, b, c string, seed int64) {
		ns := []string{a, b, c}
		ns = slices.DeleteFunc(ns, func(s string) bool { return s == "" })
		want := bruteWinner(ip, ns)
		if got := winner(ip, ns); got != want && !bruteTie(ip, ns) {
			t.Fatalf("winner(%q, %q) = %q, want %q", ip, ns, got, want)
		}
		r1 := Rank(ip, ns)
		r2 := Rank(ip, shuffled(rand.New(rand.NewSource(seed)), ns))
		if !reflect.DeepEqual(r1, r2) {
			t.Fatalf("Rank not order independent: %v vs %v", r1, r2)
		}
	})
}

// bruteTie reports whether two different names hash equally (only then may the
// brute force and Rank disagree, on the name tie-break).
func bruteTie(ip string, ns []string) bool {
	seen := map[[32]byte]string{}
	for _, n := range ns {
		h := sha256.Sum256([]byte(n + "#" + ip))
		if o, ok := seen[h]; ok && o != n {
			return true
		}
		seen[h] = n
	}
	return false
}

// TestScores: preference weights add up within an advertisement and across
// the advertisements that apply to the Service, and an advertisement scores
// only the nodes its own nodeSelectors allow.
func TestScores(t *testing.T) {
	pref := func(a *config.L2Advertisement, w int64, s string) *config.L2Advertisement {
		a.PreferredNodes = append(a.PreferredNodes, config.PreferredNodes{Weight: w, Selector: sel(t, s)})
		return a
	}
	ns := nodes(
		node("x", map[string]string{"role": "lb", "zone": "primary", "gpu": "true"}, false),
		node("y", map[string]string{"role": "lb", "zone": "primary"}, false),
		node("z", map[string]string{"role": "lb"}, false),
		node("e", map[string]string{"role": "gpu", "zone": "primary"}, false),
		node("c", map[string]string{"role": "edge", "zone": "primary"}, false),
	)
	ready := []*discoveryv1.EndpointSlice{slice(ep{node: "x", ready: ptr(true)})}
	web := svc(corev1.ServiceExternalTrafficPolicyCluster, map[string]string{"app": "web"}, nil)
	tests := []struct {
		name string
		ads  []*config.L2Advertisement
		want map[string]int64
	}{
		{
			name: "no preferences: nil scores",
			ads:  []*config.L2Advertisement{ad("all", []string{"p"}, nil, nil, nil)},
		},
		{
			name: "summed across advertisements",
			ads: []*config.L2Advertisement{
				pref(ad("ad1", []string{"p"}, []labels.Selector{sel(t, "role=lb")}, nil, nil), 70, "zone=primary"),
				pref(ad("ad2", []string{"p"}, []labels.Selector{sel(t, "role=lb")}, nil, nil), 30, "gpu=true"),
			},
			want: map[string]int64{"x": 100, "y": 70},
		},
		{
			name: "summed within one advertisement, empty preference matches its nodes",
			ads: []*config.L2Advertisement{
				pref(pref(pref(ad("ad", []string{"p"}, nil, nil, nil), 60, "zone=primary"), 50, "gpu=true"), 1, ""),
			},
			want: map[string]int64{"x": 111, "y": 61, "z": 1, "e": 61, "c": 61},
		},
		{
			name: "an advertisement does not lift nodes outside its nodeSelectors",
			ads: []*config.L2Advertisement{
				ad("ad1", []string{"p"}, []labels.Selector{sel(t, "role=lb")}, nil, nil),
				ad("ad2", []string{"p"}, []labels.Selector{sel(t, "role=edge")}, nil, nil),
				pref(ad("ad3", []string{"p"}, []labels.Selector{sel(t, "role=gpu")}, nil, nil), 100, "zone=primary"),
			},
			want: map[string]int64{"e": 100},
		},
		{
			name: "advertisements of other pools or Services do not count",
			ads: []*config.L2Advertisement{
				ad("all", []string{"p"}, nil, nil, nil),
				pref(ad("other-pool", []string{"q"}, nil, nil, nil), 100, "zone=primary"),
				pref(ad("other-svc", []string{"p"}, nil, nil, []labels.Selector{sel(t, "app=db")}), 100, "zone=primary"),
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res := Eligible(Input{Service: web, Pool: "p", Advertisements: tc.ads, Nodes: ns, EndpointSlices: ready})
			if res.Reason != "" {
				t.Fatalf("reason %q", res.Reason)
			}
			if !reflect.DeepEqual(res.Scores, tc.want) {
				t.Errorf("scores = %v, want %v", res.Scores, tc.want)
			}
		})
	}
}
