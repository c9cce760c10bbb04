package layer2

import (
	"net/netip"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics holds the counters, named as MetalLB names them (no _total suffix
// on the MetalLB ones, so existing dashboards keep working).
type metrics struct {
	requests   *prometheus.CounterVec
	responses  *prometheus.CounterVec
	gratuitous *prometheus.CounterVec
	conflicts  *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "metallb", Subsystem: "layer2", Name: "requests_received",
			Help: "Number of layer2 requests received for owned IPs",
		}, []string{"ip"}),
		responses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "metallb", Subsystem: "layer2", Name: "responses_sent",
			Help: "Number of layer2 responses sent for owned IPs",
		}, []string{"ip"}),
		gratuitous: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "metallb", Subsystem: "layer2", Name: "gratuitous_sent",
			Help: "Number of gratuitous layer2 packets sent for owned IPs as a result of failovers",
		}, []string{"ip"}),
		conflicts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "ironlb", Subsystem: "layer2", Name: "conflicts_total",
			Help: "Number of address conflicts reported: another MAC answering or announcing an IP this node owns (rate-limited per IP)",
		}, []string{"ip"}),
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.responses, m.gratuitous, m.conflicts)
	}
	return m
}

// ipMetrics are one IP's counters, resolved once when the IP becomes owned so
// the per-frame path does not build label strings.
type ipMetrics struct {
	requests, responses, gratuitous, conflicts prometheus.Counter
}

func (m *metrics) forIP(ip netip.Addr) *ipMetrics {
	s := ip.String()
	return &ipMetrics{
		requests:   m.requests.WithLabelValues(s),
		responses:  m.responses.WithLabelValues(s),
		gratuitous: m.gratuitous.WithLabelValues(s),
		conflicts:  m.conflicts.WithLabelValues(s),
	}
}
