package allocator

import (
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/ironlb/ironlb/internal/config"
	"github.com/ironlb/ironlb/internal/service"
)

// rng parses "a-b" or a CIDR into a config.Range.
func rng(t testing.TB, s string) config.Range {
	t.Helper()
	if first, last, ok := strings.Cut(s, "-"); ok {
		return config.Range{First: netip.MustParseAddr(first), Last: netip.MustParseAddr(last)}
	}
	p := netip.MustParsePrefix(s).Masked()
	return config.Range{First: p.Addr(), Last: lastOf(p)}
}

func lastOf(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 1 << (7 - i%8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

type poolOpt func(*config.Pool)

func noAuto(p *config.Pool)     { p.AutoAssign = false }
func avoidBuggy(p *config.Pool) { p.AvoidBuggyIPs = true }

func alloc(prio int, namespaces []string, selectors ...string) poolOpt {
	return func(p *config.Pool) {
		sa := &config.ServiceAllocation{Priority: prio, Namespaces: sets.New(namespaces...)}
		for _, s := range selectors {
			sel, err := labels.Parse(s)
			if err != nil {
				panic(err)
			}
			sa.ServiceSelectors = append(sa.ServiceSelectors, sel)
		}
		p.ServiceAllocation = sa
	}
}

func mkPool(t testing.TB, name string, ranges []string, opts ...poolOpt) *config.Pool {
	p := &config.Pool{Name: name, AutoAssign: true}
	for _, r := range ranges {
		p.Ranges = append(p.Ranges, rng(t, r))
	}
	slices.SortFunc(p.Ranges, func(x, y config.Range) int { return x.First.Compare(y.First) })
	for _, o := range opts {
		o(p)
	}
	return p
}

func pools(ps ...*config.Pool) map[string]*config.Pool {
	m := map[string]*config.Pool{}
	for _, p := range ps {
		m[p.Name] = p
	}
	return m
}

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

func reason(err error) string {
	if err == nil {
		return ""
	}
	if e := (*Error)(nil); errors.As(err, &e) {
		return e.Reason
	}
	return fmt.Sprintf("untyped(%v)", err)
}

var (
	v4     = []corev1.IPFamily{corev1.IPv4Protocol}
	v6     = []corev1.IPFamily{corev1.IPv6Protocol}
	v4v6   = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
	v6v4   = []corev1.IPFamily{corev1.IPv6Protocol, corev1.IPv4Protocol}
	single = corev1.IPFamilyPolicySingleStack
	prefer = corev1.IPFamilyPolicyPreferDualStack
	requir = corev1.IPFamilyPolicyRequireDualStack
)

func tcp(ports ...int32) []Port {
	var out []Port
	for _, p := range ports {
		out = append(out, Port{Protocol: corev1.ProtocolTCP, Port: p})
	}
	return out
}

// checkInvariants verifies the allocator's state against a brute-force
// recount: owners, sharing validity, pool membership, indexes and stats.
// Pools must be small enough to enumerate (fuzz and unit tests only).
func checkInvariants(t testing.TB, a *Allocator, enumerate bool) {
	t.Helper()
	held := map[netip.Addr][]string{}
	for key, al := range a.allocs {
		perFamily := map[bool]int{}
		for i, ip := range al.ips {
			perFamily[ip.Is4()]++
			if slices.Contains(al.ips[:i], ip) {
				t.Fatalf("%s holds %s twice: %v", key, ip, al.ips)
			}
		}
		if len(al.ips) == 0 || len(al.ips) > 2*service.MaxAddressCount {
			t.Fatalf("%s holds %d addresses", key, len(al.ips))
		}
		if len(perFamily) == 2 && perFamily[true] != perFamily[false] {
			t.Fatalf("%s holds %d IPv4 and %d IPv6 addresses: %v", key, perFamily[true], perFamily[false], al.ips)
		}
		p := a.pools[al.pool]
		if p == nil {
			t.Fatalf("%s holds %v from unknown pool %q", key, al.ips, al.pool)
		}
		for _, ip := range al.ips {
			if !inPoolUsable(p.cfg, ip) {
				t.Fatalf("%s holds %s, not a usable address of pool %q", key, ip, al.pool)
			}
			held[ip] = append(held[ip], key)
		}
		if poolAllowed(p, al.req.request()) != nil {
			t.Fatalf("%s holds addresses of pool %q it may not use", key, al.pool)
		}
	}
	if len(held) != len(a.ips) {
		t.Fatalf("entries: %d, addresses held: %d", len(a.ips), len(held))
	}
	wantShared := map[string]map[netip.Addr]struct{}{}
	for ip, keys := range held {
		e := a.ips[ip]
		if e == nil {
			t.Fatalf("%s held by %v has no entry", ip, keys)
		}
		slices.Sort(keys)
		hs := slices.Sorted(slices.Values(e.holders))
		if !slices.Equal(keys, hs) {
			t.Fatalf("%s: holders %v, allocations say %v", ip, hs, keys)
		}
		if len(keys) > 1 {
			for i, k1 := range keys {
				r1 := a.allocs[k1].req
				if r1.SharingKey == "" {
					t.Fatalf("%s shared by %v but %s has no sharing key", ip, keys, k1)
				}
				for _, k2 := range keys[i+1:] {
					r2 := a.allocs[k2].req
					if r1.SharingKey != r2.SharingKey || r1.BackendKey != r2.BackendKey {
						t.Fatalf("%s shared by %s and %s with different keys", ip, k1, k2)
					}
					for _, p := range r1.Ports {
						if slices.Contains(r2.Ports, p) {
							t.Fatalf("%s shared by %s and %s, both on %s", ip, k1, k2, p)
						}
					}
				}
			}
		}
		if sk := a.allocs[keys[0]].req.SharingKey; sk != "" {
			if wantShared[sk] == nil {
				wantShared[sk] = map[netip.Addr]struct{}{}
			}
			wantShared[sk][ip] = struct{}{}
		}
		idx, ok := e.span.index(ip)
		if a.spanFor(ip) != e.span || !ok || !e.span.used.contains(idx) || e.span.addr(idx) != ip {
			t.Fatalf("%s: span/index out of sync", ip)
		}
	}
	if len(wantShared) != len(a.shared) {
		t.Fatalf("shared index has %d keys, want %d", len(a.shared), len(wantShared))
	}
	for sk, m := range wantShared {
		if len(a.shared[sk]) != len(m) {
			t.Fatalf("shared index for %q: %d addresses, want %d", sk, len(a.shared[sk]), len(m))
		}
		for ip := range m {
			if _, ok := a.shared[sk][ip]; !ok {
				t.Fatalf("shared index for %q misses %s", sk, ip)
			}
		}
	}
	total := 0
	for _, s := range a.spans {
		total += s.used.Len()
	}
	if total != len(a.ips) {
		t.Fatalf("trees hold %d addresses, entries %d", total, len(a.ips))
	}
	if !enumerate {
		return
	}
	for name, p := range a.pools {
		var want Stats
		for _, r := range p.cfg.Ranges {
			for ip := r.First; ip.IsValid() && ip.Compare(r.Last) <= 0; ip = ip.Next() {
				if !inPoolUsable(p.cfg, ip) {
					continue
				}
				_, used := held[ip]
				switch {
				case ip.Is4() && used:
					want.AssignedIPv4++
				case ip.Is4():
					want.AvailableIPv4++
				case used:
					want.AssignedIPv6++
				default:
					want.AvailableIPv6++
				}
			}
		}
		if got := a.PoolStats(name); got != want {
			t.Fatalf("PoolStats(%q) = %+v, brute force %+v", name, got, want)
		}
	}
}

func inPoolUsable(p *config.Pool, ip netip.Addr) bool {
	for _, r := range p.Ranges {
		if r.First.Is4() == ip.Is4() && r.First.Compare(ip) <= 0 && ip.Compare(r.Last) <= 0 {
			if p.AvoidBuggyIPs && ip.Is4() {
				b := ip.As4()
				if b[3] == 0 || b[3] == 255 {
					return false
				}
			}
			return true
		}
	}
	return false
}

// lowestFree is the brute-force "first free address" of family v4 in p.
func lowestFree(a *Allocator, p *config.Pool, v4 bool) netip.Addr {
	for _, r := range p.Ranges {
		if r.First.Is4() != v4 {
			continue
		}
		for ip := r.First; ip.IsValid() && ip.Compare(r.Last) <= 0; ip = ip.Next() {
			if _, used := a.ips[ip]; !used && inPoolUsable(p, ip) {
				return ip
			}
		}
	}
	return netip.Addr{}
}

// heapInUse returns the live heap after a full collection.
func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
