package allocator

import (
	"fmt"
	"math"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// The seed walkthrough: three services get .200, .201, .202.
func TestWalkthrough(t *testing.T) {
	a := New(pools(mkPool(t, "my-ippool", []string{"172.18.255.200-172.18.255.250"})))
	for i, want := range []string{"172.18.255.200", "172.18.255.201", "172.18.255.202"} {
		ips, pool, err := a.Allocate(fmt.Sprintf("default/svc%d", i), Request{Namespace: "default", Ports: tcp(80)})
		if err != nil || pool != "my-ippool" || !slices.Equal(ips, addrs(want)) {
			t.Fatalf("svc%d: got %v %q %v, want %s from my-ippool", i, ips, pool, err, want)
		}
	}
	if got, want := a.PoolStats("my-ippool"), (Stats{AvailableIPv4: 48, AssignedIPv4: 3}); got != want {
		t.Fatalf("stats %+v, want %+v", got, want)
	}
	checkInvariants(t, a, true)
}

func TestAvoidBuggyIPs(t *testing.T) {
	a := New(pools(mkPool(t, "p", []string{"10.0.0.0/24"}, avoidBuggy)))
	if got := a.PoolStats("p"); got.AvailableIPv4 != 254 {
		t.Fatalf("available %d, want 254 (.0 and .255 avoided)", got.AvailableIPv4)
	}
	var last []netip.Addr
	for i := range 254 {
		ips, _, err := a.Allocate(fmt.Sprintf("ns/s%d", i), Request{})
		if err != nil {
			t.Fatalf("allocation %d: %v", i, err)
		}
		if i == 0 && ips[0] != netip.MustParseAddr("10.0.0.1") {
			t.Fatalf("first address %s, want 10.0.0.1", ips[0])
		}
		last = ips
	}
	if last[0] != netip.MustParseAddr("10.0.0.254") {
		t.Fatalf("last address %s, want 10.0.0.254", last[0])
	}
	if _, _, err := a.Allocate("ns/full", Request{}); reason(err) != ReasonNoAvailableIPs {
		t.Fatalf("full pool: %v, want NoAvailableIPs", err)
	}
	for _, ip := range []string{"10.0.0.0", "10.0.0.255"} {
		_, err := a.Assign("ns/buggy", Request{}, addrs(ip))
		if reason(err) != ReasonIPNotInPool || !strings.Contains(err.Error(), "avoidBuggyIPs") {
			t.Fatalf("assign %s: %v, want IPNotInPool naming avoidBuggyIPs", ip, err)
		}
	}
	checkInvariants(t, a, true)

	// Across a /24 boundary: .254 is followed by .1 of the next block.
	b := New(pools(mkPool(t, "p", []string{"10.0.0.253-10.0.1.2"}, avoidBuggy)))
	var got []netip.Addr
	for i := range 3 {
		ips, _, _ := b.Allocate(fmt.Sprintf("ns/s%d", i), Request{})
		got = append(got, ips...)
	}
	if want := addrs("10.0.0.253", "10.0.0.254", "10.0.1.1"); !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	checkInvariants(t, b, true)
}

func TestAutoAssignFalse(t *testing.T) {
	a := New(pools(mkPool(t, "manual", []string{"10.0.0.10-10.0.0.20"}, noAuto)))
	if _, _, err := a.Allocate("ns/auto", Request{}); reason(err) != ReasonNoAvailableIPs {
		t.Fatalf("auto from autoAssign=false pool: %v, want NoAvailableIPs", err)
	}
	ips, pool, err := a.Allocate("ns/byname", Request{Pool: "manual"})
	if err != nil || pool != "manual" || ips[0] != netip.MustParseAddr("10.0.0.10") {
		t.Fatalf("by name: %v %q %v", ips, pool, err)
	}
	ips, pool, err = a.Allocate("ns/byip", Request{IPs: addrs("10.0.0.15")})
	if err != nil || pool != "manual" || ips[0] != netip.MustParseAddr("10.0.0.15") {
		t.Fatalf("by IP: %v %q %v", ips, pool, err)
	}
	checkInvariants(t, a, true)
}

func TestPoolChoice(t *testing.T) {
	ps := pools(
		mkPool(t, "a-general", []string{"10.0.1.0/28"}),
		mkPool(t, "b-general", []string{"10.0.2.0/28"}),
		mkPool(t, "prio2-team", []string{"10.0.3.0/28"}, alloc(2, []string{"team"})),
		mkPool(t, "prio1-team", []string{"10.0.4.0/28"}, alloc(1, []string{"team"})),
		mkPool(t, "prio0-team", []string{"10.0.5.0/28"}, alloc(0, []string{"team"})),
		mkPool(t, "web", []string{"10.0.6.0/28"}, alloc(5, nil, "app=web")),
		mkPool(t, "web-in-shop", []string{"10.0.7.0/28"}, alloc(3, []string{"shop"}, "app=web", "app=api")),
		mkPool(t, "manual-team", []string{"10.0.8.0/28"}, noAuto, alloc(1, []string{"team"})),
	)
	tests := []struct {
		name string
		req  Request
		want string
	}{
		{"no serviceAllocation match: first general pool by name", Request{Namespace: "other"}, "a-general"},
		{"namespace match: priority 1 beats 2 and 0", Request{Namespace: "team"}, "prio1-team"},
		{"selector match", Request{Namespace: "other", Labels: map[string]string{"app": "web"}}, "web"},
		{"namespace AND selector: lower priority number wins", Request{Namespace: "shop", Labels: map[string]string{"app": "web"}}, "web-in-shop"},
		{"selectors are ORed", Request{Namespace: "shop", Labels: map[string]string{"app": "api"}}, "web-in-shop"},
		{"selector without namespace: only namespace-free pool", Request{Namespace: "other", Labels: map[string]string{"app": "api"}}, "a-general"},
		{"named pool with serviceAllocation admitting the service", Request{Namespace: "team", Pool: "prio0-team"}, "prio0-team"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := New(ps)
			_, pool, err := a.Allocate("x/y", tt.req)
			if err != nil || pool != tt.want {
				t.Fatalf("got pool %q (%v), want %q", pool, err, tt.want)
			}
		})
	}

	t.Run("priority order as pools fill", func(t *testing.T) {
		a := New(pools(
			mkPool(t, "p2", []string{"10.0.3.1/32"}, alloc(2, []string{"team"})),
			mkPool(t, "p1", []string{"10.0.4.1/32"}, alloc(1, []string{"team"})),
			mkPool(t, "p0", []string{"10.0.5.1/32"}, alloc(0, []string{"team"})),
			mkPool(t, "general", []string{"10.0.1.1/32"}),
			mkPool(t, "others", []string{"10.0.9.1/32"}, alloc(1, []string{"others"})),
		))
		var got []string
		for i := range 5 {
			_, pool, err := a.Allocate(fmt.Sprintf("team/s%d", i), Request{Namespace: "team"})
			if err != nil {
				got = append(got, reason(err))
				continue
			}
			got = append(got, pool)
		}
		if want := []string{"p1", "p2", "p0", "general", ReasonNoAvailableIPs}; !slices.Equal(got, want) {
			t.Fatalf("got %v, want %v (non-matching serviceAllocation pool must not be used)", got, want)
		}
	})

	t.Run("named pool refusing the service", func(t *testing.T) {
		a := New(ps)
		if _, _, err := a.Allocate("other/y", Request{Namespace: "other", Pool: "prio1-team"}); reason(err) != ReasonPoolNotAllowed {
			t.Fatalf("got %v, want PoolNotAllowed", err)
		}
		if _, _, err := a.Allocate("other/y", Request{Pool: "nope"}); reason(err) != ReasonUnknownPool {
			t.Fatalf("got %v, want UnknownPool", err)
		}
	})
}

