// Package election decides which node announces a Service's IPs in layer-2 mode.
//
// It is pure: every speaker feeds it the same objects (Service, EndpointSlices, Nodes,
// parsed L2Advertisements, live memberlist members) and gets the same answer, so no
// consensus round is needed. The rule is MetalLB's: the candidates are the live nodes
// an advertisement of the IP's pool allows, and the winner is the candidate with the
// smallest sha256(node + "#" + ip), where ip is the Service's first ingress IP. Using
// the first IP as the key keeps both IPs of a dual-stack Service, and all Services
// sharing an IP, on one node.
package election

import (
	"bytes"
	"crypto/sha256"
	"slices"
	"sort"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/ironlb/ironlb/internal/config"
)

// Reasons a Service is not announced by a node. They are logged as the "reason" of
// a serviceWithdrawn line; the MetalLB ones keep MetalLB's spelling.
const (
	// ReasonNotOwner: another candidate wins the election.
	ReasonNotOwner = "notOwner"
	// ReasonNoMatchingAdvertisement: no L2Advertisement of the pool applies to
	// the Service, or none of them selects this node.
	ReasonNoMatchingAdvertisement = "noMatchingAdvertisement"
	// ReasonSharedIPWithServiceSelector: the Service shares its IP
	// (allow-shared-ip) and an advertisement selects services by label; siblings
	// could then be announced from different nodes, so none is announced.
	ReasonSharedIPWithServiceSelector = "sharedIPWithServiceSelector"
	// ReasonNoReadyEndpoints: the Service has no endpoint that can serve.
	ReasonNoReadyEndpoints = "noReadyEndpoints"
	// ReasonNoCandidates: endpoints and advertisements exist, but no live,
	// usable node qualifies (all excluded, NetworkUnavailable, not members,
	// not Ready when memberlist is disabled, or
	// for externalTrafficPolicy Local no member hosts a ready endpoint).
	ReasonNoCandidates = "noCandidates"
)

// Annotations that mark a Service as sharing its IP; the stable key wins, the
// deprecated one is still honoured as MetalLB does.
const (
	AnnotationAllowSharedIP           = "metallb.io/allow-shared-ip"
	AnnotationAllowSharedIPDeprecated = "metallb.universe.tf/allow-shared-ip"
)

// Input is everything the election of one Service looks at.
type Input struct {
	// KeyIP is the Service's first ingress IP in canonical string form
	// (netip.Addr.String()); it keys the hash for all of the Service's IPs.
	KeyIP string
	// Service whose IPs are elected: labels (serviceSelectors), annotations
	// (allow-shared-ip) and spec.externalTrafficPolicy are read.
	Service *corev1.Service
	// Pool is the name of the IPAddressPool the Service's IPs come from.
	Pool string
	// Advertisements are all parsed L2Advertisements; those of other pools are
	// ignored here.
	Advertisements []*config.L2Advertisement
	// Nodes by name. A member without a Node object is not a candidate: its
	// labels and conditions are unknown.
	Nodes map[string]*corev1.Node
	// Members are the live memberlist members (node names).
	Members []string
	// EndpointSlices of the Service.
	EndpointSlices []*discoveryv1.EndpointSlice
	// IgnoreExcludeLB keeps nodes labelled
	// node.kubernetes.io/exclude-from-external-load-balancers (MetalLB's
	// --ignore-exclude-lb).
	IgnoreExcludeLB bool
	// RequireReady drops nodes whose Ready condition is not True. Set it
	// when Members is not a liveness signal (memberlist disabled, Members is
	// every Node): node readiness, driven by the kubelet heartbeat and the
	// node lifecycle controller, is then the only way a dead node stops
	// being a candidate. With memberlist it stays false: memberlist detects
	// a dead speaker faster, and a NotReady node whose speaker is alive can
	// still answer ARP.
	RequireReady bool
}

// Result is the outcome of Candidates.
type Result struct {
	// Candidates in election order: Candidates[0] is the winner. Empty when
	// Reason is set.
	Candidates []string
	// Reason is why there is no candidate; "" when there is one.
	Reason string
	// Advertisements are those that apply to the Service (pool and
	// serviceSelectors); the announcing node takes its interfaces from them.
	Advertisements []*config.L2Advertisement
}

