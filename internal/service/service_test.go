package service

import (
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func svcWith(ann map[string]string, mut ...func(*corev1.Service)) *corev1.Service {
	s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns1", Name: "web", Annotations: ann},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer}}
	for _, m := range mut {
		m(s)
	}
	return s
}

func ingress(ips ...string) func(*corev1.Service) {
	return func(s *corev1.Service) {
		for _, ip := range ips {
			s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: ip})
		}
	}
}

func class(c string) func(*corev1.Service) {
	return func(s *corev1.Service) { s.Spec.LoadBalancerClass = &c }
}

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

func TestHandles(t *testing.T) {
	clusterIP := func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeClusterIP }
	for _, tc := range []struct {
		name   string
		svc    *corev1.Service
		class  string
		match  bool // ClassMatches
		handle bool // Handles
	}{
		{"no class, default", svcWith(nil), "", true, true},
		{"no class, ironlb class", svcWith(nil), "ironlb", false, false},
		{"class, default", svcWith(nil, class("ironlb")), "", false, false},
		{"same class", svcWith(nil, class("ironlb")), "ironlb", true, true},
		{"other class", svcWith(nil, class("other")), "ironlb", false, false},
		{"empty class set", svcWith(nil, class("")), "", false, false},
		{"not a load balancer", svcWith(nil, clusterIP), "", true, false},
	} {
		if got := ClassMatches(tc.svc, tc.class); got != tc.match {
			t.Errorf("%s: ClassMatches = %v, want %v", tc.name, got, tc.match)
		}
		if got := Handles(tc.svc, tc.class); got != tc.handle {
			t.Errorf("%s: Handles = %v, want %v", tc.name, got, tc.handle)
		}
	}
}

func TestIngressIPs(t *testing.T) {
	for _, tc := range []struct {
		name   string
		ips    []string
		want   []netip.Addr
		errHas []string // empty: no error
	}{
		{"none", nil, nil, nil},
		{"hostname only", []string{""}, nil, nil},
		{"status order", []string{"fd00::1", "10.0.0.1"}, addrs("fd00::1", "10.0.0.1"), nil},
		{"spaces trimmed", []string{" 10.0.0.1 ", "  "}, addrs("10.0.0.1"), nil},
		{"duplicates dropped", []string{"10.0.0.1", "fd00::1", "10.0.0.1"}, addrs("10.0.0.1", "fd00::1"), nil},
		{"IPv4-mapped unmapped", []string{"::ffff:10.0.0.1", "10.0.0.1"}, addrs("10.0.0.1"), nil},
		{"garbage", []string{"10.0.0.1", "not-an-ip"}, addrs("10.0.0.1"),
			[]string{"ns1/web", "status.loadBalancer.ingress[1].ip", `"not-an-ip"`, "not an IP address"}},
		{"zone", []string{"fe80::1%eth0", "10.0.0.2"}, addrs("10.0.0.2"),
			[]string{"ns1/web", "status.loadBalancer.ingress[0].ip", `"fe80::1%eth0"`, "zone"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := IngressIPs(svcWith(nil, ingress(tc.ips...)))
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("IPs %v, want %v", got, tc.want)
			}
			if len(tc.errHas) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("error %T %v, want *Error", err, err)
			}
			for _, s := range tc.errHas {
				if !strings.Contains(err.Error(), s) {
					t.Fatalf("error %q does not contain %q", err, s)
				}
			}
		})
	}
}

func TestSharingKey(t *testing.T) {
	legacy := LegacyName(AnnotationAllowSharedIP)
	for _, tc := range []struct {
		ann  map[string]string
		want string
	}{
		{nil, ""},
		{map[string]string{AnnotationAllowSharedIP: "k"}, "k"},
		{map[string]string{legacy: "old"}, "old"},
		{map[string]string{AnnotationAllowSharedIP: "new", legacy: "old"}, "new"},
		// The metallb.io/ form wins even when empty: the Service does not share.
		{map[string]string{AnnotationAllowSharedIP: "", legacy: "old"}, ""},
		{map[string]string{AnnotationAllowSharedIP: " k "}, " k "},
	} {
		if got := SharingKey(svcWith(tc.ann)); got != tc.want {
			t.Errorf("SharingKey(%v) = %q, want %q", tc.ann, got, tc.want)
		}
	}
}