func TestRequestedIPs(t *testing.T) {
	ps := pools(
		mkPool(t, "a", []string{"10.0.0.0/28", "fd00::/124"}),
		mkPool(t, "b", []string{"10.0.1.0/28"}),
		mkPool(t, "team", []string{"10.0.2.0/28"}, alloc(1, []string{"team"})),
	)
	tests := []struct {
		name   string
		req    Request
		want   []netip.Addr
		reason string
	}{
		{"in pool", Request{IPs: addrs("10.0.0.5")}, addrs("10.0.0.5"), ""},
		{"outside every pool", Request{IPs: addrs("192.168.1.1")}, nil, ReasonIPNotInPool},
		{"in pool b but pool a requested", Request{IPs: addrs("10.0.1.1"), Pool: "a"}, nil, ReasonIPNotInPool},
		{"in pool a and pool a requested", Request{IPs: addrs("10.0.0.2"), Pool: "a"}, addrs("10.0.0.2"), ""},
		{"serviceAllocation pool, wrong namespace", Request{Namespace: "other", IPs: addrs("10.0.2.1")}, nil, ReasonPoolNotAllowed},
		{"serviceAllocation pool, right namespace", Request{Namespace: "team", IPs: addrs("10.0.2.1")}, addrs("10.0.2.1"), ""},
		{"taken", Request{IPs: addrs("10.0.0.1")}, nil, ReasonIPAlreadyInUse},
		{"family mismatch", Request{Families: v4, IPs: addrs("fd00::1")}, nil, ReasonFamilyMismatch},
		{"two of one family", Request{IPs: addrs("10.0.0.2", "10.0.0.3")}, nil, ReasonFamilyMismatch},
		{"dual from two pools", Request{Families: v4v6, Policy: requir, IPs: addrs("10.0.1.2", "fd00::2")}, nil, ReasonIPNotInPool},
		{"dual from one pool, family order kept", Request{Families: v6v4, Policy: requir, IPs: addrs("10.0.0.9", "fd00::9")}, addrs("fd00::9", "10.0.0.9"), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := New(ps)
			if _, _, err := a.Allocate("ns/holder", Request{IPs: addrs("10.0.0.1")}); err != nil {
				t.Fatal(err)
			}
			ips, _, err := a.Allocate("ns/svc", tt.req)
			if reason(err) != tt.reason || !slices.Equal(ips, tt.want) {
				t.Fatalf("got %v, %v; want %v, reason %q", ips, err, tt.want, tt.reason)
			}
			// A refusal of explicitly requested addresses names the address.
			if err != nil && len(tt.req.IPs) > 0 && tt.reason != ReasonFamilyMismatch && !strings.Contains(err.Error(), tt.req.IPs[0].String()) {
				t.Errorf("error %q does not name the requested address %s", err, tt.req.IPs[0])
			}
			if err != nil {
				if _, _, ok := a.Allocation("ns/svc"); ok {
					t.Fatalf("failed key still holds addresses")
				}
			}
			checkInvariants(t, a, true)
		})
	}
}