// Candidates returns the nodes that may announce in.Service, in election order.
// It does not depend on the order of any of its inputs.
func Candidates(in Input) Result {
	res := candidates(in)
	res.Candidates = Rank(in.KeyIP, res.Candidates)
	if len(res.Candidates) == 0 {
		res.Candidates = nil
	}
	return res
}

// candidates is Candidates without the ordering (Decide needs only the winner,
// which is cheaper than sorting every candidate).
func candidates(in Input) Result {
	if !HasServingEndpoint(in.EndpointSlices) {
		return Result{Reason: ReasonNoReadyEndpoints}
	}
	ads := AdvertisementsForService(in.Advertisements, in.Pool, in.Service)
	if len(ads) == 0 {
		return Result{Reason: ReasonNoMatchingAdvertisement}
	}
	if sharesIP(in.Service) && slices.ContainsFunc(ads, func(ad *config.L2Advertisement) bool {
		return len(ad.ServiceSelectors) > 0
	}) {
		return Result{Reason: ReasonSharedIPWithServiceSelector, Advertisements: ads}
	}

	var local map[string]bool
	if in.Service != nil && in.Service.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal {
		local = NodesWithServingEndpoint(in.EndpointSlices)
	}

	var nodes []string
	for _, name := range in.Members {
		node := in.Nodes[name]
		if node == nil || !Usable(node, in.IgnoreExcludeLB) {
			continue
		}
		if in.RequireReady && !Ready(node) {
			continue
		}
		if local != nil && !local[name] {
			continue
		}
		if !slices.ContainsFunc(ads, func(ad *config.L2Advertisement) bool { return SelectsNode(ad, node) }) {
			continue
		}
		nodes = append(nodes, name)
	}
	if len(nodes) == 0 {
		return Result{Reason: ReasonNoCandidates, Advertisements: ads}
	}
	return Result{Candidates: nodes, Advertisements: ads}
}

// Decision is what one node does for one Service.
type Decision struct {
	// Announce is true when this node is the winner.
	Announce bool
	// Winner is the elected node, "" when nobody qualifies.
	Winner string
	// Reason this node does not announce; "" when Announce.
	Reason string
	// AllInterfaces is true when one of this node's advertisements for the
	// Service names no interface: announce from every eligible interface.
	AllInterfaces bool
	// Interfaces is otherwise the sorted union of those advertisements'
	// interfaces.
	Interfaces []string
}

// Decide runs the election for node self.
func Decide(in Input, self string) Decision {
	res := candidates(in)
	d := Decision{Reason: res.Reason, Winner: Winner(in.KeyIP, res.Candidates)}
	if res.Reason != "" {
		return d
	}
	node := in.Nodes[self]
	var mine []*config.L2Advertisement
	if node != nil {
		for _, ad := range res.Advertisements {
			if SelectsNode(ad, node) {
				mine = append(mine, ad)
			}
		}
	}
	if len(mine) == 0 {
		d.Reason = ReasonNoMatchingAdvertisement
		return d
	}
	if d.Winner != self {
		d.Reason = ReasonNotOwner
		return d
	}
	d.Announce = true
	d.AllInterfaces, d.Interfaces = Interfaces(mine)
	return d
}

// Interfaces merges the interfaces of the advertisements a node announces with:
// all interfaces if any advertisement names none, else the sorted union.
func Interfaces(ads []*config.L2Advertisement) (all bool, ifaces []string) {
	for _, ad := range ads {
		if len(ad.Interfaces) == 0 {
			return true, nil
		}
		ifaces = append(ifaces, ad.Interfaces...)
	}
	slices.Sort(ifaces)
	return false, slices.Compact(ifaces)
}

// Winner returns the node with the smallest sha256(node + "#" + keyIP), "" for no
// nodes. keyIP is the Service's first ingress IP in its canonical string form.
func Winner(keyIP string, nodes []string) string {
	best, bestSum := "", [sha256.Size]byte{}
	for _, n := range nodes {
		sum := sha256.Sum256([]byte(n + "#" + keyIP))
		if best == "" || less(sum, n, bestSum, best) {
			best, bestSum = n, sum
		}
	}
	return best
}

