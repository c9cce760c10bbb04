package controllers

// ResetConfigMetrics zeroes the process-wide config_loaded_bool and
// config_stale_bool gauges, so a test can see one replica set them.
func ResetConfigMetrics() {
	configLoaded.Set(0)
	configStale.Set(0)
}