func TestSharing(t *testing.T) {
	udp := func(p int32) Port { return Port{Protocol: corev1.ProtocolUDP, Port: p} }
	ip := addrs("10.0.0.1")
	first := Request{IPs: ip, SharingKey: "k", Ports: tcp(80)}
	tests := []struct {
		name    string
		first   Request
		second  Request
		reason  string
		message string
	}{
		{"same key, different ports", first, Request{IPs: ip, SharingKey: "k", Ports: tcp(443)}, "", ""},
		{"TCP/53 and UDP/53", Request{IPs: ip, SharingKey: "k", Ports: []Port{udp(53)}}, Request{IPs: ip, SharingKey: "k", Ports: tcp(53)}, "", ""},
		{"same Local selector", Request{IPs: ip, SharingKey: "k", BackendKey: "app=x", Ports: tcp(80)},
			Request{IPs: ip, SharingKey: "k", BackendKey: "app=x", Ports: tcp(81)}, "", ""},
		{"existing does not share", Request{IPs: ip, Ports: tcp(80)}, Request{IPs: ip, SharingKey: "k", Ports: tcp(81)},
			ReasonIPAlreadyInUse, "existing service does not allow sharing"},
		{"new does not share", first, Request{IPs: ip, Ports: tcp(81)}, ReasonIPAlreadyInUse, "new service does not allow sharing"},
		{"different sharing keys", first, Request{IPs: ip, SharingKey: "other", Ports: tcp(81)},
			ReasonSharingConflict, `sharing key "other" does not match existing sharing key "k"`},
		{"different backend keys", Request{IPs: ip, SharingKey: "k", BackendKey: "app=x", Ports: tcp(80)},
			Request{IPs: ip, SharingKey: "k", BackendKey: "app=y", Ports: tcp(81)},
			ReasonSharingConflict, `backend key "app=y" does not match existing backend key "app=x"`},
		{"Local vs Cluster", first, Request{IPs: ip, SharingKey: "k", BackendKey: "app=x", Ports: tcp(81)},
			ReasonSharingConflict, "backend key"},
		{"port overlap", first, Request{IPs: ip, SharingKey: "k", Ports: tcp(443, 80)},
			ReasonSharingConflict, "port TCP/80 is already in use on 10.0.0.1 by ns/first"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := New(pools(mkPool(t, "p", []string{"10.0.0.0/29"})))
			if _, _, err := a.Allocate("ns/first", tt.first); err != nil {
				t.Fatal(err)
			}
			_, _, err := a.Allocate("ns/second", tt.second)
			if reason(err) != tt.reason || (err != nil && !strings.Contains(err.Error(), tt.message)) {
				t.Fatalf("got %v, want reason %q containing %q", err, tt.reason, tt.message)
			}
			checkInvariants(t, a, true)
			// Assign (restore) applies the same rules.
			a.Release("ns/second")
			_, err = a.Assign("ns/second", tt.second, ip)
			if reason(err) != tt.reason {
				t.Fatalf("Assign: got %v, want reason %q", err, tt.reason)
			}
		})
	}

	t.Run("auto-assignment colocates with a compatible sharer", func(t *testing.T) {
		a := New(pools(mkPool(t, "p", []string{"10.0.0.0/29"})))
		mustAlloc := func(key string, req Request) netip.Addr {
			t.Helper()
			ips, _, err := a.Allocate(key, req)
			if err != nil {
				t.Fatal(err)
			}
			return ips[0]
		}
		plain := mustAlloc("ns/plain", Request{Ports: tcp(80)})
		dnsUDP := mustAlloc("ns/dns-udp", Request{SharingKey: "dns", Ports: []Port{udp(53)}})
		dnsTCP := mustAlloc("ns/dns-tcp", Request{SharingKey: "dns", Ports: tcp(53)})
		clash := mustAlloc("ns/dns-tcp2", Request{SharingKey: "dns", Ports: tcp(53)})
		if plain.String() != "10.0.0.0" || dnsUDP.String() != "10.0.0.1" || dnsTCP != dnsUDP || clash.String() != "10.0.0.2" {
			t.Fatalf("got plain %s, dns-udp %s, dns-tcp %s, clash %s", plain, dnsUDP, dnsTCP, clash)
		}
		// Release of one sharer keeps the address held by the other.
		a.Release("ns/dns-udp")
		if s := a.PoolStats("p"); s.AssignedIPv4 != 3 {
			t.Fatalf("assigned %d after releasing one sharer, want 3", s.AssignedIPv4)
		}
		checkInvariants(t, a, true)
	})

	t.Run("alone on its address, a key may change its sharing key in place", func(t *testing.T) {
		a := New(pools(mkPool(t, "p", []string{"10.0.0.0/29"})))
		ips1, _, _ := a.Allocate("ns/s", Request{SharingKey: "a", Ports: tcp(80)})
		ips2, _, err := a.Allocate("ns/s", Request{SharingKey: "b", Ports: tcp(80)})
		if err != nil || !slices.Equal(ips1, ips2) {
			t.Fatalf("got %v %v, want unchanged %v", ips2, err, ips1)
		}
		ips3, _, err := a.Allocate("ns/t", Request{SharingKey: "b", Ports: tcp(81)})
		if err != nil || !slices.Equal(ips3, ips1) {
			t.Fatalf("new key b sharer got %v %v, want %v", ips3, err, ips1)
		}
		// Now shared: changing the key moves the service to a new address.
		ips4, _, err := a.Allocate("ns/s", Request{SharingKey: "c", Ports: tcp(80)})
		if err != nil || slices.Equal(ips4, ips1) {
			t.Fatalf("got %v %v, want a different address", ips4, err)
		}
		checkInvariants(t, a, true)
	})
}

