package config

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/ironlb/ironlb/api/v1beta1"
)

func pool(name string, addrs ...string) v1beta1.IPAddressPool {
	return v1beta1.IPAddressPool{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "metallb-system"},
		Spec:       v1beta1.IPAddressPoolSpec{Addresses: addrs},
	}
}

func withLabels[T interface{ SetLabels(map[string]string) }](o T, kv ...string) T {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	o.SetLabels(m)
	return o
}

func ad(name string, spec v1beta1.L2AdvertisementSpec) v1beta1.L2Advertisement {
	return v1beta1.L2Advertisement{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "metallb-system"}, Spec: spec}
}

func sel(kv ...string) metav1.LabelSelector {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return metav1.LabelSelector{MatchLabels: m}
}

func ns(name string, kv ...string) corev1.Namespace {
	n := corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	return *withLabels(&n, kv...)
}

// TestParseWalkthrough parses the user's walkthrough configuration verbatim.
func TestParseWalkthrough(t *testing.T) {
	cfg, err := Parse(
		[]v1beta1.IPAddressPool{pool("my-ippool", "172.18.255.200-172.18.255.250")},
		[]v1beta1.L2Advertisement{ad("my-l2-advertise", v1beta1.L2AdvertisementSpec{IPAddressPools: []string{"my-ippool"}})},
		nil)
	if err != nil {
		t.Fatal(err)
	}
	p := cfg.Pools["my-ippool"]
	if p == nil || !p.AutoAssign || p.AvoidBuggyIPs || p.ServiceAllocation != nil {
		t.Fatalf("pool = %+v", p)
	}
	want := []Range{{netip.MustParseAddr("172.18.255.200"), netip.MustParseAddr("172.18.255.250")}}
	if len(p.Ranges) != 1 || p.Ranges[0] != want[0] {
		t.Errorf("ranges = %v, want %v", p.Ranges, want)
	}
	if len(cfg.L2Advertisements) != 1 {
		t.Fatalf("ads = %v", cfg.L2Advertisements)
	}
	a := cfg.L2Advertisements[0]
	if a.Name != "my-l2-advertise" || !a.Pools.Equal(sets.New("my-ippool")) || len(a.NodeSelectors) != 0 || len(a.Interfaces) != 0 {
		t.Errorf("ad = %+v", a)
	}
	if got := cfg.AdvertisementsFor("my-ippool"); len(got) != 1 || got[0] != a {
		t.Errorf("AdvertisementsFor = %v", got)
	}
}

func TestParsePools(t *testing.T) {
	f := false
	mixed := pool("dual", "10.0.0.0/24", "2001:db8::/120", "10.0.1.0-10.0.1.9")
	mixed.Spec.AutoAssign = &f
	mixed.Spec.AvoidBuggyIPs = true
	cfg, err := Parse([]v1beta1.IPAddressPool{mixed, pool("other", "10.0.2.0/24")}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	p := cfg.Pools["dual"]
	if p.AutoAssign || !p.AvoidBuggyIPs {
		t.Errorf("AutoAssign/AvoidBuggyIPs = %v/%v", p.AutoAssign, p.AvoidBuggyIPs)
	}
	var got []string
	for _, r := range p.Ranges {
		got = append(got, r.String())
	}
	// Sorted by first address: IPv4 before IPv6.
	if want := "10.0.0.0/24 10.0.1.0-10.0.1.9 2001:db8::/120"; strings.Join(got, " ") != want {
		t.Errorf("ranges = %q, want %q", strings.Join(got, " "), want)
	}
	if !cfg.Pools["other"].AutoAssign {
		t.Error("autoAssign unset must mean true")
	}
}

func TestParseServiceAllocation(t *testing.T) {
	p := pool("p", "10.0.0.0/24")
	p.Spec.ServiceAllocation = &v1beta1.ServiceAllocation{
		Priority:           5,
		Namespaces:         []string{"explicit"},
		NamespaceSelectors: []metav1.LabelSelector{sel("team", "a"), {MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "env", Operator: metav1.LabelSelectorOpIn, Values: []string{"prod"}}}}},
		ServiceSelectors:   []metav1.LabelSelector{sel("app", "web")},
	}
	none := pool("none", "10.0.1.0/24")
	none.Spec.ServiceAllocation = &v1beta1.ServiceAllocation{NamespaceSelectors: []metav1.LabelSelector{sel("team", "nobody")}}
	namespaces := []corev1.Namespace{ns("a1", "team", "a"), ns("b1", "team", "b"), ns("prod1", "env", "prod"), ns("explicit")}
	cfg, err := Parse([]v1beta1.IPAddressPool{p, none}, nil, namespaces)
	if err != nil {
		t.Fatal(err)
	}
	sa := cfg.Pools["p"].ServiceAllocation
	if sa.Priority != 5 || !sa.NamespaceSelectorsSet {
		t.Errorf("sa = %+v", sa)
	}
	if want := sets.New("explicit", "a1", "prod1"); !sa.Namespaces.Equal(want) {
		t.Errorf("namespaces = %v, want %v", sets.List(sa.Namespaces), sets.List(want))
	}
	if len(sa.ServiceSelectors) != 1 || !sa.ServiceSelectors[0].Matches(labels.Set{"app": "web"}) || sa.ServiceSelectors[0].Matches(labels.Set{"app": "db"}) {
		t.Errorf("service selectors = %v", sa.ServiceSelectors)
	}
	sn := cfg.Pools["none"].ServiceAllocation
	if !sn.NamespaceSelectorsSet || sn.Namespaces.Len() != 0 {
		t.Errorf("a selector matching nothing must give an empty set marked as selected: %+v", sn)
	}
}