func TestGetAndDeprecation(t *testing.T) {
	legacy := LegacyName(AnnotationAddressPool)
	if legacy != "metallb.universe.tf/address-pool" {
		t.Fatalf("LegacyName = %q", legacy)
	}
	for _, tc := range []struct {
		ann  map[string]string
		want Annotation
		msg  string
	}{
		{nil, Annotation{Name: AnnotationAddressPool}, ""},
		{map[string]string{AnnotationAddressPool: "a"}, Annotation{Name: AnnotationAddressPool, Value: "a", Set: true}, ""},
		{map[string]string{legacy: "b"}, Annotation{Name: legacy, Value: "b", Set: true, Legacy: true},
			"annotation metallb.universe.tf/address-pool is deprecated, use metallb.io/address-pool"},
		{map[string]string{AnnotationAddressPool: "a", legacy: "b"},
			Annotation{Name: AnnotationAddressPool, Value: "a", Set: true, Legacy: true, Both: true},
			"annotation metallb.universe.tf/address-pool is deprecated, use metallb.io/address-pool (both are set; metallb.io/address-pool wins)"},
	} {
		got := Get(svcWith(tc.ann), AnnotationAddressPool)
		if got != tc.want {
			t.Errorf("Get(%v) = %+v, want %+v", tc.ann, got, tc.want)
		}
		if m := got.Deprecation(); m != tc.msg {
			t.Errorf("Deprecation(%v) = %q, want %q", tc.ann, m, tc.msg)
		}
	}
}

func TestRequestedIPs(t *testing.T) {
	lbIP := func(ip string) func(*corev1.Service) { return func(s *corev1.Service) { s.Spec.LoadBalancerIP = ip } }
	legacy := LegacyName(AnnotationLoadBalancerIPs)
	for _, tc := range []struct {
		name   string
		svc    *corev1.Service
		want   []netip.Addr
		field  bool
		errHas []string
		count  int // 0: 1
	}{
		{name: "count", svc: svcWith(map[string]string{AnnotationAddressCount: " 3"}), count: 3},
		{name: "several per family", svc: svcWith(map[string]string{AnnotationLoadBalancerIPs: "10.0.0.1,fd00::1,10.0.0.2,fd00::2"}),
			want: addrs("10.0.0.1", "fd00::1", "10.0.0.2", "fd00::2"), count: 2},
		{name: "several per family with a count that agrees", svc: svcWith(map[string]string{AnnotationLoadBalancerIPs: "10.0.0.1,10.0.0.2", AnnotationAddressCount: "2"}),
			want: addrs("10.0.0.1", "10.0.0.2"), count: 2},
		{name: "a count that does not agree", svc: svcWith(map[string]string{AnnotationLoadBalancerIPs: "10.0.0.1,10.0.0.2", AnnotationAddressCount: "3"}),
			want: addrs("10.0.0.1", "10.0.0.2"), count: 2,
			errHas: []string{"annotation " + AnnotationAddressCount, `"3"`, "lists 2 addresses per family"}},
		{name: "uneven families", svc: svcWith(map[string]string{AnnotationLoadBalancerIPs: "10.0.0.1,10.0.0.2,fd00::1"}),
			errHas: []string{"2 IPv4 and 1 IPv6 addresses"}},
		{name: "count not a number", svc: svcWith(map[string]string{AnnotationAddressCount: "two"}),
			errHas: []string{"annotation " + AnnotationAddressCount, `"two"`, "from 1 to 16"}},
		{name: "count too large", svc: svcWith(map[string]string{AnnotationAddressCount: "17"}), errHas: []string{"from 1 to 16"}},
		{name: "count zero", svc: svcWith(map[string]string{AnnotationAddressCount: "0"}), errHas: []string{"from 1 to 16"}},
		{name: "a count with the deprecated field", svc: svcWith(map[string]string{AnnotationAddressCount: "2"}, lbIP("10.0.0.1")), field: true, count: 2,
			errHas: []string{"spec.loadBalancerIP", "names one address", AnnotationAddressCount}},
		{"nothing", svcWith(nil), nil, false, nil, 0},
		{"blank annotation", svcWith(map[string]string{AnnotationLoadBalancerIPs: " "}), nil, false, nil, 0},
		{"annotation", svcWith(map[string]string{AnnotationLoadBalancerIPs: " 10.0.0.5 , fd00::5"}), addrs("10.0.0.5", "fd00::5"), false, nil, 0},
		{"legacy annotation", svcWith(map[string]string{legacy: "fd00::5"}), addrs("fd00::5"), false, nil, 0},
		{"field", svcWith(nil, lbIP(" 10.0.0.9")), addrs("10.0.0.9"), true, nil, 0},
		{"field among the annotation's", svcWith(map[string]string{AnnotationLoadBalancerIPs: "10.0.0.9,fd00::1"}, lbIP("fd00::1")),
			addrs("10.0.0.9", "fd00::1"), true, nil, 0},
		{"bad annotation", svcWith(map[string]string{legacy: "10.0.0.300"}), nil, false,
			[]string{"ns1/web", "annotation " + legacy, `"10.0.0.300"`, "not an IP address"}, 0},
		{"bad field", svcWith(nil, lbIP("x")), nil, false, []string{"spec.loadBalancerIP", `"x"`}, 0},
		{"conflict", svcWith(map[string]string{AnnotationLoadBalancerIPs: "10.0.0.1"}, lbIP("10.0.0.2")), addrs("10.0.0.1"), true,
			[]string{"spec.loadBalancerIP", `"10.0.0.2"`, "conflicts with annotation " + AnnotationLoadBalancerIPs, `"10.0.0.1"`}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := RequestedIPs(tc.svc)
			if !reflect.DeepEqual(got.IPs, tc.want) || got.Field != tc.field {
				t.Fatalf("got %+v, want IPs %v field %v", got, tc.want, tc.field)
			}
			if want := max(tc.count, 1); got.Count != want && len(tc.errHas) == 0 {
				t.Fatalf("count %d, want %d", got.Count, want)
			}
			if len(tc.errHas) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			var e *Error
			if !errors.As(err, &e) || e.Field == "" {
				t.Fatalf("error %T %v, want *Error with a field", err, err)
			}
			for _, s := range tc.errHas {
				if !strings.Contains(err.Error(), s) {
					t.Fatalf("error %q does not contain %q", err, s)
				}
			}
		})
	}
}