func TestDualStack(t *testing.T) {
	ps := pools(
		mkPool(t, "a-v4", []string{"10.0.0.0/30"}),
		mkPool(t, "b-v6", []string{"fd00:1::/126"}),
		mkPool(t, "c-dual", []string{"10.0.9.0/30", "fd00:9::/126"}),
	)
	tests := []struct {
		name     string
		req      Request
		want     []string
		wantPool string
		reason   string
	}{
		{"SingleStack IPv4", Request{Families: v4}, []string{"10.0.0.0"}, "a-v4", ""},
		{"SingleStack IPv6", Request{Families: v6}, []string{"fd00:1::"}, "b-v6", ""},
		{"SingleStack keeps the first family", Request{Families: v6v4, Policy: single}, []string{"fd00:1::"}, "b-v6", ""},
		{"RequireDualStack from one pool", Request{Families: v4v6, Policy: requir}, []string{"10.0.9.0", "fd00:9::"}, "c-dual", ""},
		{"RequireDualStack, IPv6 primary", Request{Families: v6v4, Policy: requir}, []string{"fd00:9::", "10.0.9.0"}, "c-dual", ""},
		{"PreferDualStack takes a dual pool", Request{Families: v4v6, Policy: prefer}, []string{"10.0.9.0", "fd00:9::"}, "c-dual", ""},
		{"PreferDualStack single family cluster", Request{Families: v4, Policy: prefer}, []string{"10.0.0.0"}, "a-v4", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := New(ps)
			ips, pool, err := a.Allocate("ns/s", tt.req)
			if reason(err) != tt.reason || pool != tt.wantPool || !slices.Equal(ips, addrs(tt.want...)) {
				t.Fatalf("got %v %q %v, want %v %q %q", ips, pool, err, tt.want, tt.wantPool, tt.reason)
			}
			checkInvariants(t, a, true)
		})
	}

	t.Run("RequireDualStack without a dual pool fails, PreferDualStack falls back", func(t *testing.T) {
		a := New(pools(mkPool(t, "a-v4", []string{"10.0.0.0/30"}), mkPool(t, "b-v6", []string{"fd00:1::/126"})))
		if _, _, err := a.Allocate("ns/r", Request{Families: v4v6, Policy: requir}); reason(err) != ReasonNoAvailableIPs {
			t.Fatalf("require: %v, want NoAvailableIPs", err)
		}
		ips, pool, err := a.Allocate("ns/p", Request{Families: v6v4, Policy: prefer})
		if err != nil || pool != "b-v6" || !slices.Equal(ips, addrs("fd00:1::")) {
			t.Fatalf("prefer: %v %q %v, want primary family only", ips, pool, err)
		}
	})

	t.Run("PreferDualStack gains the second family when it frees up", func(t *testing.T) {
		a := New(pools(mkPool(t, "d", []string{"10.0.0.0/32", "fd00::/128"})))
		if _, _, err := a.Allocate("ns/v6", Request{Families: v6}); err != nil {
			t.Fatal(err)
		}
		ips, _, err := a.Allocate("ns/p", Request{Families: v4v6, Policy: prefer})
		if err != nil || !slices.Equal(ips, addrs("10.0.0.0")) {
			t.Fatalf("got %v %v", ips, err)
		}
		a.Release("ns/v6")
		ips, _, err = a.Allocate("ns/p", Request{Families: v4v6, Policy: prefer})
		if err != nil || !slices.Equal(ips, addrs("10.0.0.0", "fd00::")) {
			t.Fatalf("got %v %v, want the IPv4 kept and IPv6 added", ips, err)
		}
		checkInvariants(t, a, true)
	})
}

