package speaker

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ironlb/ironlb/internal/k8smetrics"
	"github.com/ironlb/ironlb/internal/ownership"
)

type metrics struct {
	// k8s are the metallb_k8s_client_* series, shared with the controller.
	k8s          *k8smetrics.Metrics
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
		k8s: k8smetrics.New(reg),
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
		k8smetrics.Register(reg, &m.announced)
		k8smetrics.Register(reg, &m.members)
		k8smetrics.Register(reg, &m.ownerChanges)
		k8smetrics.Register(reg, &m.ownedMax)
		k8smetrics.Register(reg, &m.ownedMin)
		k8smetrics.Register(reg, &m.heldNodes)
		k8smetrics.Register(reg, &m.proxied)
	}
	return m
}
