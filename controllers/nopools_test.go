package controllers_test

import (
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// A controller that starts before any IPAddressPool exists (a migration from
// MetalLB, a restore, pools applied after the chart) must not take away the IPs
// Services already show: it writes nothing and allocates nothing until a pool
// appears, then claims those IPs again as at any restart.
func TestNoPoolsKeepsExistingIPs(t *testing.T) {
	h := newHarness(t)
	held := map[string]string{"held1": "172.18.255.210", "held2": "172.18.255.220"}
	for name, ip := range held {
		h.create(h.service(name, map[string]string{annoPool: "first-pool"}))
		svc := h.get(name)
		svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: ip, IPMode: ptr.To(corev1.LoadBalancerIPModeVIP)}}
		if err := k8s.Status().Update(h.ctx, svc); err != nil {
			t.Fatalf("setting the status of %s: %v", name, err)
		}
	}
	h.create(h.service("fresh", nil))
	before := map[string]string{}
	for name := range held {
		before[name] = h.get(name).ResourceVersion
	}

	reconciles := reconcileTotal(t, "service")
	h.l2adv("example") // a configuration, but without any pool
	h.start()
	// Every Service was handled at least once (3 of them) before we look.
	h.eventually("the three services to be reconciled", func() (bool, string) {
		n := reconcileTotal(t, "service") - reconciles
		return n >= 3, fmt.Sprintf("%v reconciles", n)
	})
	for name, ip := range held {
		svc := h.get(name)
		if svc.ResourceVersion != before[name] {
			t.Errorf("%s was written while no pool exists (resourceVersion %s -> %s): ingress %v, annotations %v",
				name, before[name], svc.ResourceVersion, ingress(svc), svc.Annotations)
		}
		if got := ingress(svc); len(got) != 1 || got[0] != ip {
			t.Errorf("%s: ingress %v, want [%s]", name, got, ip)
		}
	}
	if got := ingress(h.get("fresh")); len(got) != 0 {
		t.Errorf("fresh was given %v while no pool exists", got)
	}

	h.pool("first-pool", "172.18.255.200-172.18.255.250")
	h.waitIPs("fresh", "172.18.255.200")
	for name, ip := range held {
		svc := h.waitIPs(name, ip)
		if svc.ResourceVersion != before[name] {
			t.Errorf("%s was rewritten when the pool appeared (resourceVersion %s -> %s)", name, before[name], svc.ResourceVersion)
		}
		if got := svc.Annotations[annoPool]; got != "first-pool" {
			t.Errorf("%s: annotation %s = %q, want first-pool", name, annoPool, got)
		}
	}
	h.waitPoolStatus("first-pool", 3, 48, 0, 0)
}

// reconcileTotal sums controller-runtime's reconcile counter of one controller
// over all results (the registry is shared by every controller of the process).
func reconcileTotal(t *testing.T, controller string) float64 {
	t.Helper()
	mfs, err := crmetrics.Registry.Gather()
	if err != nil {
		t.Fatalf("gathering metrics: %v", err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != "controller_runtime_reconcile_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if labelValue(m, "controller") == controller {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}