func TestParseL2Advertisements(t *testing.T) {
	pools := []v1beta1.IPAddressPool{
		*withLabels(ptr(pool("a", "10.0.0.0/24")), "tier", "gold"),
		*withLabels(ptr(pool("b", "10.0.1.0/24")), "tier", "silver"),
		pool("c", "10.0.2.0/24"),
	}
	ads := []v1beta1.L2Advertisement{
		ad("z-all", v1beta1.L2AdvertisementSpec{}),
		ad("by-name", v1beta1.L2AdvertisementSpec{IPAddressPools: []string{"a", "does-not-exist"}, Interfaces: []string{"eth0", "eth1", "eth0"}}),
		ad("by-label", v1beta1.L2AdvertisementSpec{IPAddressPoolSelectors: []metav1.LabelSelector{sel("tier", "silver")}, NodeSelectors: []metav1.LabelSelector{sel("kubernetes.io/hostname", "w1")}}),
		ad("both", v1beta1.L2AdvertisementSpec{IPAddressPools: []string{"c"}, IPAddressPoolSelectors: []metav1.LabelSelector{sel("tier", "gold")}, ServiceSelectors: []metav1.LabelSelector{sel("app", "x")}}),
		ad("ghost", v1beta1.L2AdvertisementSpec{IPAddressPools: []string{"missing"}}),
	}
	cfg, err := Parse(pools, ads, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*L2Advertisement{}
	var order []string
	for _, a := range cfg.L2Advertisements {
		got[a.Name] = a
		order = append(order, a.Name)
	}
	if want := "both by-label by-name ghost z-all"; strings.Join(order, " ") != want {
		t.Errorf("order = %q, want %q", strings.Join(order, " "), want)
	}
	for name, want := range map[string][]string{
		"z-all": {"a", "b", "c"}, "by-name": {"a"}, "by-label": {"b"}, "both": {"a", "c"}, "ghost": {},
	} {
		if !got[name].Pools.Equal(sets.New(want...)) {
			t.Errorf("%s: pools = %v, want %v", name, sets.List(got[name].Pools), want)
		}
	}
	if want := "eth0 eth1"; strings.Join(got["by-name"].Interfaces, " ") != want {
		t.Errorf("interfaces = %v, want %s", got["by-name"].Interfaces, want)
	}
	if len(got["by-label"].NodeSelectors) != 1 || !got["by-label"].NodeSelectors[0].Matches(labels.Set{"kubernetes.io/hostname": "w1"}) {
		t.Errorf("node selectors = %v", got["by-label"].NodeSelectors)
	}
	if len(got["both"].ServiceSelectors) != 1 {
		t.Errorf("service selectors = %v", got["both"].ServiceSelectors)
	}
	var forA []string
	for _, a := range cfg.AdvertisementsFor("a") {
		forA = append(forA, a.Name)
	}
	if want := "both by-name z-all"; strings.Join(forA, " ") != want {
		t.Errorf("AdvertisementsFor(a) = %v, want %s", forA, want)
	}
}

func ptr[T any](v T) *T { return &v }

// TestParsePreferredNodes keeps every preference in spec order, repeated ones
// included (their weights add up when nodes are scored).
func TestParsePreferredNodes(t *testing.T) {
	cfg, err := Parse([]v1beta1.IPAddressPool{pool("p", "10.0.0.0/24")}, []v1beta1.L2Advertisement{
		ad("none", v1beta1.L2AdvertisementSpec{}),
		ad("prefs", v1beta1.L2AdvertisementSpec{PreferredNodeSelectors: []v1beta1.PreferredNodeSelector{
			{Weight: 100, Preference: sel("zone", "a")},
			{Weight: 1, Preference: metav1.LabelSelector{}},
			{Weight: 30, Preference: sel("zone", "a")},
		}}),
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if p := cfg.L2Advertisements[0].PreferredNodes; cfg.L2Advertisements[0].Name != "none" || p != nil {
		t.Errorf("advertisement without preferences: %v", p)
	}
	got := cfg.L2Advertisements[1].PreferredNodes
	if len(got) != 3 || got[0].Weight != 100 || got[1].Weight != 1 || got[2].Weight != 30 {
		t.Fatalf("preferences = %+v", got)
	}
	zoneA := labels.Set{"zone": "a"}
	if !got[0].Selector.Matches(zoneA) || got[0].Selector.Matches(labels.Set{"zone": "b"}) || !got[1].Selector.Matches(labels.Set{}) {
		t.Errorf("selectors = %v, %v", got[0].Selector, got[1].Selector)
	}
}

// TestParseErrors checks that every problem is reported, each naming the object,
// the field and the value.
func TestParseErrors(t *testing.T) {
	badExpr := metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "k", Operator: "Maybe", Values: []string{"v"}}}}
	dupExpr := metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
		{Key: "k", Operator: metav1.LabelSelectorOpIn, Values: []string{"a", "b"}},
		{Key: "k", Operator: metav1.LabelSelectorOpIn, Values: []string{"b", "a"}},
	}}
	dupValue := metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "k", Operator: metav1.LabelSelectorOpIn, Values: []string{"a", "a"}}}}
	sameAs := metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: metav1.LabelSelectorOpIn, Values: []string{"web"}}}}

	tests := []struct {
		name  string
		pools []v1beta1.IPAddressPool
		ads   []v1beta1.L2Advertisement
		want  []string // each must appear in the error; the count of lines must match
	}{
		{
			name:  "overlap across pools names both pools and entries",
			pools: []v1beta1.IPAddressPool{pool("my-ippool", "172.18.255.200-172.18.255.250"), pool("second", "172.18.255.240/28")},
			want:  []string{`IPAddressPool "second": spec.addresses[0]: CIDR "172.18.255.240/28" in pool "second" overlaps with already defined CIDR "172.18.255.200-172.18.255.250" in pool "my-ippool"`},
		},
		{
			name:  "later-defined entry is blamed even when it starts lower",
			pools: []v1beta1.IPAddressPool{pool("first", "10.0.0.128/25"), pool("second", "10.0.0.0/24")},
			want:  []string{`IPAddressPool "second": spec.addresses[0]: CIDR "10.0.0.0/24" in pool "second" overlaps with already defined CIDR "10.0.0.128/25" in pool "first"`},
		},
		{
			name:  "overlap within one pool",
			pools: []v1beta1.IPAddressPool{pool("p", "10.0.0.0/24", "2001:db8::/64", "10.0.0.255-10.0.1.5")},
			want:  []string{`IPAddressPool "p": spec.addresses[2]: CIDR "10.0.0.255-10.0.1.5" in pool "p" overlaps with already defined CIDR "10.0.0.0/24" in pool "p"`},
		},
		{
			name:  "every overlap is reported",
			pools: []v1beta1.IPAddressPool{pool("a", "10.0.0.0/16"), pool("b", "10.0.1.0/24", "10.0.2.0/24"), pool("c", "10.0.1.7/32")},
			want: []string{
				`IPAddressPool "b": spec.addresses[0]: CIDR "10.0.1.0/24" in pool "b" overlaps with already defined CIDR "10.0.0.0/16" in pool "a"`,
				`IPAddressPool "b": spec.addresses[1]: CIDR "10.0.2.0/24" in pool "b" overlaps with already defined CIDR "10.0.0.0/16" in pool "a"`,
				`IPAddressPool "c": spec.addresses[0]: CIDR "10.0.1.7/32" in pool "c" overlaps with already defined CIDR "10.0.0.0/16" in pool "a"`,
				`IPAddressPool "c": spec.addresses[0]: CIDR "10.0.1.7/32" in pool "c" overlaps with already defined CIDR "10.0.1.0/24" in pool "b"`,
			},
		},
		{
			name:  "bad entries are all reported",
			pools: []v1beta1.IPAddressPool{pool("p", "10.0.0.9-10.0.0.1", "10.0.0.0/33", "10.1.0.0/24", "banana")},
			want: []string{
				`IPAddressPool "p": spec.addresses[0]: invalid IP range "10.0.0.9-10.0.0.1": start IP "10.0.0.9" is after the end IP "10.0.0.1"`,
				`IPAddressPool "p": spec.addresses[1]: invalid CIDR "10.0.0.0/33"`,
				`IPAddressPool "p": spec.addresses[3]: invalid CIDR "banana"`,
			},
		},
		{
			name:  "empty pool, missing name, duplicate pool",
			pools: []v1beta1.IPAddressPool{pool("empty"), pool("", "10.9.0.0/24"), pool("dup", "10.0.0.0/24"), pool("dup", "10.0.1.0/24")},
			want: []string{
				`IPAddressPool "empty": spec.addresses: pool has no prefixes defined`,
				`IPAddressPool "": metadata.name: missing pool name`,
				`IPAddressPool "dup": metadata.name: duplicate definition of pool "dup"`,
			},
		},
		{
			name: "service allocation",
			pools: func() []v1beta1.IPAddressPool {
				p := pool("p", "10.0.0.0/24")
				p.Spec.ServiceAllocation = &v1beta1.ServiceAllocation{
					Namespaces:         []string{"a", "b", "a", "Not_Valid"},
					NamespaceSelectors: []metav1.LabelSelector{sel("x", "1"), sel("x", "1"), badExpr},
					ServiceSelectors:   []metav1.LabelSelector{sel("app", "web"), sameAs, dupExpr, dupValue},
				}
				return []v1beta1.IPAddressPool{p}
			}(),
			want: []string{
				`IPAddressPool "p": spec.serviceAllocation.namespaces[2]: duplicate definition in namespaces field: "a"`,
				`IPAddressPool "p": spec.serviceAllocation.namespaces[3]: invalid namespace name "Not_Valid"`,
				`IPAddressPool "p": spec.serviceAllocation.namespaceSelectors[1]: duplicate definition of namespaceSelectors "x=1" (same as spec.serviceAllocation.namespaceSelectors[0])`,
				`IPAddressPool "p": spec.serviceAllocation.namespaceSelectors[2]: invalid namespaceSelectors {"matchExpressions":[{"key":"k","operator":"Maybe","values":["v"]}]}: "Maybe" is not a valid label selector operator`,
				`IPAddressPool "p": spec.serviceAllocation.serviceSelectors[1]: duplicate definition of serviceSelectors "app=web"`,
				`IPAddressPool "p": spec.serviceAllocation.serviceSelectors[2]: invalid serviceSelectors`,
				`duplicate match expression {key: "k", operator: "In", values: ["b" "a"]}`,
				`IPAddressPool "p": spec.serviceAllocation.serviceSelectors[3]: invalid serviceSelectors {"matchExpressions":[{"key":"k","operator":"In","values":["a","a"]}]}: duplicate value "a" in match expression on key "k"`,
			},
		},
		{
			name:  "l2 advertisement rules",
			pools: []v1beta1.IPAddressPool{pool("p", "10.0.0.0/24")},
			ads: []v1beta1.L2Advertisement{
				ad("a", v1beta1.L2AdvertisementSpec{
					IPAddressPools:         []string{"p", "p", ""},
					IPAddressPoolSelectors: []metav1.LabelSelector{sel("t", "1"), sel("t", "1")},
					NodeSelectors:          []metav1.LabelSelector{{MatchLabels: map[string]string{"bad key!": "v"}}},
					ServiceSelectors:       []metav1.LabelSelector{sel("s", "1"), sel("s", "1")},
					Interfaces:             []string{"eth0", "this-name-is-too-long", "eth0:1"},
				}),
				ad("a", v1beta1.L2AdvertisementSpec{}),
				ad("", v1beta1.L2AdvertisementSpec{}),
				ad("prefs", v1beta1.L2AdvertisementSpec{PreferredNodeSelectors: []v1beta1.PreferredNodeSelector{
					{Weight: 0, Preference: sel("zone", "a")},
					{Weight: 101, Preference: sel("zone", "b")},
					{Weight: 50, Preference: badExpr},
					{Weight: 100, Preference: sel("zone", "c")},
				}}),
			},
			want: []string{
				`L2Advertisement "a": spec.ipAddressPools[1]: duplicate definition of ipAddressPools "p"`,
				`L2Advertisement "a": spec.ipAddressPools[2]: empty pool name`,
				`L2Advertisement "a": spec.ipAddressPoolSelectors[1]: duplicate definition of ipAddressPoolSelectors "t=1"`,
				`L2Advertisement "a": spec.nodeSelectors[0]: invalid nodeSelectors {"matchLabels":{"bad key!":"v"}}: key: Invalid value: "bad key!"`,
				`L2Advertisement "a": spec.serviceSelectors[1]: duplicate definition of serviceSelectors "s=1"`,
				`L2Advertisement "a": spec.interfaces[1]: invalid interface name "this-name-is-too-long": longer than 15 bytes`,
				`L2Advertisement "a": spec.interfaces[2]: invalid interface name "eth0:1"`,
				`L2Advertisement "a": metadata.name: duplicate definition of L2Advertisement "a"`,
				`L2Advertisement "": metadata.name: missing L2Advertisement name`,
				`L2Advertisement "prefs": spec.preferredNodeSelectors[0].weight: weight 0 is out of range: want 1 to 100`,
				`L2Advertisement "prefs": spec.preferredNodeSelectors[1].weight: weight 101 is out of range: want 1 to 100`,
				`L2Advertisement "prefs": spec.preferredNodeSelectors[2].preference: invalid preference {"matchExpressions":[{"key":"k","operator":"Maybe","values":["v"]}]}: "Maybe" is not a valid label selector operator`,
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Parse(tc.pools, tc.ads, nil)
			if err == nil {
				t.Fatalf("Parse accepted the configuration: %+v", cfg)
			}
			if cfg != nil {
				t.Errorf("Parse returned a config with an error")
			}
			msg := err.Error()
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error lacks %q; got:\n%s", w, msg)
				}
			}
			lines := strings.Split(msg, "\n")
			wantLines := 0
			for _, w := range tc.want {
				if strings.HasPrefix(w, "IPAddressPool ") || strings.HasPrefix(w, "L2Advertisement ") {
					wantLines++
				}
			}
			if len(lines) != wantLines {
				t.Errorf("got %d problems, want %d:\n%s", len(lines), wantLines, msg)
			}
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Kind == "" || fe.Field == "" {
				t.Errorf("errors.As(*FieldError) = %+v", fe)
			}
		})
	}
}

