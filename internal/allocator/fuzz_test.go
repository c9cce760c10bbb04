package allocator

import (
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/ironlb/ironlb/internal/config"
)

// fuzzInput turns fuzz bytes into choices; exhausted input reads as zeros.
type fuzzInput struct{ b []byte }

func (in *fuzzInput) next() int {
	if len(in.b) == 0 {
		return 0
	}
	c := in.b[0]
	in.b = in.b[1:]
	return int(c)
}

func (in *fuzzInput) pick(n int) int { return in.next() % n }

// fuzzPools builds up to three small pools over six disjoint slots. IPv4
// slots straddle a .255/.0 boundary so avoidBuggyIPs matters.
func fuzzPools(in *fuzzInput) map[string]*config.Pool {
	n := 1 + in.pick(3)
	ps := make([]*config.Pool, n)
	for i := range ps {
		flags := in.next()
		ps[i] = &config.Pool{Name: fmt.Sprintf("p%d", i), AutoAssign: flags&1 == 0 || flags&6 != 0, AvoidBuggyIPs: flags&8 != 0}
		switch (flags >> 4) % 4 {
		case 1:
			ps[i].ServiceAllocation = &config.ServiceAllocation{Priority: (flags >> 6) % 3, Namespaces: sets.New("a")}
		case 2:
			ps[i].ServiceAllocation = &config.ServiceAllocation{Priority: (flags >> 6) % 3, ServiceSelectors: []labels.Selector{labels.SelectorFromSet(labels.Set{"app": "x"})}}
		}
	}
	for slot := range 6 {
		c := in.next()
		owner := c % (n + 1)
		if owner == n {
			continue
		}
		length := 1 + (c>>3)%12
		var r config.Range
		if c&4 == 0 {
			first := netip.AddrFrom4([4]byte{10, 0, byte(2 * slot), 250})
			r = config.Range{First: first, Last: nth(first, length-1)}
		} else {
			first := netip.MustParseAddr(fmt.Sprintf("fd00:0:0:%x::fffa", slot))
			r = config.Range{First: first, Last: nth(first, length-1)}
		}
		ps[owner].Ranges = append(ps[owner].Ranges, r)
	}
	m := map[string]*config.Pool{}
	for _, p := range ps {
		m[p.Name] = p
	}
	return m
}

func nth(a netip.Addr, n int) netip.Addr {
	for range n {
		a = a.Next()
	}
	return a
}

// fuzzAddr is an address in or near the slots (sometimes outside every pool).
func fuzzAddr(in *fuzzInput) netip.Addr {
	c := in.next()
	slot, off := c%6, (c>>3)%16
	if in.next()&1 == 0 {
		return nth(netip.AddrFrom4([4]byte{10, 0, byte(2 * slot), 248}), off)
	}
	return nth(netip.MustParseAddr(fmt.Sprintf("fd00:0:0:%x::fff8", slot)), off)
}

func fuzzRequest(in *fuzzInput, key string) Request {
	ns, _, _ := strings.Cut(key, "/")
	req := Request{Namespace: ns}
	c := in.next()
	switch c % 5 {
	case 0:
		req.Families = v4
	case 1:
		req.Families = v6
	case 2:
		req.Families = v4v6
	case 3:
		req.Families = v6v4
	}
	req.Policy = []corev1.IPFamilyPolicy{"", single, prefer, requir}[(c/5)%4]
	if (c/20)%2 == 1 {
		req.Labels = map[string]string{"app": "x"}
	}
	c = in.next()
	req.SharingKey = []string{"", "s1", "s2", "s1"}[c%4]
	req.BackendKey = []string{"", "", "", "app=b"}[(c/4)%4]
	for i, p := range []Port{{corev1.ProtocolTCP, 80}, {corev1.ProtocolTCP, 81}, {corev1.ProtocolUDP, 80}} {
		if c&(16<<i) != 0 {
			req.Ports = append(req.Ports, p)
		}
	}
	c = in.next()
	if c%8 == 0 {
		req.Pool = fmt.Sprintf("p%d", (c/8)%4) // p3 never exists
	}
	if c%5 == 0 {
		req.IPs = []netip.Addr{fuzzAddr(in)}
		if c%3 == 0 {
			req.IPs = append(req.IPs, fuzzAddr(in))
		}
	}
	return req
}

