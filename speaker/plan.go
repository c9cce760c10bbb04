package speaker

import (
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/ironlb/ironlb/api/v1beta1"
	"github.com/ironlb/ironlb/internal/config"
	"github.com/ironlb/ironlb/internal/election"
)

// Withdrawal reasons before the election runs (MetalLB's spelling, logged as
// serviceWithdrawn reason); the election adds its own (election.Reason*).
const (
	ReasonServiceDeleted  = "serviceDeleted"
	ReasonNotLoadBalancer = "notLoadBalancer"
	ReasonOtherClass      = "otherLoadBalancerClass"
	ReasonNoIPAllocated   = "noIPAllocated"
	ReasonInvalidIP       = "invalidIP"
	ReasonIPNotAllowed    = "ipNotAllowed"
	ReasonNoConfig        = "noConfig"
)

// Snapshot is the cluster-wide input shared by every Service's decision.
type Snapshot struct {
	// Config is the last valid configuration; nil means none loaded yet.
	Config *config.Config
	// Nodes by name.
	Nodes map[string]*corev1.Node
	// Members are the live memberlist members.
	Members []string
	// Self is this node's name.
	Self string
	// LoadBalancerClass: "" handles Services without a class, anything else
	// only Services of exactly that class (MetalLB's --lb-class).
	LoadBalancerClass string
	// IgnoreExcludeLB: see election.Input.
	IgnoreExcludeLB bool
	// RequireReady: see election.Input; set when memberlist is disabled.
	RequireReady bool
}

// Want is what this node should do for one Service.
type Want struct {
	// Announce is true when this node answers for IPs.
	Announce bool
	// IPs are the Service's ingress IPs, in status order.
	IPs []netip.Addr
	// Pool the IPs belong to.
	Pool string
	// AllInterfaces, or else Interfaces: where to answer (this node's
	// advertisements for the Service).
	AllInterfaces bool
	Interfaces    []string
	// Winner is the elected node ("" if none); it may be another node.
	Winner string
	// Reason this node does not announce; "" when Announce.
	Reason string
}

// Decide computes what this node does for svc (nil: deleted) given its
// EndpointSlices. It is pure and deterministic.
func Decide(s Snapshot, svc *corev1.Service, eps []*discoveryv1.EndpointSlice) Want {
	if svc == nil {
		return Want{Reason: ReasonServiceDeleted}
	}
	if svc.Spec.Type != corev1.ServiceTypeLoadBalancer {
		return Want{Reason: ReasonNotLoadBalancer}
	}
	if !ClassMatches(svc, s.LoadBalancerClass) {
		return Want{Reason: ReasonOtherClass}
	}
	ips, reason := ServiceIPs(svc)
	if reason != "" {
		return Want{Reason: reason}
	}
	if s.Config == nil {
		return Want{IPs: ips, Reason: ReasonNoConfig}
	}
	pool := PoolFor(s.Config, ips)
	if pool == "" {
		return Want{IPs: ips, Reason: ReasonIPNotAllowed}
	}
	d := election.Decide(election.Input{
		KeyIP:           ips[0].String(),
		Service:         svc,
		Pool:            pool,
		Advertisements:  s.Config.L2Advertisements,
		Nodes:           s.Nodes,
		Members:         s.Members,
		EndpointSlices:  eps,
		IgnoreExcludeLB: s.IgnoreExcludeLB,
		RequireReady:    s.RequireReady,
	}, s.Self)
	return Want{
		Announce:      d.Announce,
		IPs:           ips,
		Pool:          pool,
		AllInterfaces: d.AllInterfaces,
		Interfaces:    d.Interfaces,
		Winner:        d.Winner,
		Reason:        d.Reason,
	}
}

// ClassMatches applies MetalLB's loadBalancerClass filter.
func ClassMatches(svc *corev1.Service, class string) bool {
	if class == "" {
		return svc.Spec.LoadBalancerClass == nil
	}
	return svc.Spec.LoadBalancerClass != nil && *svc.Spec.LoadBalancerClass == class
}

// ServiceIPs returns the Service's ingress IPs in status order, or a reason
// when there are none or one does not parse.
func ServiceIPs(svc *corev1.Service) ([]netip.Addr, string) {
	var ips []netip.Addr
	for _, ing := range svc.Status.LoadBalancer.Ingress {
		if ing.IP == "" {
			continue
		}
		ip, err := netip.ParseAddr(ing.IP)
		if err != nil || ip.Zone() != "" {
			return nil, ReasonInvalidIP
		}
		ip = ip.Unmap()
		if !slices.Contains(ips, ip) {
			ips = append(ips, ip)
		}
	}
	if len(ips) == 0 {
		return nil, ReasonNoIPAllocated
	}
	return ips, ""
}

// PoolFor returns the pool that contains every one of ips, "" if none does.
// Pools never overlap (config.Parse rejects it), so the answer is unique.
func PoolFor(cfg *config.Config, ips []netip.Addr) string {
	names := make([]string, 0, len(cfg.Pools))
	for name := range cfg.Pools {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		p := cfg.Pools[name]
		if p == nil {
			continue
		}
		all := true
		for _, ip := range ips {
			if !slices.ContainsFunc(p.Ranges, func(r config.Range) bool { return r.Contains(ip) }) {
				all = false
				break
			}
		}
		if all {
			return name
		}
	}
	return ""
}

// StatusPlan is what to do with the ServiceL2Status objects of one Service.
type StatusPlan struct {
	// Keep is the object to bring up to date (nil: create one), meaningful
	// only when Announce.
	Keep *v1beta1.ServiceL2Status
	// Delete are objects to delete.
	Delete []*v1beta1.ServiceL2Status
}

// PlanStatus decides, for the ServiceL2Status objects existing for one Service,
// which one the owner keeps and which are deleted. The owner keeps one object
// with its node label (the oldest, so the name is stable) and deletes all
// others: duplicates and other nodes' leftovers (a hard-killed previous owner
// cannot delete its own). A non-owner deletes only objects labelled with its
// own node, never another node's.
func PlanStatus(existing []*v1beta1.ServiceL2Status, self string, announce bool) StatusPlan {
	sorted := slices.Clone(existing)
	slices.SortFunc(sorted, func(a, b *v1beta1.ServiceL2Status) int {
		if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
			return c
		}
		if a.Name < b.Name {
			return -1
		}
		if a.Name > b.Name {
			return 1
		}
		return 0
	})
	var p StatusPlan
	for _, st := range sorted {
		mine := st.Labels[v1beta1.ServiceL2StatusNodeLabel] == self
		switch {
		case announce && mine && p.Keep == nil && (st.Status.Node == self || st.Status.Node == ""):
			p.Keep = st
		case announce, mine:
			p.Delete = append(p.Delete, st)
		}
	}
	return p
}

// StatusInterfaces is the interfaces field of ServiceL2Status: filled only
// when the advertisement restricts interfaces, as MetalLB does.
func StatusInterfaces(w Want) []v1beta1.InterfaceInfo {
	if w.AllInterfaces {
		return nil
	}
	out := make([]v1beta1.InterfaceInfo, 0, len(w.Interfaces))
	for _, i := range w.Interfaces {
		out = append(out, v1beta1.InterfaceInfo{Name: i})
	}
	return out
}