// TestParseIgnoresMissingPoolsInAds: MetalLB accepts advertisements that name pools
// that do not exist (yet); so does ironlb.
func TestParseIgnoresMissingPoolsInAds(t *testing.T) {
	cfg, err := Parse(nil, []v1beta1.L2Advertisement{ad("a", v1beta1.L2AdvertisementSpec{IPAddressPools: []string{"later"}})}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.L2Advertisements[0].Pools.Len() != 0 {
		t.Errorf("pools = %v", cfg.L2Advertisements[0].Pools)
	}
}

// TestParseDoesNotModifyInput guards the webhook, which parses objects it got from
// the API server's reader.
func TestParseDoesNotModifyInput(t *testing.T) {
	p := pool("p", " 10.0.0.1 - 10.0.0.9 ")
	before := p.DeepCopy()
	if _, err := Parse([]v1beta1.IPAddressPool{p}, nil, nil); err != nil {
		t.Fatal(err)
	}
	if p.Spec.Addresses[0] != before.Spec.Addresses[0] || p.Spec.AutoAssign != nil {
		t.Errorf("input modified: %+v", p.Spec)
	}
}

func TestPoolFor(t *testing.T) {
	cfg, err := Parse([]v1beta1.IPAddressPool{pool("a", "10.0.0.0/24"), pool("b", "10.0.1.0/24", "fd00::/120")}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ip := netip.MustParseAddr
	for _, tc := range []struct {
		ips  []netip.Addr
		want string
	}{
		{[]netip.Addr{ip("10.0.0.7")}, "a"},
		{[]netip.Addr{ip("10.0.1.7"), ip("fd00::7")}, "b"},
		{[]netip.Addr{ip("10.0.0.7"), ip("fd00::7")}, ""}, // split across pools: none holds both
		{[]netip.Addr{ip("10.0.2.1")}, ""},
	} {
		if got := cfg.PoolFor(tc.ips); got != tc.want {
			t.Errorf("PoolFor(%v) = %q, want %q", tc.ips, got, tc.want)
		}
	}
}
