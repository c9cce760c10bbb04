// Package election decides which nodes may announce a Service's IPs in layer-2
// mode, by the configuration alone.
//
// It is pure: every speaker feeds it the same objects (Service, EndpointSlices,
// Nodes, parsed L2Advertisements) and gets the same answer. The rules are
// MetalLB's: a node qualifies if an advertisement of the IP's pool selects it,
// it is usable, and (externalTrafficPolicy Local) it hosts a ready endpoint.
// Which qualifying node announces, and when that changes, is
// internal/ownership's job, preferring the nodes of the highest Score
// (preferredNodeSelectors); Rank gives MetalLB's hash order without
// preferences (ownership's tie-break; the candidates `kubectl ironlb status`
// lists).
package election

import (
	"slices"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/ironlb/ironlb/internal/config"
	"github.com/ironlb/ironlb/internal/ownership"
	"github.com/ironlb/ironlb/internal/service"
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
	// ReasonNoCandidates: endpoints and advertisements exist, but no usable
	// node qualifies (all excluded or NetworkUnavailable, or for
	// externalTrafficPolicy Local no selected node hosts a ready endpoint),
	// or none of those that qualify is alive.
	ReasonNoCandidates = "noCandidates"
)

// Annotations that mark a Service as sharing its IP (read by
// service.SharingKey): the stable key wins, the deprecated one is still
// honoured as MetalLB does.
const (
	AnnotationAllowSharedIP           = service.AnnotationAllowSharedIP
	AnnotationAllowSharedIPDeprecated = service.LegacyPrefix + "allow-shared-ip"
)

// Input is everything that decides which nodes may announce one Service.
type Input struct {
	// Service whose IPs are announced: labels (serviceSelectors), annotations
	// (allow-shared-ip) and spec.externalTrafficPolicy are read.
	Service *corev1.Service
	// Pool is the name of the IPAddressPool the Service's IPs come from.
	Pool string
	// Advertisements are all parsed L2Advertisements; those of other pools are
	// ignored here.
	Advertisements []*config.L2Advertisement
	// Nodes by name. Liveness is not judged here (internal/ownership does):
	// every Node object is considered.
	Nodes map[string]*corev1.Node
	// EndpointSlices of the Service.
	EndpointSlices []*discoveryv1.EndpointSlice
	// IgnoreExcludeLB keeps nodes labelled
	// node.kubernetes.io/exclude-from-external-load-balancers (MetalLB's
	// --ignore-exclude-lb).
	IgnoreExcludeLB bool
}

// Result is the outcome of Eligible.
type Result struct {
	// Nodes that may announce the Service, sorted. Empty when Reason is set.
	Nodes []string
	// Reason is why no node may; "" when some may.
	Reason string
	// Advertisements are those that apply to the Service (pool and
	// serviceSelectors); the announcing node takes its interfaces from them.
	Advertisements []*config.L2Advertisement
	// Scores are the preference scores of Nodes (Score); only non-zero
	// ones, nil when no advertisement has preferredNodeSelectors.
	Scores map[string]int64
}

// Eligible returns the nodes the configuration allows to announce
// in.Service: usable (not NetworkUnavailable, not excluded), selected by an
// applicable advertisement, and for externalTrafficPolicy Local hosting a
// ready endpoint. Which of them announces is internal/ownership's decision.
// The result does not depend on the order of any input.
func Eligible(in Input) Result {
	ads, reason := serviceAdvertisements(in)
	if reason != "" {
		return Result{Reason: reason, Advertisements: ads}
	}
	local := localNodes(in)
	var nodes []string
	var scores map[string]int64
	for name, node := range in.Nodes {
		if nodeExclusion(in, ads, local, name, node) != "" {
			continue
		}
		nodes = append(nodes, name)
		if sc := Score(ads, node); sc != 0 {
			if scores == nil {
				scores = map[string]int64{}
			}
			scores[name] = sc
		}
	}
	if len(nodes) == 0 {
		return Result{Reason: ReasonNoCandidates, Advertisements: ads}
	}
	slices.Sort(nodes)
	return Result{Nodes: nodes, Advertisements: ads, Scores: scores}
}

// Score is node's preference score for a Service whose applicable
// advertisements are ads: the weights of the preferredNodeSelectors node
// matches, summed within each advertisement and across them. An
// advertisement counts only for the nodes its own nodeSelectors allow, so it
// never lifts a node that only another advertisement makes eligible.
func Score(ads []*config.L2Advertisement, node *corev1.Node) int64 {
	var sum int64
	for _, ad := range ads {
		if len(ad.PreferredNodes) == 0 || !SelectsNode(ad, node) {
			continue
		}
		for _, p := range ad.PreferredNodes {
			if p.Selector.Matches(labels.Set(node.Labels)) {
				sum += p.Weight
			}
		}
	}
	return sum
}

// Why a node the configuration does not allow to announce a Service is left
// out (Explain); the Service itself may still be announced by others.
const (
	// NodeNetworkUnavailable: the node's NetworkUnavailable condition is True.
	NodeNetworkUnavailable = "networkUnavailable"
	// NodeExcludedByLabel: the node carries
	// node.kubernetes.io/exclude-from-external-load-balancers.
	NodeExcludedByLabel = "excludedByLabel"
	// NodeDrained: the node carries the DrainAnnotation (kubectl ironlb
	// drain): its IPs move off it as planned moves.
	NodeDrained = "drained"
	// NodeNoLocalEndpoint: externalTrafficPolicy Local and no ready endpoint
	// of the Service runs on the node.
	NodeNoLocalEndpoint = "noLocalEndpoint"
	// NodeNotSelected: no applicable L2Advertisement's nodeSelectors match
	// the node.
	NodeNotSelected = "notSelectedByAdvertisement"
)

