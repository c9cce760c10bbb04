// Package k8smetrics holds the metallb_k8s_client_* metrics that MetalLB exports
// from both the controller and the speaker, so both ironlb processes publish the
// same series (and the MetalLBStaleConfig / MetalLBConfigNotLoaded alerts work
// for either) without the speaker importing the controller.
//
// They are registered on controller-runtime's registry, which each process's
// manager serves; only one of the two runs per process.
package k8smetrics

import (
	"github.com/prometheus/client_golang/prometheus"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Names, help texts and types are MetalLB's.
var (
	// Updates counts processed object updates (reconciles).
	Updates = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "metallb", Subsystem: "k8s_client", Name: "updates_total",
		Help: "Number of k8s object updates that have been processed.",
	})
	// UpdateErrors counts updates whose processing failed.
	UpdateErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "metallb", Subsystem: "k8s_client", Name: "update_errors_total",
		Help: "Number of k8s object updates that failed for some reason.",
	})
	// ConfigLoaded is 1 once a configuration parsed.
	ConfigLoaded = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: "metallb", Subsystem: "k8s_client", Name: "config_loaded_bool",
		Help: "1 if the MetalLB configuration was successfully loaded at least once.",
	})
	// ConfigStale is 1 while the latest configuration failed to parse and an
	// older one is in use.
	ConfigStale = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: "metallb", Subsystem: "k8s_client", Name: "config_stale_bool",
		Help: "1 if running on a stale configuration, because the latest config failed to load.",
	})
)

func init() {
	crmetrics.Registry.MustRegister(Updates, UpdateErrors, ConfigLoaded, ConfigStale)
}