func TestRequestedPool(t *testing.T) {
	for _, tc := range []struct {
		ann    map[string]string
		want   string
		errHas string
	}{
		{nil, "", ""},
		{map[string]string{AnnotationAddressPool: ""}, "", ""},
		{map[string]string{AnnotationAddressPool: " prod "}, "prod", ""},
		{map[string]string{LegacyName(AnnotationAddressPool): "old", AnnotationAddressPool: "new"}, "new", ""},
		{map[string]string{AnnotationAddressPool: "Bad_Pool"}, "", `annotation metallb.io/address-pool "Bad_Pool": not a valid pool name`},
	} {
		got, _, err := RequestedPool(svcWith(tc.ann))
		if got != tc.want || (err == nil) != (tc.errHas == "") || (err != nil && !strings.Contains(err.Error(), tc.errHas)) {
			t.Errorf("RequestedPool(%v) = %q, %v; want %q, error containing %q", tc.ann, got, err, tc.want, tc.errHas)
		}
	}
}

func TestParseIPList(t *testing.T) {
	var tooMany []string // one IPv4 address more than MaxAddressCount
	for i := range MaxAddressCount + 1 {
		tooMany = append(tooMany, fmt.Sprintf("10.0.1.%d", i))
	}
	many := strings.Join(tooMany, ",")
	for _, tc := range []struct {
		in     string
		want   []netip.Addr
		per    int
		errHas string
	}{
		{"10.0.0.1", addrs("10.0.0.1"), 1, ""},
		{" 10.0.0.1 , fd00::1 ", addrs("10.0.0.1", "fd00::1"), 1, ""},
		{"10.0.0.2,10.0.0.1", addrs("10.0.0.2", "10.0.0.1"), 2, ""},
		{"10.0.0.1,fd00::1,10.0.0.2", nil, 0, "2 IPv4 and 1 IPv6 addresses: list as many of each family"},
		{many, nil, 0, fmt.Sprintf("at most %d addresses per family", MaxAddressCount)},
		{"10.0.0.1,10.0.0.1", nil, 0, "listed twice"},
		{"10.0.0.1,", nil, 0, "empty entry"},
		{"fe80::1%eth0", nil, 0, "zoned"},
		{"::ffff:10.0.0.1", nil, 0, "IPv4-mapped"},
		{"x", nil, 0, "not an IP address"},
	} {
		got, per, err := parseIPList(tc.in)
		if !reflect.DeepEqual(got, tc.want) || per != tc.per || (err == nil) != (tc.errHas == "") || (err != nil && !strings.Contains(err.Error(), tc.errHas)) {
			t.Errorf("parseIPList(%q) = %v, %d, %v; want %v, %d, error containing %q", tc.in, got, per, err, tc.want, tc.per, tc.errHas)
		}
	}
}

func TestTCPPort(t *testing.T) {
	svc := func(ports ...corev1.ServicePort) *corev1.Service {
		return &corev1.Service{Spec: corev1.ServiceSpec{Ports: ports}}
	}
	for _, tc := range []struct {
		svc  *corev1.Service
		want uint16
	}{
		{svc(), 0},
		{svc(corev1.ServicePort{Protocol: corev1.ProtocolUDP, Port: 53}), 0},
		{svc(corev1.ServicePort{Protocol: corev1.ProtocolUDP, Port: 53}, corev1.ServicePort{Protocol: corev1.ProtocolTCP, Port: 8080}), 8080},
		{svc(corev1.ServicePort{Port: 80}), 80}, // the API server defaults an empty protocol to TCP
	} {
		if got := TCPPort(tc.svc); got != tc.want {
			t.Errorf("TCPPort(%v) = %d, want %d", tc.svc.Spec.Ports, got, tc.want)
		}
	}
}
