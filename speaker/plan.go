package speaker

import (
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/ironlb/ironlb/api/v1beta1"
	"github.com/ironlb/ironlb/internal/config"
	"github.com/ironlb/ironlb/internal/election"
	"github.com/ironlb/ironlb/internal/service"
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

// Protocol is the protocol label value and the word in nodeAssigned events.
const Protocol = "layer2"

// Event reasons on the Service. nodeAssigned and announceFailed are MetalLB's.
const (
	EventNodeAssigned     = "nodeAssigned"
	EventAnnounceFailed   = "announceFailed"
	EventAddressConflict  = "AddressConflict"
	EventKernelAnswersARP = "KernelAnswersARP"
	// EventAddressesShareNode: this node announces two or more address
	// slots of one Service (ironlb.io/address-count) because no other
	// eligible node can take them.
	EventAddressesShareNode = "AddressesShareNode"
)

// Snapshot is the cluster-wide input shared by every Service's input.
type Snapshot struct {
	// Config is the last valid configuration; nil means none loaded yet.
	Config *config.Config
	// Nodes by name.
	Nodes map[string]*corev1.Node
	// Self is this node's name.
	Self string
	// LoadBalancerClass: "" handles Services without a class, anything else
	// only Services of exactly that class (MetalLB's --lb-class).
	LoadBalancerClass string
	// IgnoreExcludeLB: see election.Input.
	IgnoreExcludeLB bool
}

// Input is what the ownership layer needs to know about one Service: its
// IPs, the nodes the configuration allows to announce them, and where this
// node would announce them.
type Input struct {
	// IPs are the Service's ingress IPs, in status order; the smallest is
	// the key the ownership of all of them follows (Key).
	IPs []netip.Addr
	// Pool the IPs belong to.
	Pool string
	// Eligible nodes, sorted (liveness not considered).
	Eligible []string
	// Scores are the eligible nodes' non-zero preference scores
	// (election.Score); nil without preferredNodeSelectors.
	Scores map[string]int64
	// Self: this node is eligible; then AllInterfaces, or else Interfaces,
	// is where it answers (its advertisements for the Service).
	Self          bool
	AllInterfaces bool
	Interfaces    []string
	// Reason nobody announces the Service; "" when some node may.
	Reason string
	// TCPPort is the Service's first TCP port (service.TCPPort; 0: none):
	// the owner's watchers try a connection to it through the owner
	// (delivery.go).
	TCPPort uint16
}

// Key is the ownership key of the Service: its smallest IP (IPv4 before
// IPv6), "" when none. Not its first: Services sharing an IP must follow one
// key whatever their families' order, and a single-stack IPv4 Service
// sharing its address with a dual-stack one listed IPv6 first would
// otherwise be owned under another key than its partner, and two nodes would
// answer for the shared IPv4 address.
func (in Input) Key() string {
	if len(in.IPs) == 0 {
		return ""
	}
	return slices.MinFunc(in.IPs, netip.Addr.Compare).String()
}

// Slot is one address slot of a Service: the addresses one node announces
// (one per family), and the ownership key they follow (their smallest).
type Slot struct {
	Key string
	IPs []netip.Addr
}

// Slots splits the Service's IPs into its address slots: slot i holds the
// i-th smallest address of each family. A Service with one address per
// family (every MetalLB Service) has one slot, whose key is Key(); one that
// asks for several (service.AnnotationAddressCount) has as many, which the
// ownership layer keeps on distinct nodes (ownership.Engine.SetGroup, the
// group being Key()). A family with fewer addresses than the other leaves
// the last slots single-family.
func (in Input) Slots() []Slot {
	var v4, v6 []netip.Addr
	for _, ip := range in.IPs {
		if ip.Is4() {
			v4 = append(v4, ip)
		} else {
			v6 = append(v6, ip)
		}
	}
	slices.SortFunc(v4, netip.Addr.Compare)
	slices.SortFunc(v6, netip.Addr.Compare)
	out := make([]Slot, max(len(v4), len(v6)))
	for i := range out {
		if i < len(v4) {
			out[i].IPs = append(out[i].IPs, v4[i])
		}
		if i < len(v6) {
			out[i].IPs = append(out[i].IPs, v6[i])
		}
		out[i].Key = out[i].IPs[0].String() // IPv4 sorts first: the smallest
	}
	return out
}

// Inputs computes the Input of svc given its EndpointSlices. It is pure and
// deterministic.
func Inputs(s Snapshot, svc *corev1.Service, eps []*discoveryv1.EndpointSlice) Input {
	in, ein := electionInput(s, svc, eps)
	if in.Reason != "" {
		return in
	}
	res := election.Eligible(ein)
	in.Eligible, in.Scores, in.Reason = res.Nodes, res.Scores, res.Reason
	if res.Reason == "" && slices.Contains(res.Nodes, s.Self) {
		in.Self, in.AllInterfaces, in.Interfaces = election.NodeInterfaces(res, s.Nodes[s.Self])
	}
	return in
}

// Exclusions returns why the configuration leaves out each node that may
// not announce svc (election.Explain), nil when the Service as a whole has
// a reason not to be announced. It follows the same steps as Inputs.
func Exclusions(s Snapshot, svc *corev1.Service, eps []*discoveryv1.EndpointSlice) map[string]string {
	in, ein := electionInput(s, svc, eps)
	if in.Reason != "" {
		return nil
	}
	return election.Explain(ein)
}

// electionInput checks what is decided before the election (type, class,
// IPs, pool) and returns the election's input; in.Reason is set when the
// Service is not announced whatever the nodes.
func electionInput(s Snapshot, svc *corev1.Service, eps []*discoveryv1.EndpointSlice) (Input, election.Input) {
	if svc == nil {
		return Input{Reason: ReasonServiceDeleted}, election.Input{}
	}
	if svc.Spec.Type != corev1.ServiceTypeLoadBalancer {
		return Input{Reason: ReasonNotLoadBalancer}, election.Input{}
	}
	if !service.ClassMatches(svc, s.LoadBalancerClass) {
		return Input{Reason: ReasonOtherClass}, election.Input{}
	}
	ips, err := service.IngressIPs(svc)
	switch {
	case err != nil:
		return Input{Reason: ReasonInvalidIP}, election.Input{}
	case len(ips) == 0:
		return Input{Reason: ReasonNoIPAllocated}, election.Input{}
	}
	if s.Config == nil {
		return Input{IPs: ips, Reason: ReasonNoConfig}, election.Input{}
	}
	pool := s.Config.PoolFor(ips)
	if pool == "" {
		return Input{IPs: ips, Reason: ReasonIPNotAllowed}, election.Input{}
	}
	return Input{IPs: ips, Pool: pool, TCPPort: service.TCPPort(svc)}, election.Input{
		Service:         svc,
		Pool:            pool,
		Advertisements:  s.Config.L2Advertisements,
		Nodes:           s.Nodes,
		EndpointSlices:  eps,
		IgnoreExcludeLB: s.IgnoreExcludeLB,
	}
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
// with its node label and deletes its duplicates and the leftovers of nodes
// that will not delete their own (cleans: a live member whose data path is
// not down deletes its own): a hard-killed previous owner cannot,
// while a live one deletes its own as soon as it stops announcing, and
// deleting it earlier, while its view still lags by a gossip round, only
// made it write the record again (a ServiceL2Status flapping between the two
// nodes for as long as the views differ). It keeps confirmed, the object it
// created last and the API server just returned, if it is among them, else
// the oldest (so the name is stable): the others may come from a cache that
// has not yet seen their deletion, and keeping a deleted object while
// deleting the confirmed one re-creates a record on every reconcile. A
// non-owner deletes only objects labelled with its own node, never another
// node's. A Service with several address slots (Input.Slots) has one
// announcer per slot, each with its object: cleans must then also be true for
// the nodes that announce another slot of it, which keep their own.
func PlanStatus(existing []*v1beta1.ServiceL2Status, self string, announce bool, confirmed string, cleans func(node string) bool) StatusPlan {
	sorted := slices.Clone(existing)
	slices.SortFunc(sorted, func(a, b *v1beta1.ServiceL2Status) int {
		if ca, cb := a.Name == confirmed, b.Name == confirmed; ca != cb {
			if ca {
				return -1
			}
			return 1
		}
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
		node := st.Labels[v1beta1.ServiceL2StatusNodeLabel]
		mine := node == self
		switch {
		case announce && mine && p.Keep == nil && (st.Status.Node == self || st.Status.Node == ""):
			p.Keep = st
		case mine, announce && (cleans == nil || !cleans(node)):
			p.Delete = append(p.Delete, st)
		}
	}
	return p
}

// Want is what this node does for one Service, as the status writer sees it.
type Want struct {
	// Announce is true when this node answers for the Service's IPs.
	Announce bool
	// AllInterfaces, or else Interfaces: where it answers.
	AllInterfaces bool
	Interfaces    []string
	// IPs are the Service's IPs it answers for: all of them, or those of
	// the address slots it owns.
	IPs []netip.Addr
}

// StatusIPs is the value of v1beta1.ServiceL2StatusIPsAnnotation.
func StatusIPs(w Want) string { return service.JoinIPs(w.IPs, ",") }

// ParseStatusIPs reads v1beta1.ServiceL2StatusIPsAnnotation; what does not
// parse is left out (a record written by hand or by another tool).
func ParseStatusIPs(v string) []netip.Addr {
	var out []netip.Addr
	for f := range strings.SplitSeq(v, ",") {
		if ip, err := netip.ParseAddr(strings.TrimSpace(f)); err == nil {
			out = append(out, ip)
		}
	}
	return out
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
