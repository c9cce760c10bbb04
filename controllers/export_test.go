package controllers

import (
	"context"
	"net/netip"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/ironlb/ironlb/internal/k8smetrics"
)

// ResetConfigMetrics zeroes the process-wide config_loaded_bool and
// config_stale_bool gauges, so a test can see one replica set them.
func ResetConfigMetrics() {
	m := k8smetrics.New(crmetrics.Registry) // the ones registered there
	m.ConfigLoaded.Set(0)
	m.ConfigStale.Set(0)
}

// ErrStale is writeState's report that the Service copy it was given is outdated.
var ErrStale = errStale

// WriteState runs the service reconciler's status and annotation write with c.
func WriteState(ctx context.Context, c client.Client, svc *corev1.Service, ips []netip.Addr, pool string) error {
	return (&serviceReconciler{client: c}).writeState(ctx, svc, ips, pool)
}

// SetMemberlistSecretCheck sets how often the leader checks the memberlist
// Secret still exists, and returns a function that restores it.
func SetMemberlistSecretCheck(d time.Duration) func() {
	old := memberlistSecretCheck
	memberlistSecretCheck = d
	return func() { memberlistSecretCheck = old }
}
