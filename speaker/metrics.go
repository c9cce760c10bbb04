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
	quorum       prometheus.Gauge
	acting       prometheus.Gauge
	knownMembers prometheus.Gauge
	dropped      *prometheus.CounterVec
	// drain*: the planned moves in their drain period (secondChance).
	drainIPs, drainFlows, drainPackets prometheus.Gauge
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
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
			Help: "Ownership changes of Service IPs this node saw, by reason (placed, ownerDataPathDown, ownerUnhealthy, ownerIneligible, holdExpired, failback, rebalance, learned).",
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
		quorum: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "ironlb", Name: "ownership_quorum",
			Help: "1 while this speaker sees a majority of the known membership alive (it may place and move IPs), 0 while it does not (it only learns).",
		}),
		acting: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "ironlb", Name: "ownership_acting",
			Help: "1 while this speaker makes ownership decisions: synced, with quorum, and trusting its own view (carrier up, not just frozen).",
		}),
		knownMembers: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "ironlb", Name: "ownership_known_members",
			Help: "Speakers the quorum counts: members seen alive, until their Node is deleted or a majority saw them gone for 10 minutes.",
		}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "ironlb", Name: "peer_inputs_dropped_total",
			Help: "Inputs from peers this speaker refused or could not queue, by reason (voteStale, voteNotWatcher, voteUnknownNode, claimEpoch, claimForeign, claimQueueFull, voteQueueFull).",
		}, []string{"reason"}),
		drainIPs: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "ironlb", Name: "drain_ips",
			Help: "IPs this node took over from a node that still delivers, in their drain period (--drain-timeout): connections this node does not know go to that node.",
		}),
		drainFlows: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "ironlb", Name: "drain_forwarded_flows",
			Help: "TCP connections of drained IPs forwarded to their previous owner in the last 2 minutes.",
		}),
		drainPackets: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "ironlb", Name: "drain_forwarded_packets",
			Help: "Packets the current drains forwarded to previous owners (reset when a drain period ends).",
		}),
	}
	// Every reason starts at 0: a series that appears at 1 has no increase to
	// Prometheus, so the first failover of a kind would be invisible to increase()
	// and rate() (the dashboard's "Owner changes by reason").
	for _, r := range ownership.AllReasons() {
		m.ownerChanges.WithLabelValues(string(r))
	}
	for _, d := range ownership.AllDrops() {
		m.dropped.WithLabelValues(d.String())
	}
	for _, r := range []string{dropClaimQueueFull, dropVoteQueueFull} {
		m.dropped.WithLabelValues(r)
	}
	if reg != nil {
		k8smetrics.Register(reg, &m.announced)
		k8smetrics.Register(reg, &m.members)
		k8smetrics.Register(reg, &m.ownerChanges)
		k8smetrics.Register(reg, &m.ownedMax)
		k8smetrics.Register(reg, &m.ownedMin)
		k8smetrics.Register(reg, &m.heldNodes)
		k8smetrics.Register(reg, &m.proxied)
		k8smetrics.Register(reg, &m.quorum)
		k8smetrics.Register(reg, &m.acting)
		k8smetrics.Register(reg, &m.knownMembers)
		k8smetrics.Register(reg, &m.dropped)
		k8smetrics.Register(reg, &m.drainIPs)
		k8smetrics.Register(reg, &m.drainFlows)
		k8smetrics.Register(reg, &m.drainPackets)
	}
	return m
}