// Explain returns, for every node of in.Nodes that Eligible leaves out, why
// (Node* constants); nil when the Service as a whole is not announced
// (Eligible's Reason says why) or every node qualifies. It applies the same
// rule as Eligible, node by node.
func Explain(in Input) map[string]string {
	ads, reason := serviceAdvertisements(in)
	if reason != "" {
		return nil
	}
	local := localNodes(in)
	var out map[string]string
	for name, node := range in.Nodes {
		if r := nodeExclusion(in, ads, local, name, node); r != "" {
			if out == nil {
				out = map[string]string{}
			}
			out[name] = r
		}
	}
	return out
}

// serviceAdvertisements returns the advertisements that apply to the
// Service, or the reason no node at all may announce it.
func serviceAdvertisements(in Input) ([]*config.L2Advertisement, string) {
	if !HasServingEndpoint(in.EndpointSlices) {
		return nil, ReasonNoReadyEndpoints
	}
	ads := AdvertisementsForService(in.Advertisements, in.Pool, in.Service)
	if len(ads) == 0 {
		return nil, ReasonNoMatchingAdvertisement
	}
	if in.Service != nil && service.SharingKey(in.Service) != "" && slices.ContainsFunc(ads, func(ad *config.L2Advertisement) bool {
		return len(ad.ServiceSelectors) > 0
	}) {
		return ads, ReasonSharedIPWithServiceSelector
	}
	return ads, ""
}

// localNodes returns the nodes with a serving endpoint for an
// externalTrafficPolicy Local Service, nil for any other.
func localNodes(in Input) map[string]bool {
	if in.Service != nil && in.Service.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal {
		return NodesWithServingEndpoint(in.EndpointSlices)
	}
	return nil
}

// nodeExclusion is the rule for one node: "" when it may announce, else the
// first reason it may not, in the order a fix is usually looked for.
func nodeExclusion(in Input, ads []*config.L2Advertisement, local map[string]bool, name string, node *corev1.Node) string {
	switch {
	case node == nil:
		return NodeNotSelected
	case NetworkUnavailable(node):
		return NodeNetworkUnavailable
	case Drained(node):
		return NodeDrained
	case excluded(node, in.IgnoreExcludeLB):
		return NodeExcludedByLabel
	case local != nil && !local[name]:
		return NodeNoLocalEndpoint
	case !slices.ContainsFunc(ads, func(ad *config.L2Advertisement) bool { return SelectsNode(ad, node) }):
		return NodeNotSelected
	}
	return ""
}

// NodeInterfaces returns where node announces the Service when it owns it:
// from node's advertisements among res.Advertisements, all interfaces if one
// names none, else the sorted union. ok is false when no advertisement
// selects node.
func NodeInterfaces(res Result, node *corev1.Node) (ok, all bool, ifaces []string) {
	if node == nil {
		return false, false, nil
	}
	var mine []*config.L2Advertisement
	for _, ad := range res.Advertisements {
		if SelectsNode(ad, node) {
			mine = append(mine, ad)
		}
	}
	if len(mine) == 0 {
		return false, false, nil
	}
	all, ifaces = Interfaces(mine)
	return true, all, ifaces
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

// Rank returns nodes (deduplicated) in hash order for keyIP: first the node
// with the smallest sha256(node + "#" + keyIP) (ownership.HashLess), the one
// MetalLB would elect, then the node that would win if the first went away,
// and so on. ownership breaks ties between equally preferred, equally loaded
// nodes in this order.
func Rank(keyIP string, nodes []string) []string {
	out := slices.Clone(nodes)
	slices.SortFunc(out, func(a, b string) int {
		switch {
		case a == b:
			return 0
		case ownership.HashLess(a, b, keyIP):
			return -1
		}
		return 1
	})
	return slices.Compact(out)
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
	return !NetworkUnavailable(node) && !Drained(node) && !excluded(node, ignoreExcludeLB)
}

// DrainAnnotation on a Node takes it out of every election while it is set
// (any value but "false"): `kubectl ironlb drain` sets it, undrain removes
// it. Its IPs move as planned moves, whose connections the new owners
// forward to it for --drain-timeout, so that maintenance breaks none. An
// annotation rather than the exclude label, which other load balancers and
// cloud controllers read too.
const DrainAnnotation = "ironlb.io/drain"

// RebalanceAnnotation on a Node asks its speaker to even out the spread
// now: for a minute from the annotation's time (RFC 3339), or until the
// annotation is removed, the node gives one of its IPs a second to nodes
// owning at least two fewer, as planned moves, whatever --rebalance-rate
// says. `kubectl ironlb rebalance` sets it on every node and removes it
// once the spread is stable.
const RebalanceAnnotation = "ironlb.io/rebalance"

// Drained reports whether node carries the DrainAnnotation.
func Drained(node *corev1.Node) bool {
	v, ok := node.Annotations[DrainAnnotation]
	return ok && v != "false"
}

// NetworkUnavailable reports whether node's NetworkUnavailable condition is True.
func NetworkUnavailable(node *corev1.Node) bool {
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeNetworkUnavailable && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

func excluded(node *corev1.Node, ignoreExcludeLB bool) bool {
	_, ok := node.Labels[corev1.LabelNodeExcludeBalancers]
	return ok && !ignoreExcludeLB
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
