package allocator

import (
	"github.com/ironlb/ironlb/internal/service"

	"errors"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func svc(annotations map[string]string, mutate ...func(*corev1.Service)) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web", Annotations: annotations, Labels: map[string]string{"app": "web"}},
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeLoadBalancer,
			Selector: map[string]string{"app": "web", "tier": "fe"},
			Ports:    []corev1.ServicePort{{Port: 80}, {Port: 53, Protocol: corev1.ProtocolUDP}},
		},
	}
	for _, m := range mutate {
		m(s)
	}
	return s
}

func policy(p corev1.IPFamilyPolicy) func(*corev1.Service) {
	return func(s *corev1.Service) { s.Spec.IPFamilyPolicy = &p }
}

func families(fs ...corev1.IPFamily) func(*corev1.Service) {
	return func(s *corev1.Service) { s.Spec.IPFamilies = fs }
}

func TestParseService(t *testing.T) {
	basePorts := []Port{{corev1.ProtocolTCP, 80}, {corev1.ProtocolUDP, 53}}
	base := Request{Namespace: "ns", Labels: map[string]string{"app": "web"}, Families: v4, Policy: single, Ports: basePorts, Count: 1}
	with := func(f func(*Request)) Request {
		r := base
		f(&r)
		return r
	}
	tests := []struct {
		name     string
		svc      *corev1.Service
		want     Request
		warnings []string // reasons
		errHas   []string // substrings of the error; empty = no error
	}{
		{name: "defaults", svc: svc(nil), want: base},
		{name: "requested IPs, pool, sharing",
			svc: svc(map[string]string{
				AnnotationLoadBalancerIPs: " 10.0.0.5 , fd00::5", AnnotationAddressPool: "prod", AnnotationAllowSharedIP: "key1",
			}, policy(requir), families(v4v6...)),
			want: with(func(r *Request) {
				r.IPs, r.Pool, r.SharingKey, r.Families, r.Policy = addrs("10.0.0.5", "fd00::5"), "prod", "key1", v4v6, requir
			})},
		{name: "families inferred from requested IPv6",
			svc:  svc(map[string]string{AnnotationLoadBalancerIPs: "fd00::1"}),
			want: with(func(r *Request) { r.IPs, r.Families = addrs("fd00::1"), v6 })},
		{name: "legacy annotations accepted with warnings",
			svc: svc(map[string]string{
				"metallb.universe.tf/loadBalancerIPs": "10.0.0.7", "metallb.universe.tf/address-pool": "old",
				"metallb.universe.tf/allow-shared-ip": "k",
			}),
			want:     with(func(r *Request) { r.IPs, r.Pool, r.SharingKey = addrs("10.0.0.7"), "old", "k" }),
			warnings: []string{WarningDeprecatedAnnotation, WarningDeprecatedAnnotation, WarningDeprecatedAnnotation}},
		{name: "new annotation wins over legacy",
			svc:      svc(map[string]string{AnnotationAddressPool: "new", "metallb.universe.tf/address-pool": "old"}),
			want:     with(func(r *Request) { r.Pool = "new" }),
			warnings: []string{WarningDeprecatedAnnotation}},
		{name: "spec.loadBalancerIP honoured",
			svc:      svc(nil, func(s *corev1.Service) { s.Spec.LoadBalancerIP = "10.0.0.9" }),
			want:     with(func(r *Request) { r.IPs = addrs("10.0.0.9") }),
			warnings: []string{WarningDeprecatedField}},
		{name: "spec.loadBalancerIP agreeing with the annotation",
			svc: svc(map[string]string{AnnotationLoadBalancerIPs: "10.0.0.9"},
				func(s *corev1.Service) { s.Spec.LoadBalancerIP = "10.0.0.9" }),
			want:     with(func(r *Request) { r.IPs = addrs("10.0.0.9") }),
			warnings: []string{WarningDeprecatedField}},
		{name: "externalTrafficPolicy Local sets the backend key",
			svc: svc(nil, func(s *corev1.Service) {
				s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			}),
			want: with(func(r *Request) { r.BackendKey = "app=web,tier=fe" })},
		{name: "empty annotations are unset",
			svc:  svc(map[string]string{AnnotationLoadBalancerIPs: " ", AnnotationAddressPool: ""}),
			want: base},
		{name: "IPv6 primary dual-stack",
			svc:  svc(nil, policy(prefer), families(v6v4...)),
			want: with(func(r *Request) { r.Families, r.Policy = v6v4, prefer })},

		{name: "bad IP", svc: svc(map[string]string{AnnotationLoadBalancerIPs: "10.0.0.300"}),
			errHas: []string{AnnotationLoadBalancerIPs, `"10.0.0.300"`}},
		{name: "legacy bad IP names the legacy annotation", svc: svc(map[string]string{"metallb.universe.tf/loadBalancerIPs": "nope"}),
			errHas: []string{"metallb.universe.tf/loadBalancerIPs", "nope"}},
		{name: "two IPv4: two addresses per family (ironlb's extension)", svc: svc(map[string]string{AnnotationLoadBalancerIPs: "10.0.0.1,10.0.0.2"}),
			want: with(func(r *Request) { r.IPs, r.Count = addrs("10.0.0.1", "10.0.0.2"), 2 })},
		{name: "address count", svc: svc(map[string]string{service.AnnotationAddressCount: "3"}),
			want: with(func(r *Request) { r.Count = 3 })},
		{name: "address count disagreeing with the requested IPs", svc: svc(map[string]string{AnnotationLoadBalancerIPs: "10.0.0.1,10.0.0.2", service.AnnotationAddressCount: "3"}),
			errHas: []string{service.AnnotationAddressCount, "lists 2 addresses per family"}},
		{name: "two IPv4 and one IPv6", svc: svc(map[string]string{AnnotationLoadBalancerIPs: "10.0.0.1,10.0.0.2,fd00::1"}, policy(requir)),
			errHas: []string{AnnotationLoadBalancerIPs, "2 IPv4 and 1 IPv6"}},
		{name: "duplicate", svc: svc(map[string]string{AnnotationLoadBalancerIPs: "10.0.0.1,10.0.0.1"}),
			errHas: []string{"listed twice"}},
		{name: "empty entry", svc: svc(map[string]string{AnnotationLoadBalancerIPs: "10.0.0.1,"}),
			errHas: []string{"empty entry"}},
		{name: "zone", svc: svc(map[string]string{AnnotationLoadBalancerIPs: "fe80::1%eth0"}),
			errHas: []string{"zoned"}},
		{name: "IPv4-mapped", svc: svc(map[string]string{AnnotationLoadBalancerIPs: "::ffff:10.0.0.1"}),
			errHas: []string{"IPv4-mapped", "10.0.0.1"}},
		{name: "family mismatch", svc: svc(map[string]string{AnnotationLoadBalancerIPs: "fd00::1"}, families(v4...)),
			errHas: []string{AnnotationLoadBalancerIPs, "does not match the service's ipFamilies"}},
		{name: "single stack with two families requested",
			svc:    svc(map[string]string{AnnotationLoadBalancerIPs: "10.0.0.1,fd00::1"}),
			errHas: []string{AnnotationLoadBalancerIPs, "fd00::1", "does not match"}},
		{name: "require dual-stack with one IP",
			svc:    svc(map[string]string{AnnotationLoadBalancerIPs: "10.0.0.1"}, policy(requir), families(v4v6...)),
			errHas: []string{"RequireDualStack"}},
		{name: "spec.loadBalancerIP conflicts",
			svc: svc(map[string]string{AnnotationLoadBalancerIPs: "10.0.0.1"},
				func(s *corev1.Service) { s.Spec.LoadBalancerIP = "10.0.0.2" }),
			errHas: []string{"spec.loadBalancerIP", "10.0.0.2", AnnotationLoadBalancerIPs, "10.0.0.1"}},
		{name: "bad spec.loadBalancerIP", svc: svc(nil, func(s *corev1.Service) { s.Spec.LoadBalancerIP = "x" }),
			errHas: []string{"spec.loadBalancerIP", `"x"`}},
		{name: "bad pool name", svc: svc(map[string]string{AnnotationAddressPool: "Bad_Pool"}),
			errHas: []string{AnnotationAddressPool, "Bad_Pool"}},
		{name: "bad family policy", svc: svc(nil, policy("Sometimes")), errHas: []string{"Sometimes"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, warns, err := ParseService(tt.svc)
			if len(tt.errHas) > 0 {
				if err == nil {
					t.Fatalf("no error, want one containing %q", tt.errHas)
				}
				if e := (*Error)(nil); !errors.As(err, &e) {
					t.Fatalf("error %T, want *Error", err)
				}
				for _, s := range tt.errHas {
					if !strings.Contains(err.Error(), s) {
						t.Fatalf("error %q does not contain %q", err, s)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("got  %+v\nwant %+v", got, tt.want)
			}
			var reasons []string
			for _, w := range warns {
				reasons = append(reasons, w.Reason)
				if w.Reason == WarningDeprecatedAnnotation && !strings.Contains(w.Message, "metallb.io/") {
					t.Fatalf("warning %q does not name the new annotation", w.Message)
				}
			}
			if !reflect.DeepEqual(reasons, tt.warnings) {
				t.Fatalf("warnings %v, want %v", warns, tt.warnings)
			}
		})
	}
	if _, _, err := ParseService(nil); err == nil {
		t.Fatal("nil service: no error")
	}
}
