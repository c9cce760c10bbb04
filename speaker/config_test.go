package speaker

import (
	"testing"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ironlb/ironlb/api/v1beta1"
	"github.com/ironlb/ironlb/internal/k8smetrics"
)

// The speaker publishes MetalLB's k8s_client config metrics: loaded once a
// configuration parsed, stale while a newer one fails and the older one is in
// use, one update error per refused configuration (not per reconcile).
func TestConfigMetrics(t *testing.T) {
	k8smetrics.ConfigLoaded.Set(0)
	k8smetrics.ConfigStale.Set(0)
	errs0 := testutil.ToFloat64(k8smetrics.UpdateErrors)
	pool := func(addr string) []v1beta1.IPAddressPool {
		return []v1beta1.IPAddressPool{{ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: "p1"},
			Spec: v1beta1.IPAddressPoolSpec{Addresses: []string{addr}}}}
	}
	check := func(step string, loaded, stale, errs float64) {
		t.Helper()
		if got := testutil.ToFloat64(k8smetrics.ConfigLoaded); got != loaded {
			t.Errorf("%s: config_loaded_bool = %v, want %v", step, got, loaded)
		}
		if got := testutil.ToFloat64(k8smetrics.ConfigStale); got != stale {
			t.Errorf("%s: config_stale_bool = %v, want %v", step, got, stale)
		}
		if got := testutil.ToFloat64(k8smetrics.UpdateErrors) - errs0; got != errs {
			t.Errorf("%s: update_errors_total grew by %v, want %v", step, got, errs)
		}
	}
	s := &cfgState{}
	log := logr.Discard()

	if cfg := s.load(log, "bad-1", pool("not-an-address"), nil); cfg != nil {
		t.Fatalf("invalid first configuration returned %+v", cfg)
	}
	check("invalid, nothing loaded before", 0, 0, 1)

	if cfg := s.load(log, "good-1", pool("172.18.255.200-172.18.255.250"), nil); cfg == nil || len(cfg.Pools) != 1 {
		t.Fatalf("valid configuration: %+v", cfg)
	}
	check("valid", 1, 0, 1)

	bad := s.load(log, "bad-2", pool("nope"), nil)
	if bad == nil || len(bad.Pools) != 1 {
		t.Fatalf("invalid configuration must keep the last valid one, got %+v", bad)
	}
	check("invalid after valid", 1, 1, 2)
	s.load(log, "bad-2", pool("nope"), nil) // same versions: not parsed again
	check("same invalid versions again", 1, 1, 2)

	s.load(log, "good-2", pool("172.18.255.100/30"), nil)
	check("valid again", 1, 0, 2)
}