func TestReleaseReusesLowest(t *testing.T) {
	a := New(pools(mkPool(t, "p", []string{"10.0.0.0/24"})))
	for i := range 5 {
		if _, _, err := a.Allocate(fmt.Sprintf("ns/s%d", i), Request{}); err != nil {
			t.Fatal(err)
		}
	}
	a.Release("ns/s3")
	a.Release("ns/s1")
	a.Release("ns/unknown") // no-op
	for _, want := range []string{"10.0.0.1", "10.0.0.3", "10.0.0.5"} {
		ips, _, err := a.Allocate("ns/new-"+want, Request{})
		if err != nil || ips[0].String() != want {
			t.Fatalf("got %v %v, want %s", ips, err, want)
		}
	}
	checkInvariants(t, a, true)
}

func TestAllocateIdempotentAndMoves(t *testing.T) {
	a := New(pools(mkPool(t, "a", []string{"10.0.0.0/28"}), mkPool(t, "b", []string{"10.0.1.0/28"})))
	ips, pool, _ := a.Allocate("ns/s", Request{})
	// A new, better pool does not move an allocation that still fits.
	a.SetPools(pools(mkPool(t, "a", []string{"10.0.0.0/28"}), mkPool(t, "b", []string{"10.0.1.0/28"}),
		mkPool(t, "best", []string{"10.0.2.0/28"}, alloc(1, []string{"ns"}))))
	again, pool2, err := a.Allocate("ns/s", Request{Namespace: "ns"})
	if err != nil || !slices.Equal(ips, again) || pool != pool2 {
		t.Fatalf("re-allocate moved %v/%s to %v/%s (%v)", ips, pool, again, pool2, err)
	}
	// A pool annotation change moves it.
	moved, pool3, err := a.Allocate("ns/s", Request{Namespace: "ns", Pool: "b"})
	if err != nil || pool3 != "b" || moved[0].String() != "10.0.1.0" {
		t.Fatalf("got %v %q %v", moved, pool3, err)
	}
	// A requested IP change moves it; the old address is free again.
	req, _, err := a.Allocate("ns/s", Request{Namespace: "ns", IPs: addrs("10.0.0.7")})
	if err != nil || req[0].String() != "10.0.0.7" {
		t.Fatalf("got %v %v", req, err)
	}
	if s := a.PoolStats("b"); s.AssignedIPv4 != 0 {
		t.Fatalf("pool b still has %d assigned", s.AssignedIPv4)
	}
	// A failing request leaves the key with nothing.
	if _, _, err := a.Allocate("ns/s", Request{IPs: addrs("192.0.2.1")}); reason(err) != ReasonIPNotInPool {
		t.Fatalf("got %v", err)
	}
	if _, _, ok := a.Allocation("ns/s"); ok {
		t.Fatalf("key still holds addresses after a failed Allocate")
	}
	checkInvariants(t, a, true)
}

func TestAssignRestore(t *testing.T) {
	a := New(pools(mkPool(t, "p", []string{"10.0.0.0/28", "fd00::/124"}, noAuto)))
	pool, err := a.Assign("ns/s", Request{Families: v4v6, Policy: requir}, addrs("10.0.0.9", "fd00::3"))
	if err != nil || pool != "p" {
		t.Fatalf("got %q %v", pool, err)
	}
	// Allocate after a restore returns the restored addresses unchanged,
	// even from an autoAssign=false pool.
	ips, _, err := a.Allocate("ns/s", Request{Families: v4v6, Policy: requir})
	if err != nil || !slices.Equal(ips, addrs("10.0.0.9", "fd00::3")) {
		t.Fatalf("got %v %v", ips, err)
	}
	if _, err := a.Assign("ns/t", Request{Families: v4}, addrs("fd00::4")); reason(err) != ReasonFamilyMismatch {
		t.Fatalf("got %v, want FamilyMismatch", err)
	}
	if _, err := a.Assign("ns/t", Request{}, nil); reason(err) != ReasonInvalidRequest {
		t.Fatalf("got %v, want InvalidRequest", err)
	}
	checkInvariants(t, a, true)
}

