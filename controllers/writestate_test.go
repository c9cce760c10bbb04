package controllers_test

import (
	"errors"
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/ironlb/ironlb/controllers"
)

// The status is written with the resourceVersion of the copy the decision was made
// on: a copy that is behind the API server is refused as stale (its newer version
// is reconciled instead) and changes nothing, and a current copy gets status and
// pool annotation in one write without losing what others changed.
func TestWriteStateRefusesStaleCopy(t *testing.T) {
	h := newHarness(t)
	h.create(h.service("svc", nil))
	stale := h.get("svc")
	h.update("svc", func(s *corev1.Service) {
		if s.Labels == nil {
			s.Labels = map[string]string{}
		}
		s.Labels["team"] = "a"
	})
	current := h.get("svc")
	ip := []netip.Addr{netip.MustParseAddr("192.0.2.10")}

	if err := controllers.WriteState(h.ctx, k8s, stale, ip, "p"); !errors.Is(err, controllers.ErrStale) {
		t.Fatalf("writing with an outdated copy: got %v, want ErrStale", err)
	}
	if got := h.get("svc"); got.ResourceVersion != current.ResourceVersion || len(got.Status.LoadBalancer.Ingress) != 0 {
		t.Fatalf("the stale write changed the service: resourceVersion %s -> %s, ingress %v",
			current.ResourceVersion, got.ResourceVersion, ingress(got))
	}

	if err := controllers.WriteState(h.ctx, k8s, current, ip, "p"); err != nil {
		t.Fatalf("writing with the current copy: %v", err)
	}
	got := h.get("svc")
	if !slices.Equal(ingress(got), []string{"192.0.2.10"}) || got.Annotations[controllers.AnnotationAllocatedFromPool] != "p" || got.Labels["team"] != "a" {
		t.Fatalf("after the write: ingress %v, annotations %v, labels %v; want 192.0.2.10, pool p, team=a kept",
			ingress(got), got.Annotations, got.Labels)
	}
	if got.Generation != current.Generation {
		t.Errorf("the status write changed the spec: generation %d -> %d", current.Generation, got.Generation)
	}
}
