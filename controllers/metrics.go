package controllers

import (
	"math"

	"github.com/prometheus/client_golang/prometheus"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/ironlb/ironlb/internal/allocator"
)

// The metric names, help texts and labels are MetalLB's, so existing dashboards and
// the MetalLBAddressPoolExhausted / MetalLBStaleConfig alerts keep working. They are
// registered once per process on controller-runtime's registry, which the manager's
// metrics server exposes next to the controller_runtime_* and workqueue_* series.
var (
	addressesTotal = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "metallb", Subsystem: "allocator", Name: "addresses_total",
		Help: "Number of usable IP addresses, per pool",
	}, []string{"pool"})
	ipv4AddressesTotal = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "metallb", Subsystem: "allocator", Name: "ipv4_addresses_total",
		Help: "Number of usable IPv4 addresses, per pool",
	}, []string{"pool"})
	ipv6AddressesTotal = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "metallb", Subsystem: "allocator", Name: "ipv6_addresses_total",
		Help: "Number of usable IPv6 addresses, per pool",
	}, []string{"pool"})
	addressesInUse = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "metallb", Subsystem: "allocator", Name: "addresses_in_use_total",
		Help: "Number of IP addresses in use, per pool",
	}, []string{"pool"})
	ipv4AddressesInUse = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "metallb", Subsystem: "allocator", Name: "ipv4_addresses_in_use_total",
		Help: "Number of IPv4 addresses in use, per pool",
	}, []string{"pool"})
	ipv6AddressesInUse = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "metallb", Subsystem: "allocator", Name: "ipv6_addresses_in_use_total",
		Help: "Number of IPv6 addresses in use, per pool",
	}, []string{"pool"})

	// The metallb_k8s_client_* metrics are shared with the speaker: internal/k8smetrics.
)

func init() {
	crmetrics.Registry.MustRegister(
		addressesTotal, ipv4AddressesTotal, ipv6AddressesTotal,
		addressesInUse, ipv4AddressesInUse, ipv6AddressesInUse,
	)
}

// setPoolGauges publishes one pool's counts. Totals are assigned + available;
// counts saturate (a /64 is "MaxInt64 addresses"), so the sums saturate too.
func setPoolGauges(pool string, st allocator.Stats) {
	v4Total := satAdd(st.AssignedIPv4, st.AvailableIPv4)
	v6Total := satAdd(st.AssignedIPv6, st.AvailableIPv6)
	ipv4AddressesTotal.WithLabelValues(pool).Set(float64(v4Total))
	ipv6AddressesTotal.WithLabelValues(pool).Set(float64(v6Total))
	addressesTotal.WithLabelValues(pool).Set(float64(satAdd(v4Total, v6Total)))
	ipv4AddressesInUse.WithLabelValues(pool).Set(float64(st.AssignedIPv4))
	ipv6AddressesInUse.WithLabelValues(pool).Set(float64(st.AssignedIPv6))
	addressesInUse.WithLabelValues(pool).Set(float64(satAdd(st.AssignedIPv4, st.AssignedIPv6)))
}

// deletePoolGauges drops the series of a pool that no longer exists, so a deleted
// pool does not look exhausted or empty forever.
func deletePoolGauges(pool string) {
	for _, g := range []*prometheus.GaugeVec{
		addressesTotal, ipv4AddressesTotal, ipv6AddressesTotal,
		addressesInUse, ipv4AddressesInUse, ipv6AddressesInUse,
	} {
		g.DeleteLabelValues(pool)
	}
}

func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}