func TestSetPools(t *testing.T) {
	a := New(pools(
		mkPool(t, "p", []string{"10.0.0.0/28"}),
		mkPool(t, "team", []string{"10.0.1.0/28"}, alloc(1, []string{"team"})),
	))
	for i := range 6 {
		if _, _, err := a.Allocate(fmt.Sprintf("ns/s%d", i), Request{Namespace: "ns"}); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := a.Allocate("team/t", Request{Namespace: "team"}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.Allocate("ns/byname", Request{Namespace: "ns", Pool: "p"}); err != nil {
		t.Fatal(err)
	}
	// Shrink p to .0-.3, rename nothing, make team serve "other" only.
	lost := a.SetPools(pools(
		mkPool(t, "p", []string{"10.0.0.0-10.0.0.3"}),
		mkPool(t, "team", []string{"10.0.1.0/28"}, alloc(1, []string{"other"})),
	))
	if want := []string{"ns/byname", "ns/s4", "ns/s5", "team/t"}; !slices.Equal(lost, want) {
		t.Fatalf("lost %v, want %v", lost, want)
	}
	for i := range 4 {
		ips, _, ok := a.Allocation(fmt.Sprintf("ns/s%d", i))
		if !ok || ips[0] != netip.AddrFrom4([4]byte{10, 0, 0, byte(i)}) {
			t.Fatalf("ns/s%d: %v %v, want unchanged", i, ips, ok)
		}
	}
	checkInvariants(t, a, true)

	// Renaming the pool keeps addresses (no pool was requested by name), and
	// avoidBuggyIPs drops the .0 holder.
	lost = a.SetPools(pools(mkPool(t, "renamed", []string{"10.0.0.0/24"}, avoidBuggy)))
	if !slices.Equal(lost, []string{"ns/s0"}) {
		t.Fatalf("lost %v, want [ns/s0]", lost)
	}
	if _, pool, _ := a.Allocation("ns/s1"); pool != "renamed" {
		t.Fatalf("pool %q, want renamed", pool)
	}
	if s := a.PoolStats("renamed"); s != (Stats{AvailableIPv4: 251, AssignedIPv4: 3}) {
		t.Fatalf("stats %+v", s)
	}
	checkInvariants(t, a, true)

	// Removing every pool loses everyone.
	if lost := a.SetPools(nil); len(lost) != 3 || len(a.ips) != 0 {
		t.Fatalf("lost %v, %d addresses left", lost, len(a.ips))
	}
}

func TestStatsSaturate(t *testing.T) {
	a := New(pools(
		mkPool(t, "big4", []string{"10.0.0.0/8"}),
		mkPool(t, "v6", []string{"fd00::/64", "fd01::/120"}),
	))
	if _, _, err := a.Allocate("ns/s", Request{Families: v6, Pool: "v6"}); err != nil {
		t.Fatal(err)
	}
	if s := a.PoolStats("big4"); s.AvailableIPv4 != 1<<24 {
		t.Fatalf("big4 %+v", s)
	}
	if s := a.PoolStats("v6"); s.AvailableIPv6 != math.MaxInt64 || s.AssignedIPv6 != 1 {
		t.Fatalf("v6 %+v, want saturated available", s)
	}
	if s := a.PoolStats("nope"); s != (Stats{}) {
		t.Fatalf("unknown pool %+v", s)
	}
	a = New(pools(mkPool(t, "all6", []string{"::/0"})))
	if s := a.PoolStats("all6"); s.AvailableIPv6 != math.MaxInt64 {
		t.Fatalf("all6 %+v", s)
	}
	ips, _, err := a.Allocate("ns/t", Request{Families: v6, Pool: "all6"})
	if err != nil || ips[0] != netip.MustParseAddr("::") {
		t.Fatalf("::/0 first address: %v %v", ips, err)
	}
}

// Overlapping ranges are rejected by config.Parse; if they ever reach the
// allocator, the later one (by address, then pool name) is ignored so no
// address can be handed out twice.
func TestOverlappingRangesIgnored(t *testing.T) {
	a := New(pools(
		mkPool(t, "a", []string{"10.0.0.0/30"}),
		mkPool(t, "b", []string{"10.0.0.2-10.0.0.9"}),
		mkPool(t, "c", []string{"10.0.0.0/30"}),
	))
	if s := a.PoolStats("a"); s.AvailableIPv4 != 4 {
		t.Fatalf("a: %+v", s)
	}
	for _, p := range []string{"b", "c"} {
		if s := a.PoolStats(p); s != (Stats{}) {
			t.Fatalf("%s: %+v, want its overlapping range ignored", p, s)
		}
	}
	if _, err := a.Assign("ns/x", Request{}, addrs("10.0.0.5")); reason(err) != ReasonIPNotInPool {
		t.Fatalf("got %v", err)
	}
	checkInvariants(t, a, false)
}

// An IPv6 range ending at the top of the address space must not wrap.
func TestTopOfAddressSpace(t *testing.T) {
	a := New(pools(
		mkPool(t, "top6", []string{"ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe/127"}),
		mkPool(t, "top4", []string{"255.255.255.254/31"}, avoidBuggy),
	))
	var got []netip.Addr
	for i := range 3 {
		ips, _, err := a.Allocate(fmt.Sprintf("ns/%d", i), Request{Families: v6})
		if err == nil {
			got = append(got, ips...)
		} else if reason(err) != ReasonNoAvailableIPs {
			t.Fatal(err)
		}
	}
	if want := addrs("ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"); !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	ips, _, err := a.Allocate("ns/v4", Request{})
	if err != nil || ips[0].String() != "255.255.255.254" {
		t.Fatalf("got %v %v", ips, err)
	}
	if _, _, err := a.Allocate("ns/v4b", Request{}); reason(err) != ReasonNoAvailableIPs {
		t.Fatalf("got %v", err)
	}
	checkInvariants(t, a, true)
}

// A /8 and a /64 cost the same memory as two tiny pools holding the same
// addresses: nothing is proportional to a pool's size.
func TestNoMaterialisation(t *testing.T) {
	const n = 2000
	keys := make([]string, 2*n)
	for i := range keys {
		keys[i] = fmt.Sprintf("ns/s-%d", i)
	}
	grow := func(big bool) int64 {
		p4, p6 := "10.0.0.0/20", "fd00::/116"
		if big {
			p4, p6 = "10.0.0.0/8", "fd00::/64"
		}
		before := heapInUse()
		a := New(pools(mkPool(t, "p4", []string{p4}), mkPool(t, "p6", []string{p6})))
		for i := range n {
			if _, _, err := a.Allocate(keys[2*i], Request{}); err != nil {
				t.Fatal(err)
			}
			if _, _, err := a.Allocate(keys[2*i+1], Request{Families: v6}); err != nil {
				t.Fatal(err)
			}
		}
		grown := int64(heapInUse()) - int64(before)
		runtime.KeepAlive(a)
		return grown
	}
	small, big := grow(false), grow(true)
	t.Logf("heap for %d addresses: small pools %d bytes, /8 + /64 %d bytes (%d bytes/address)", 2*n, small, big, big/(2*n))
	// A bitmap of the /8 alone would be 2 MiB; allow GC noise only.
	if big-small > 256<<10 {
		t.Fatalf("a /8 and a /64 cost %d bytes more than small pools", big-small)
	}
}

func TestUsableIndexMapping(t *testing.T) {
	for _, r := range []string{"10.0.0.0/22", "10.0.0.255-10.0.2.0", "10.0.0.5-10.0.0.9", "10.0.0.255/32", "0.0.0.0/23"} {
		s := newSpan(nil, rng(t, r), true)
		var want []netip.Addr
		for ip := s.first; ip.IsValid() && ip.Compare(s.last) <= 0; ip = ip.Next() {
			if !isBuggy(addrU32(ip)) {
				want = append(want, ip)
			}
		}
		if len(want) == 0 {
			if !s.empty {
				t.Fatalf("%s: expected an empty span", r)
			}
			continue
		}
		if s.lastIdx.lo != uint64(len(want)-1) {
			t.Fatalf("%s: lastIdx %d, want %d", r, s.lastIdx.lo, len(want)-1)
		}
		for i, ip := range want {
			idx, ok := s.index(ip)
			if !ok || idx.lo != uint64(i) || s.addr(idx) != ip {
				t.Fatalf("%s: %s -> %v %v -> %s", r, ip, idx, ok, s.addr(idx))
			}
		}
	}
}

func TestTreap(t *testing.T) {
	var tr treap
	model := map[uint64]bool{}
	x := uint64(1)
	for i := range 20000 {
		x = x*6364136223846793005 + 1442695040888963407
		k := (x >> 33) % 300
		if i%3 == 2 {
			if tr.remove(u128{0, k}) != model[k] {
				t.Fatalf("remove %d", k)
			}
			delete(model, k)
		} else {
			if tr.insert(u128{0, k}) == model[k] {
				t.Fatalf("insert %d", k)
			}
			model[k] = true
		}
		if tr.Len() != len(model) {
			t.Fatalf("len %d, want %d", tr.Len(), len(model))
		}
		var gap uint64
		for model[gap] {
			gap++
		}
		if g := tr.firstGap(); g != (u128{0, gap}) {
			t.Fatalf("step %d: firstGap %v, want %d", i, g, gap)
		}
	}
	var seq treap
	for i := range uint64(1 << 16) {
		seq.insert(u128{0, i})
	}
	if d := seq.depth(); d > 60 {
		t.Fatalf("depth %d after 65536 sequential inserts: unbalanced", d)
	} else {
		t.Logf("depth after 65536 sequential inserts: %d", d)
	}
	if g := seq.firstGap(); g != (u128{0, 1 << 16}) {
		t.Fatalf("firstGap %v", g)
	}
	var prev *u128
	tr.walk(func(k u128) {
		if prev != nil && prev.cmp(k) >= 0 {
			t.Fatalf("walk out of order")
		}
		prev = &k
	})
}

// TestAddressCount: several addresses per family (service.AnnotationAddressCount),
// each the lowest the Service can take, all from one pool; a pool too small
// gives none, never a part.
func TestAddressCount(t *testing.T) {
	ps := pools(mkPool(t, "small", []string{"10.0.0.0/30"}), mkPool(t, "dual", []string{"10.0.9.0/29", "fd00:9::/125"}))
	a := New(ps)
	ips, pool, err := a.Allocate("ns/three", Request{Pool: "dual", Count: 3, Families: v4v6, Policy: requir})
	if err != nil || pool != "dual" || !slices.Equal(ips, addrs("10.0.9.0", "10.0.9.1", "10.0.9.2", "fd00:9::", "fd00:9::1", "fd00:9::2")) {
		t.Fatalf("got %v %q %v, want three of each family from dual", ips, pool, err)
	}
	checkInvariants(t, a, true)

	t.Run("idempotent", func(t *testing.T) {
		again, _, err := a.Allocate("ns/three", Request{Pool: "dual", Count: 3, Families: v4v6, Policy: requir})
		if err != nil || !slices.Equal(again, ips) {
			t.Fatalf("second Allocate: %v %v, want %v", again, err, ips)
		}
	})
	t.Run("a pool too small gives nothing", func(t *testing.T) {
		_, _, err := a.Allocate("ns/five", Request{Pool: "small", Count: 5})
		if reason(err) != ReasonNoAvailableIPs || !strings.Contains(err.Error(), "asks for 5 IPv4 addresses") {
			t.Fatalf("err %v, want %s naming the count", err, ReasonNoAvailableIPs)
		}
		if _, _, ok := a.Allocation("ns/five"); ok {
			t.Fatal("a partial allocation was kept")
		}
		if got := a.PoolStats("small"); got.AssignedIPv4 != 0 {
			t.Fatalf("stats %+v: the failed request left addresses in use", got)
		}
		checkInvariants(t, a, true)
	})
	t.Run("the next Service takes the next addresses", func(t *testing.T) {
		got, _, err := a.Allocate("ns/two", Request{Pool: "dual", Count: 2})
		if err != nil || !slices.Equal(got, addrs("10.0.9.3", "10.0.9.4")) {
			t.Fatalf("got %v %v", got, err)
		}
		checkInvariants(t, a, true)
	})
	t.Run("fewer keeps the lowest it holds", func(t *testing.T) {
		b := New(ps)
		if _, _, err := b.Allocate("ns/shrink", Request{Pool: "dual", Count: 3, Families: v4v6, Policy: requir}); err != nil {
			t.Fatal(err)
		}
		got, _, err := b.Allocate("ns/shrink", Request{Pool: "dual", Count: 1, Families: v4v6, Policy: requir})
		if err != nil || !slices.Equal(got, addrs("10.0.9.0", "fd00:9::")) {
			t.Fatalf("count 3 -> 1: %v %v, want the first of each family", got, err)
		}
		if st := b.PoolStats("dual"); st.AssignedIPv4 != 1 || st.AssignedIPv6 != 1 {
			t.Fatalf("stats %+v: the other addresses were not released", st)
		}
		checkInvariants(t, b, true)
	})
	t.Run("restore from status", func(t *testing.T) {
		b := New(ps)
		if _, err := b.Assign("ns/three", Request{Count: 3, Families: v4v6, Policy: requir}, ips); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Assign("ns/x", Request{Count: 1}, addrs("10.0.0.1", "10.0.0.2")); reason(err) != ReasonFamilyMismatch {
			t.Fatalf("two IPv4 for a count of 1: %v, want %s", err, ReasonFamilyMismatch)
		}
		checkInvariants(t, b, true)
	})
	t.Run("requested addresses", func(t *testing.T) {
		b := New(ps)
		got, _, err := b.Allocate("ns/req", Request{Count: 2, IPs: addrs("10.0.9.5", "10.0.9.2")})
		if err != nil || !slices.Equal(got, addrs("10.0.9.5", "10.0.9.2")) {
			t.Fatalf("got %v %v", got, err)
		}
		if _, _, err := b.Allocate("ns/bad", Request{Count: 2, IPs: addrs("10.0.9.6")}); reason(err) != ReasonFamilyMismatch {
			t.Fatalf("one address for a count of 2: %v, want %s", err, ReasonFamilyMismatch)
		}
		checkInvariants(t, b, true)
	})
	t.Run("sharing applies per address", func(t *testing.T) {
		b := New(ps)
		if _, _, err := b.Allocate("ns/a", Request{Pool: "dual", Count: 2, SharingKey: "k", Ports: tcp(80)}); err != nil {
			t.Fatal(err)
		}
		got, _, err := b.Allocate("ns/b", Request{Pool: "dual", Count: 2, SharingKey: "k", Ports: tcp(443)})
		if err != nil || !slices.Equal(got, addrs("10.0.9.0", "10.0.9.1")) {
			t.Fatalf("a Service sharing both addresses: %v %v", got, err)
		}
		got, _, err = b.Allocate("ns/c", Request{Pool: "dual", Count: 2, SharingKey: "k", Ports: tcp(80)})
		if err != nil || !slices.Equal(got, addrs("10.0.9.2", "10.0.9.3")) {
			t.Fatalf("a port conflict takes new addresses: %v %v", got, err)
		}
		checkInvariants(t, b, true)
	})
}
