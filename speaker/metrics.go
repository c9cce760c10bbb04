package speaker

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ironlb/ironlb/internal/ownership"
)

type metrics struct {
	announced    *prometheus.GaugeVec
	members      prometheus.Gauge
	ownerChanges *prometheus.CounterVec
	ownedMax     prometheus.Gauge
	ownedMin     prometheus.Gauge
	heldNodes    prometheus.Gauge
	proxied      prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		announced: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "metallb", Subsystem: "speaker", Name: "announced",
			Help: "Services being announced from this node. This is desired state, it does not guarantee that the routing protocols have converged.",
		}, []string{"ip", "node", "protocol", "service"}),
		members: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "ironlb", Name: "memberlist_members",
			Help: "Live memberlist members (speakers) this node sees, itself included.",
		}),
		ownerChanges: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "ironlb", Name: "owner_changes_total",
			Help: "Ownership changes of Service IPs this node saw, by reason (placed, ownerDataPathDown, ownerIneligible, holdExpired, failback, learned).",
		}, []string{"reason"}),
		ownedMax: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "ironlb", Name: "owned_ips_max",
			Help: "The most Service IP keys owned by one node that can take IPs, as this node sees it (spread = max / min).",
		}),
		ownedMin: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "ironlb", Name: "owned_ips_min",
			Help: "The fewest Service IP keys owned by one node that can take IPs, as this node sees it (spread = max / min).",
		}),
		heldNodes: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "ironlb", Name: "held_nodes",
			Help: "Nodes whose speaker is away while they keep their IPs (their kernel still answers on the segment and the hold time has not run out).",
		}),
		proxied: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "ironlb", Name: "proxied_ips",
			Help: "IPs this node answers ARP/NDP for on behalf of a held node (with that node's MAC).",
		}),
	}
	// Every reason starts at 0: a series that appears at 1 has no increase to
	// Prometheus, so the first failover of a kind would be invisible to increase()
	// and rate() (the dashboard's "Owner changes by reason").
	for _, r := range []ownership.Reason{ownership.ReasonPlaced, ownership.ReasonOwnerDown, ownership.ReasonOwnerIneligible,
		ownership.ReasonHoldExpired, ownership.ReasonFailback, ownership.ReasonLearned} {
		m.ownerChanges.WithLabelValues(string(r))
	}
	if reg != nil {
		register(reg, &m.announced)
		register(reg, &m.members)
		register(reg, &m.ownerChanges)
		register(reg, &m.ownedMax)
		register(reg, &m.ownedMin)
		register(reg, &m.heldNodes)
		register(reg, &m.proxied)
	}
	return m
}

// register registers *c; when a collector of that name exists already (a
// second speaker in one test process), *c becomes the existing one.
func register[C prometheus.Collector](reg prometheus.Registerer, c *C) {
	if err := reg.Register(*c); err != nil {
		if are := (prometheus.AlreadyRegisteredError{}); errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				*c = existing
			}
		}
	}
}