// FuzzAllocator runs random operations against random small pools and checks
// the invariants after each one (see checkInvariants), plus: a fresh
// automatic single-family allocation gets the lowest free address of its
// pool, re-allocating is idempotent, Release frees, SetPools keeps valid
// holders unchanged, and replaying the same operations gives the same state.
func FuzzAllocator(f *testing.F) {
	f.Add([]byte{0})
	f.Add([]byte{2, 0, 0x10, 0x50, 1, 2, 3, 4, 5, 6, 0, 0, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 2, 1, 0, 0})
	f.Add([]byte("\x01\x08\x00\x11\x19\x00\x00\x00\x00\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a"))
	f.Fuzz(func(t *testing.T, data []byte) {
		first := runOps(t, data)
		second := runOps(t, data)
		if !reflect.DeepEqual(first, second) {
			t.Fatalf("same operations, different outcome:\n%v\n%v", first, second)
		}
	})
}

func runOps(t *testing.T, data []byte) map[string]string {
	in := &fuzzInput{b: data}
	a := New(fuzzPools(in))
	checkInvariants(t, a, true)
	keys := []string{"a/s0", "b/s1", "a/s2", "b/s3", "a/s4", "b/s5"}
	for steps := 0; len(in.b) > 0 && steps < 200; steps++ {
		key := keys[in.pick(len(keys))]
		switch op := in.pick(5); op {
		case 0, 4:
			req := fuzzRequest(in, key)
			_, _, had := a.Allocation(key)
			ips, pool, err := a.Allocate(key, req)
			if err != nil {
				if e := (*Error)(nil); !errors.As(err, &e) {
					t.Fatalf("untyped error %T %v", err, err)
				}
				if _, _, ok := a.Allocation(key); ok {
					t.Fatalf("%s holds addresses after a failed Allocate: %v", key, err)
				}
				break
			}
			got, gotPool, ok := a.Allocation(key)
			if !ok || !slices.Equal(got, ips) || gotPool != pool {
				t.Fatalf("Allocation(%s) = %v %q %v, Allocate returned %v %q", key, got, gotPool, ok, ips, pool)
			}
			nreq, _ := normalize(req)
			if !had && len(nreq.IPs) == 0 && nreq.SharingKey == "" && len(ips) == 1 {
				if low := lowestFree(a, a.pools[pool].cfg, ips[0].Is4()); low.IsValid() && low.Less(ips[0]) {
					t.Fatalf("%s got %s from %s, but %s is free", key, ips[0], pool, low)
				}
			}
			if op == 4 {
				again, againPool, err := a.Allocate(key, req)
				if err != nil || againPool != pool || !slices.Equal(again, ips) && (len(ips) != 1 || nreq.Policy != prefer) {
					t.Fatalf("re-Allocate(%s) = %v %q %v, first %v %q", key, again, againPool, err, ips, pool)
				}
			}
		case 1:
			req := fuzzRequest(in, key)
			ips := []netip.Addr{fuzzAddr(in)}
			if in.next()%3 == 0 {
				ips = append(ips, fuzzAddr(in))
			}
			pool, err := a.Assign(key, req, ips)
			got, gotPool, ok := a.Allocation(key)
			if err != nil {
				if ok {
					t.Fatalf("%s holds %v after a failed Assign: %v", key, got, err)
				}
				break
			}
			if !ok || gotPool != pool || len(got) != len(ips) {
				t.Fatalf("Assign(%s, %v) = %q, Allocation %v %q %v", key, ips, pool, got, gotPool, ok)
			}
			for _, ip := range ips {
				if !slices.Contains(got, ip) {
					t.Fatalf("Assign(%s, %v): holds %v", key, ips, got)
				}
			}
		case 2:
			ips, _, _ := a.Allocation(key)
			a.Release(key)
			if _, _, ok := a.Allocation(key); ok {
				t.Fatalf("%s still allocated after Release", key)
			}
			for _, ip := range ips {
				if e := a.ips[ip]; e != nil && slices.Contains(e.holders, key) {
					t.Fatalf("%s still holds %s after Release", key, ip)
				}
			}
		case 3:
			before := map[string][]netip.Addr{}
			for _, k := range keys {
				if ips, _, ok := a.Allocation(k); ok {
					before[k] = ips
				}
			}
			lost := a.SetPools(fuzzPools(in))
			for _, k := range keys {
				ips, _, ok := a.Allocation(k)
				switch {
				case slices.Contains(lost, k) && ok:
					t.Fatalf("lost key %s still holds %v", k, ips)
				case !slices.Contains(lost, k) && !slices.Equal(ips, before[k]):
					t.Fatalf("SetPools moved %s from %v to %v", k, before[k], ips)
				}
			}
		}
		checkInvariants(t, a, true)
	}
	state := map[string]string{}
	for _, k := range keys {
		ips, pool, ok := a.Allocation(k)
		state[k] = fmt.Sprint(ips, pool, ok)
	}
	return state
}

