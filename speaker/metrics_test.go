package speaker

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestOwnerChangesStartAtZero: every reason is exported from the start, at 0, so the
// first change of each reason is an increase Prometheus can see.
func TestOwnerChangesStartAtZero(t *testing.T) {
	reg := prometheus.NewRegistry()
	newMetrics(reg)
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range fams {
		if f.GetName() != "ironlb_owner_changes_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			got[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
		}
	}
	for _, r := range []string{"placed", "ownerDataPathDown", "ownerIneligible", "holdExpired", "failback", "learned"} {
		if v, ok := got[r]; !ok || v != 0 {
			t.Errorf("ironlb_owner_changes_total{reason=%q} = %v (exported %v), want 0", r, v, ok)
		}
	}
}
