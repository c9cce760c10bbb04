package configload

import (
	"testing"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ironlb/ironlb/api/v1beta1"
	"github.com/ironlb/ironlb/internal/config"
	"github.com/ironlb/ironlb/internal/k8smetrics"
)

const testNS = "metallb-system"

// load is the speaker's way to load: Namespaces not read.
func (l *Loader) load(log logr.Logger, pools []v1beta1.IPAddressPool, ads []v1beta1.L2Advertisement) *config.Config {
	cfg, _ := l.Load(log, pools, ads, nil)
	return cfg
}

// The speaker publishes MetalLB's k8s_client config metrics: loaded once a
// configuration parsed, stale while a newer one fails and the older one is in
// use, one update error per refused configuration (not per reconcile).
func TestConfigMetrics(t *testing.T) {
	m := k8smetrics.New(prometheus.NewRegistry())
	errs0 := testutil.ToFloat64(m.UpdateErrors)
	pool := func(addr string) []v1beta1.IPAddressPool {
		return []v1beta1.IPAddressPool{{ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: "p1", ResourceVersion: addr},
			Spec: v1beta1.IPAddressPoolSpec{Addresses: []string{addr}}}}
	}
	check := func(step string, loaded, stale, errs float64) {
		t.Helper()
		if got := testutil.ToFloat64(m.ConfigLoaded); got != loaded {
			t.Errorf("%s: config_loaded_bool = %v, want %v", step, got, loaded)
		}
		if got := testutil.ToFloat64(m.ConfigStale); got != stale {
			t.Errorf("%s: config_stale_bool = %v, want %v", step, got, stale)
		}
		if got := testutil.ToFloat64(m.UpdateErrors) - errs0; got != errs {
			t.Errorf("%s: update_errors_total grew by %v, want %v", step, got, errs)
		}
	}
	s := &Loader{Metrics: m}
	log := logr.Discard()

	if cfg := s.load(log, pool("not-an-address"), nil); cfg != nil {
		t.Fatalf("invalid first configuration returned %+v", cfg)
	}
	check("invalid, nothing loaded before", 0, 0, 1)

	if cfg := s.load(log, pool("172.18.255.200-172.18.255.250"), nil); cfg == nil || len(cfg.Pools) != 1 {
		t.Fatalf("valid configuration: %+v", cfg)
	}
	check("valid", 1, 0, 1)

	bad := s.load(log, pool("nope"), nil)
	if bad == nil || len(bad.Pools) != 1 {
		t.Fatalf("invalid configuration must keep the last valid one, got %+v", bad)
	}
	check("invalid after valid", 1, 1, 2)
	s.load(log, pool("nope"), nil) // same content: not parsed again
	check("same invalid content again", 1, 1, 2)

	s.load(log, pool("172.18.255.100/30"), nil)
	check("valid again", 1, 0, 2)
}

// A pool's status update (new resourceVersion, same spec and labels: the
// controller writes one with every allocation) does not re-parse the
// configuration; a change of its spec or labels does.
func TestConfigParsedOnlyWhenContentChanges(t *testing.T) {
	var lines []string
	log := funcr.New(func(_, args string) { lines = append(lines, args) }, funcr.Options{})
	s := &Loader{}
	p := v1beta1.IPAddressPool{ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: "p1", ResourceVersion: "1", Labels: map[string]string{"zone": "a"}},
		Spec: v1beta1.IPAddressPoolSpec{Addresses: []string{"172.18.255.200-172.18.255.250"}}}
	ad := v1beta1.L2Advertisement{ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: "a1", ResourceVersion: "2"}}
	load := func(step string, wantLoads int) *config.Config {
		t.Helper()
		cfg := s.load(log, []v1beta1.IPAddressPool{p}, []v1beta1.L2Advertisement{ad})
		if len(lines) != wantLoads {
			t.Errorf("%s: %d configuration loads, want %d: %q", step, len(lines), wantLoads, lines)
		}
		return cfg
	}
	first := load("first", 1)

	p.ResourceVersion = "3"
	p.Status.AssignedIPv4 = 7
	if got := load("pool status update", 1); got != first {
		t.Errorf("pool status update: a new configuration %p, want the parsed one %p", got, first)
	}
	ad.ResourceVersion = "4"
	load("advertisement update without a spec change", 1)

	p.ResourceVersion = "5"
	p.Labels = map[string]string{"zone": "b"}
	load("pool labels changed", 2)

	p.ResourceVersion = "6"
	p.Spec.AvoidBuggyIPs = true
	load("pool spec changed", 3)

	ad.ResourceVersion = "7"
	ad.Spec.IPAddressPools = []string{"p1"}
	load("advertisement spec changed", 4)

	// The cache lists objects in no stable order: another order of the
	// same objects is the same configuration.
	p2 := v1beta1.IPAddressPool{ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: "p2", ResourceVersion: "8"},
		Spec: v1beta1.IPAddressPoolSpec{Addresses: []string{"172.18.254.0/28"}}}
	s.load(log, []v1beta1.IPAddressPool{p, p2}, []v1beta1.L2Advertisement{ad})
	s.load(log, []v1beta1.IPAddressPool{p2, p}, []v1beta1.L2Advertisement{ad})
	if len(lines) != 5 {
		t.Errorf("the same pools listed in another order: %d configuration loads, want 5: %q", len(lines), lines)
	}
}
