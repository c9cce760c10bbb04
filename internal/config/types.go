// Package config turns MetalLB-compatible custom resources (IPAddressPool,
// L2Advertisement) into one validated, immutable in-memory configuration.
//
// The same parser runs in the controller, the speaker and the validating webhook,
// so a webhook rejects exactly what the daemons would refuse to load.
package config

import (
	"net/netip"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/sets"
)

// Config is the parsed configuration. It is never mutated after Parse returns.
type Config struct {
	// Pools by name.
	Pools map[string]*Pool
	// L2Advertisements in name order.
	L2Advertisements []*L2Advertisement
}

// Range is an inclusive range of addresses of one family: First <= Last.
// A CIDR is stored as the range of all its addresses.
type Range struct {
	First, Last netip.Addr
}

// Pool is a parsed IPAddressPool.
type Pool struct {
	Name string
	// Ranges are sorted by First and never overlap (within or across pools).
	Ranges []Range
	// AutoAssign false means the pool is used only when a Service asks for it
	// by name or by address.
	AutoAssign bool
	// AvoidBuggyIPs skips IPv4 addresses ending in .0 or .255.
	AvoidBuggyIPs bool
	// ServiceAllocation restricts and ranks automatic allocation; nil means the
	// pool serves any Service at the lowest priority.
	ServiceAllocation *ServiceAllocation
}

// ServiceAllocation is a parsed spec.serviceAllocation.
type ServiceAllocation struct {
	// Priority: lower is preferred; 0 (unset) is the lowest priority.
	Priority int
	// Namespaces the pool serves: spec.namespaces plus the namespaces matched by
	// spec.namespaceSelectors at parse time. Empty with no selectors means all.
	Namespaces sets.Set[string]
	// NamespaceSelectorsSet records that namespaceSelectors were given, so an
	// empty Namespaces set means "none matched", not "all".
	NamespaceSelectorsSet bool
	// ServiceSelectors are ORed; empty means every Service.
	ServiceSelectors []labels.Selector
}

// L2Advertisement is a parsed L2Advertisement.
type L2Advertisement struct {
	Name string
	// Pools this advertisement applies to, resolved from ipAddressPools and
	// ipAddressPoolSelectors; every pool when neither was given.
	Pools sets.Set[string]
	// NodeSelectors are ORed; empty means every node.
	NodeSelectors []labels.Selector
	// Interfaces to announce from; empty means every eligible interface.
	Interfaces []string
	// ServiceSelectors are ORed; empty means every Service of the pools.
	ServiceSelectors []labels.Selector
	// PreferredNodes are soft preferences among the nodes NodeSelectors
	// allow, in spec order; nil when none.
	PreferredNodes []PreferredNodes
}

// PreferredNodes is a parsed spec.preferredNodeSelectors entry: nodes the
// selector matches score Weight (1-100) more.
type PreferredNodes struct {
	Weight   int64
	Selector labels.Selector
}