// Rank returns nodes (deduplicated) in election order for keyIP: the winner
// first, then the node that would win if the winner went away, and so on.
func Rank(keyIP string, nodes []string) []string {
	type entry struct {
		name string
		sum  [sha256.Size]byte
	}
	entries := make([]entry, 0, len(nodes))
	for _, n := range nodes {
		entries = append(entries, entry{n, sha256.Sum256([]byte(n + "#" + keyIP))})
	}
	sort.Slice(entries, func(i, j int) bool {
		return less(entries[i].sum, entries[i].name, entries[j].sum, entries[j].name)
	})
	out := make([]string, 0, len(entries))
	for i, e := range entries {
		if i > 0 && e.name == entries[i-1].name {
			continue
		}
		out = append(out, e.name)
	}
	return out
}

// less orders by hash, then by name: a hash tie between different names is
// practically impossible, but the order must stay total for permutation
// invariance.
func less(a [sha256.Size]byte, an string, b [sha256.Size]byte, bn string) bool {
	if c := bytes.Compare(a[:], b[:]); c != 0 {
		return c < 0
	}
	return an < bn
}

// AdvertisementsForService returns the advertisements of pool that apply to svc:
// those without serviceSelectors, or with one matching the Service's labels.
func AdvertisementsForService(ads []*config.L2Advertisement, pool string, svc *corev1.Service) []*config.L2Advertisement {
	var svcLabels labels.Set
	if svc != nil {
		svcLabels = svc.Labels
	}
	var out []*config.L2Advertisement
	for _, ad := range ads {
		if ad == nil || !ad.Pools.Has(pool) {
			continue
		}
		if len(ad.ServiceSelectors) > 0 && !slices.ContainsFunc(ad.ServiceSelectors, func(s labels.Selector) bool {
			return s.Matches(svcLabels)
		}) {
			continue
		}
		out = append(out, ad)
	}
	return out
}

// SelectsNode reports whether ad allows node to announce: no nodeSelectors, or
// one of them matching the node's labels.
func SelectsNode(ad *config.L2Advertisement, node *corev1.Node) bool {
	if len(ad.NodeSelectors) == 0 {
		return true
	}
	return slices.ContainsFunc(ad.NodeSelectors, func(s labels.Selector) bool {
		return s.Matches(labels.Set(node.Labels))
	})
}

// Usable reports whether node may announce at all: its network is not
// unavailable and (unless ignoreExcludeLB) it does not carry the
// exclude-from-external-load-balancers label, whatever its value.
func Usable(node *corev1.Node, ignoreExcludeLB bool) bool {
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeNetworkUnavailable && c.Status == corev1.ConditionTrue {
			return false
		}
	}
	if !ignoreExcludeLB {
		if _, ok := node.Labels[corev1.LabelNodeExcludeBalancers]; ok {
			return false
		}
	}
	return true
}

// Ready reports whether node's Ready condition is True. A node without the
// condition (not yet reported by its kubelet) is not ready.
func Ready(node *corev1.Node) bool {
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// CanServe is MetalLB's rule for an endpoint that takes traffic: ready (an unset
// ready counts as ready, per the EndpointSlice API), or still serving while
// terminating.
func CanServe(c discoveryv1.EndpointConditions) bool {
	return c.Ready == nil || *c.Ready || (c.Serving != nil && *c.Serving)
}

// HasServingEndpoint reports whether any endpoint of the slices can serve.
func HasServingEndpoint(slices []*discoveryv1.EndpointSlice) bool {
	for _, s := range slices {
		if s == nil {
			continue
		}
		for _, ep := range s.Endpoints {
			if CanServe(ep.Conditions) {
				return true
			}
		}
	}
	return false
}

// NodesWithServingEndpoint returns the nodes hosting an endpoint that can serve.
func NodesWithServingEndpoint(slices []*discoveryv1.EndpointSlice) map[string]bool {
	out := map[string]bool{}
	for _, s := range slices {
		if s == nil {
			continue
		}
		for _, ep := range s.Endpoints {
			if ep.NodeName != nil && *ep.NodeName != "" && CanServe(ep.Conditions) {
				out[*ep.NodeName] = true
			}
		}
	}
	return out
}

func sharesIP(svc *corev1.Service) bool {
	if svc == nil {
		return false
	}
	if v, ok := svc.Annotations[AnnotationAllowSharedIP]; ok {
		return v != ""
	}
	return svc.Annotations[AnnotationAllowSharedIPDeprecated] != ""
}
