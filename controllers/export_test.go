package controllers

import "github.com/ironlb/ironlb/internal/k8smetrics"

// ResetConfigMetrics zeroes the process-wide config_loaded_bool and
// config_stale_bool gauges, so a test can see one replica set them.
func ResetConfigMetrics() {
	k8smetrics.ConfigLoaded.Set(0)
	k8smetrics.ConfigStale.Set(0)
}
