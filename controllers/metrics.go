package controllers

import (
	"math"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ironlb/ironlb/internal/allocator"
	"github.com/ironlb/ironlb/internal/k8smetrics"
)

// metrics are the controller's series. The names, help texts and labels are
// MetalLB's, so existing dashboards and the MetalLBAddressPoolExhausted /
// MetalLBStaleConfig alerts keep working. Run registers them on
// controller-runtime's registry, which the manager's metrics server exposes
// next to the controller_runtime_* and workqueue_* series.
type metrics struct {
	// k8s are the metallb_k8s_client_* series, shared with the speaker.
	k8s *k8smetrics.Metrics

	addressesTotal, ipv4AddressesTotal, ipv6AddressesTotal *prometheus.GaugeVec
	addressesInUse, ipv4AddressesInUse, ipv6AddressesInUse *prometheus.GaugeVec
}

// newMetrics builds the controller's metrics and registers them on reg
// (nil: nowhere; already there: those are used, see k8smetrics.Register).
func newMetrics(reg prometheus.Registerer) *metrics {
	pool := func(name, help string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "metallb", Subsystem: "allocator", Name: name, Help: help,
		}, []string{"pool"})
	}
	m := &metrics{
		k8s:                k8smetrics.New(reg),
		addressesTotal:     pool("addresses_total", "Number of usable IP addresses, per pool"),
		ipv4AddressesTotal: pool("ipv4_addresses_total", "Number of usable IPv4 addresses, per pool"),
		ipv6AddressesTotal: pool("ipv6_addresses_total", "Number of usable IPv6 addresses, per pool"),
		addressesInUse:     pool("addresses_in_use_total", "Number of IP addresses in use, per pool"),
		ipv4AddressesInUse: pool("ipv4_addresses_in_use_total", "Number of IPv4 addresses in use, per pool"),
		ipv6AddressesInUse: pool("ipv6_addresses_in_use_total", "Number of IPv6 addresses in use, per pool"),
	}
	if reg != nil {
		for _, g := range m.poolGauges() {
			k8smetrics.Register(reg, g)
		}
	}
	return m
}

func (m *metrics) poolGauges() []**prometheus.GaugeVec {
	return []**prometheus.GaugeVec{
		&m.addressesTotal, &m.ipv4AddressesTotal, &m.ipv6AddressesTotal,
		&m.addressesInUse, &m.ipv4AddressesInUse, &m.ipv6AddressesInUse,
	}
}

// setPoolGauges publishes one pool's counts. Totals are assigned + available;
// counts saturate (a /64 is "MaxInt64 addresses"), so the sums saturate too.
func (m *metrics) setPoolGauges(pool string, st allocator.Stats) {
	v4Total := satAdd(st.AssignedIPv4, st.AvailableIPv4)
	v6Total := satAdd(st.AssignedIPv6, st.AvailableIPv6)
	m.ipv4AddressesTotal.WithLabelValues(pool).Set(float64(v4Total))
	m.ipv6AddressesTotal.WithLabelValues(pool).Set(float64(v6Total))
	m.addressesTotal.WithLabelValues(pool).Set(float64(satAdd(v4Total, v6Total)))
	m.ipv4AddressesInUse.WithLabelValues(pool).Set(float64(st.AssignedIPv4))
	m.ipv6AddressesInUse.WithLabelValues(pool).Set(float64(st.AssignedIPv6))
	m.addressesInUse.WithLabelValues(pool).Set(float64(satAdd(st.AssignedIPv4, st.AssignedIPv6)))
}

// deletePoolGauges drops the series of a pool that no longer exists, so a deleted
// pool does not look exhausted or empty forever.
func (m *metrics) deletePoolGauges(pool string) {
	for _, g := range m.poolGauges() {
		(*g).DeleteLabelValues(pool)
	}
}

func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}
