package service

import (
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// FuzzIngressIPs checks that any status parses without panicking, that the
// IPs returned are valid, unzoned, unmapped and distinct, and that an error
// is an *Error naming the Service and the entry.
func FuzzIngressIPs(f *testing.F) {
	f.Add("10.0.0.1", "fd00::1", "")
	f.Add(" 10.0.0.1", "10.0.0.1", "::ffff:10.0.0.1")
	f.Add("fe80::1%eth0", "x", "")
	f.Fuzz(func(t *testing.T, a, b, c string) {
		svc := svcWith(nil, ingress(a, b, c))
		ips, err := IngressIPs(svc)
		seen := map[string]bool{}
		for _, ip := range ips {
			if !ip.IsValid() || ip.Zone() != "" || ip.Is4In6() || seen[ip.String()] {
				t.Fatalf("bad result %v", ips)
			}
			seen[ip.String()] = true
		}
		if err != nil {
			var e *Error
			if !errors.As(err, &e) || !strings.Contains(err.Error(), "ns1/web") ||
				!strings.HasPrefix(e.Field, "status.loadBalancer.ingress[") {
				t.Fatalf("bad error %T %v", err, err)
			}
		}
	})
}

// FuzzRequestedIPs checks that the annotation and field always parse into
// at most one valid address per family, or an *Error naming the
// annotation or field.
func FuzzRequestedIPs(f *testing.F) {
	f.Add("10.0.0.1, fd00::1", "", false)
	f.Add("10.0.0.1", "10.0.0.2", true)
	f.Add(",", "::ffff:1.2.3.4", false)
	f.Fuzz(func(t *testing.T, ann, field string, legacy bool) {
		name := AnnotationLoadBalancerIPs
		if legacy {
			name = LegacyName(name)
		}
		svc := svcWith(map[string]string{name: ann}, func(s *corev1.Service) { s.Spec.LoadBalancerIP = field })
		r, err := RequestedIPs(svc)
		if err != nil {
			var e *Error
			if !errors.As(err, &e) || (!strings.Contains(e.Message, "loadBalancerIPs") && !strings.Contains(e.Message, FieldLoadBalancerIP)) {
				t.Fatalf("bad error %T %v", err, err)
			}
			return
		}
		if len(r.IPs) > 2 || (len(r.IPs) == 2 && r.IPs[0].Is4() == r.IPs[1].Is4()) {
			t.Fatalf("IPs %v", r.IPs)
		}
		for _, ip := range r.IPs {
			if !ip.IsValid() || ip.Zone() != "" || ip.Is4In6() {
				t.Fatalf("IPs %v", r.IPs)
			}
		}
	})
}

// FuzzRequestedPool checks that an accepted pool name is trimmed and
// non-empty, or none was requested.
func FuzzRequestedPool(f *testing.F) {
	f.Add("prod")
	f.Add(" Bad_Pool ")
	f.Fuzz(func(t *testing.T, v string) {
		p, _, err := RequestedPool(svcWith(map[string]string{AnnotationAddressPool: v}))
		if err != nil {
			if p != "" || !strings.Contains(err.Error(), AnnotationAddressPool) {
				t.Fatalf("%q: %q, %v", v, p, err)
			}
			return
		}
		if p != strings.TrimSpace(v) {
			t.Fatalf("%q: got %q", v, p)
		}
	})
}
