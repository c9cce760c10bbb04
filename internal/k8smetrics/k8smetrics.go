// Package k8smetrics holds the metallb_k8s_client_* metrics that MetalLB exports
// from both the controller and the speaker, so both ironlb processes publish the
// same series (and the MetalLBStaleConfig / MetalLBConfigNotLoaded alerts work
// for either) without the speaker importing the controller.
//
// It is also ironlb's one way to register metrics: each component builds
// its collectors and registers them on the prometheus.Registerer it is
// given (controller-runtime's registry in the binaries, which each
// manager serves), with Register.
package k8smetrics

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are one process's metallb_k8s_client_* series. Names, help texts
// and types are MetalLB's.
type Metrics struct {
	// Updates counts processed object updates (reconciles).
	Updates prometheus.Counter
	// UpdateErrors counts updates whose processing failed.
	UpdateErrors prometheus.Counter
	// ConfigLoaded is 1 once a configuration parsed.
	ConfigLoaded prometheus.Gauge
	// ConfigStale is 1 while the latest configuration failed to parse and an
	// older one is in use.
	ConfigStale prometheus.Gauge
}

// New builds the metrics and registers them on reg (nil: registered
// nowhere). Where reg already has them (a second component or manager in
// one process, as in tests), the registered ones are returned, so every
// user in a process moves the same series.
func New(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Updates: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "metallb", Subsystem: "k8s_client", Name: "updates_total",
			Help: "Number of k8s object updates that have been processed.",
		}),
		UpdateErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "metallb", Subsystem: "k8s_client", Name: "update_errors_total",
			Help: "Number of k8s object updates that failed for some reason.",
		}),
		ConfigLoaded: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "metallb", Subsystem: "k8s_client", Name: "config_loaded_bool",
			Help: "1 if the MetalLB configuration was successfully loaded at least once.",
		}),
		ConfigStale: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "metallb", Subsystem: "k8s_client", Name: "config_stale_bool",
			Help: "1 if running on a stale configuration, because the latest config failed to load.",
		}),
	}
	if reg != nil {
		Register(reg, &m.Updates)
		Register(reg, &m.UpdateErrors)
		Register(reg, &m.ConfigLoaded)
		Register(reg, &m.ConfigStale)
	}
	return m
}

// Register registers *c on reg; when reg has a collector of that name
// already (a second component in one process), *c becomes that one, so
// both update the one series that is exported. Any other registration
// error (a name registered with other labels or help) panics, as
// MustRegister does: it is a programming error.
func Register[C prometheus.Collector](reg prometheus.Registerer, c *C) {
	err := reg.Register(*c)
	if err == nil {
		return
	}
	if are := (prometheus.AlreadyRegisteredError{}); errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			*c = existing
			return
		}
	}
	panic(err)
}