// FuzzParseService checks that annotation parsing never panics, that errors
// are typed and name what was wrong, and that accepted Services give a
// consistent, already-normalized Request.
func FuzzParseService(f *testing.F) {
	f.Add("10.0.0.1", "pool-a", "key", "", uint8(0))
	f.Add("10.0.0.1, fd00::1", "", "", "", uint8(0x1c))
	f.Add("fd00::1,10.0.0.1", "Bad_Name", "k", "10.0.0.1", uint8(0xff))
	f.Add(",", "", "", "::ffff:1.2.3.4", uint8(3))
	f.Add("fe80::1%eth0", "p", "", "", uint8(0x40))
	f.Fuzz(func(t *testing.T, ips, pool, share, lbIP string, flags uint8) {
		ann := map[string]string{}
		prefix := func(bit uint8) string {
			if flags&bit != 0 {
				return legacyPrefix
			}
			return newPrefix
		}
		if ips != "" || flags&0x80 != 0 {
			ann[prefix(1)+"loadBalancerIPs"] = ips
		}
		if pool != "" {
			ann[prefix(2)+"address-pool"] = pool
		}
		if share != "" {
			ann[prefix(1)+"allow-shared-ip"] = share
		}
		s := svc(ann, func(s *corev1.Service) {
			s.Spec.LoadBalancerIP = lbIP
			s.Spec.IPFamilies = [][]corev1.IPFamily{nil, v4, v6, v4v6, v6v4, {"IPv5"}, {corev1.IPv4Protocol, corev1.IPv4Protocol}, nil}[(flags>>2)%8]
			if p := []corev1.IPFamilyPolicy{"", single, prefer, requir}[(flags>>5)%4]; p != "" {
				s.Spec.IPFamilyPolicy = &p
			}
			if flags&0x80 != 0 {
				s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			}
		})
		req, warns, err := ParseService(s)
		for _, w := range warns {
			if w.Reason != WarningDeprecatedAnnotation && w.Reason != WarningDeprecatedField {
				t.Fatalf("unknown warning reason %q", w.Reason)
			}
		}
		if err != nil {
			var e *Error
			if !errors.As(err, &e) || e.Reason == "" || e.Message == "" {
				t.Fatalf("bad error %T %v", err, err)
			}
			named := false
			for _, n := range []string{"loadBalancerIPs", "address-pool", "spec.loadBalancerIP", "ipFamil"} {
				named = named || strings.Contains(e.Message, n)
			}
			if !named {
				t.Fatalf("error names no annotation or field: %q", e.Message)
			}
			return
		}
		if n, e := normalize(req); e != nil || !reflect.DeepEqual(n, req) {
			t.Fatalf("ParseService result is not normalized: %+v -> %+v %v", req, n, e)
		}
		if len(req.Families) == 0 || len(req.Families) > 2 || len(req.IPs) > len(req.Families) {
			t.Fatalf("families %v, IPs %v", req.Families, req.IPs)
		}
		if req.Pool != "" && len(validation.IsDNS1123Subdomain(req.Pool)) > 0 {
			t.Fatalf("accepted pool name %q", req.Pool)
		}
		if req.SharingKey != share {
			t.Fatalf("sharing key %q, annotation %q", req.SharingKey, share)
		}
		if strings.TrimSpace(ips) != "" {
			parts := strings.Split(ips, ",")
			if len(parts) != len(req.IPs) {
				t.Fatalf("annotation %q gave %v", ips, req.IPs)
			}
			for i, p := range parts {
				if netip.MustParseAddr(strings.TrimSpace(p)) != req.IPs[i] {
					t.Fatalf("annotation %q gave %v", ips, req.IPs)
				}
			}
		}
	})
}
