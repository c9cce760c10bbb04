package config

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/ironlb/ironlb/api/v1beta1"
	"github.com/ironlb/ironlb/internal/textlimit"
)

const (
	kindPool = "IPAddressPool"
	kindL2   = "L2Advertisement"
)

// Parse validates the pools and advertisements of the install namespace and returns
// them as one Config. It checks everything MetalLB's parser checks: address syntax,
// overlaps within and across pools, duplicate pools, empty pools, duplicate
// namespaces, invalid and duplicate selectors, duplicate pool references; beyond
// MetalLB it refuses entries touching addresses that can never be LoadBalancer IPs
// (loopback, link-local, multicast, unspecified: reserved.go) and negative
// priorities. It does not stop at the first problem: the error joins (errors.Join)
// one *FieldError per problem, each naming the object, the field and the value.
//
// namespaces resolves spec.serviceAllocation.namespaceSelectors to names; with nil
// namespaces the selectors are only checked for syntax. L2Advertisements naming a
// pool that does not exist are accepted (the name is ignored), as in MetalLB.
//
// Of two overlapping entries, the later one in input order is blamed ("overlaps
// with already defined CIDR ..."): pass objects oldest first for the most useful
// message. Parse does not modify its arguments and returns a nil Config with the
// error.
func Parse(pools []v1beta1.IPAddressPool, ads []v1beta1.L2Advertisement, namespaces []corev1.Namespace) (*Config, error) {
	cfg := &Config{Pools: make(map[string]*Pool, len(pools))}
	var all []error

	poolLabels := make(map[string]labels.Set, len(pools))
	var entries []addressEntry
	for i := range pools {
		src := &pools[i]
		pool, poolEntries, poolErrs := parsePool(src, namespaces)
		all = append(all, poolErrs...)
		if src.Name == "" {
			continue
		}
		if _, dup := poolLabels[src.Name]; dup {
			all = append(all, &FieldError{Kind: kindPool, Name: src.Name, Field: "metadata.name",
				Err: fmt.Errorf("duplicate definition of pool %q", src.Name)})
			continue
		}
		poolLabels[src.Name] = labels.Set(src.Labels)
		for j := range poolEntries {
			poolEntries[j].order = len(entries) + j
		}
		entries = append(entries, poolEntries...)
		if pool != nil {
			cfg.Pools[pool.Name] = pool
		}
	}
	all = append(all, overlaps(entries)...)

	seenAds := make(map[string]bool, len(ads))
	for i := range ads {
		src := &ads[i]
		if src.Name != "" && seenAds[src.Name] {
			all = append(all, &FieldError{Kind: kindL2, Name: src.Name, Field: "metadata.name",
				Err: fmt.Errorf("duplicate definition of L2Advertisement %q", src.Name)})
			continue
		}
		seenAds[src.Name] = true
		ad, adErrs := parseL2Advertisement(src, poolLabels)
		if len(adErrs) > 0 {
			all = append(all, adErrs...)
			continue
		}
		cfg.L2Advertisements = append(cfg.L2Advertisements, ad)
	}
	slices.SortFunc(cfg.L2Advertisements, func(a, b *L2Advertisement) int { return cmp.Compare(a.Name, b.Name) })

	if len(all) > 0 {
		return nil, errors.Join(all...)
	}
	return cfg, nil
}

// OlderFirst orders objects oldest first (creation time, then name): the
// order to pass them to Parse in, so a conflict between two stored objects is
// blamed on the newer one whatever order they were listed in.
func OlderFirst(a, b *metav1.ObjectMeta) int {
	if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
		return c
	}
	return strings.Compare(a.Name, b.Name)
}

// AdvertisementsFor returns the L2Advertisements that apply to the named pool, in
// name order.
func (c *Config) AdvertisementsFor(pool string) []*L2Advertisement {
	var out []*L2Advertisement
	for _, ad := range c.L2Advertisements {
		if ad.Pools.Has(pool) {
			out = append(out, ad)
		}
	}
	return out
}

// PoolFor returns the pool whose ranges contain every one of ips, "" if none
// does (or ips is empty). Pools never overlap (Parse rejects it), so the
// answer is unique.
func (c *Config) PoolFor(ips []netip.Addr) string {
	if c == nil || len(ips) == 0 {
		return ""
	}
	for name, p := range c.Pools {
		if p != nil && p.containsAll(ips) {
			return name
		}
	}
	return ""
}

func (p *Pool) containsAll(ips []netip.Addr) bool {
	for _, ip := range ips {
		if !slices.ContainsFunc(p.Ranges, func(r Range) bool { return r.Contains(ip) }) {
			return false
		}
	}
	return true
}

// addressEntry is one parsed spec.addresses entry, remembered for the overlap check.
type addressEntry struct {
	pool  string
	index int    // index in spec.addresses
	raw   string // as written
	r     Range
	order int // position across all pools, in input order: the earlier one is "already defined"
}

func parsePool(src *v1beta1.IPAddressPool, namespaces []corev1.Namespace) (*Pool, []addressEntry, []error) {
	e := &errs{kind: kindPool, name: src.Name}
	if src.Name == "" {
		e.add("metadata.name", "missing pool name")
	}
	if len(src.Spec.Addresses) == 0 {
		e.add("spec.addresses", "pool has no prefixes defined")
	}
	pool := &Pool{
		Name:          src.Name,
		AutoAssign:    src.Spec.AutoAssign == nil || *src.Spec.AutoAssign,
		AvoidBuggyIPs: src.Spec.AvoidBuggyIPs,
	}
	entries := make([]addressEntry, 0, len(src.Spec.Addresses))
	for i, s := range src.Spec.Addresses {
		path := fmt.Sprintf("spec.addresses[%d]", i)
		r, err := ParseAddresses(s)
		if err != nil {
			e.wrap(path, err)
			continue
		}
		if err := checkReserved(r); err != nil {
			e.add(path, "%s %w", textlimit.Quote(s), err)
			continue
		}
		pool.Ranges = append(pool.Ranges, r)
		entries = append(entries, addressEntry{pool: src.Name, index: i, raw: s, r: r})
	}
	slices.SortFunc(pool.Ranges, func(a, b Range) int { return a.First.Compare(b.First) })
	if sa := src.Spec.ServiceAllocation; sa != nil {
		pool.ServiceAllocation = parseServiceAllocation(e, sa, namespaces)
	}
	if len(e.list) > 0 {
		return nil, entries, e.list
	}
	return pool, entries, nil
}

func parseServiceAllocation(e *errs, sa *v1beta1.ServiceAllocation, namespaces []corev1.Namespace) *ServiceAllocation {
	const field = "spec.serviceAllocation"
	out := &ServiceAllocation{Priority: sa.Priority, Namespaces: sets.New[string]()}
	if sa.Priority < 0 {
		e.add(field+".priority", "priority %d is negative: 1 is the highest priority, 0 (or unset) the lowest", sa.Priority)
	}
	for i, ns := range sa.Namespaces {
		path := fmt.Sprintf("%s.namespaces[%d]", field, i)
		if msgs := validation.IsDNS1123Label(ns); len(msgs) > 0 {
			e.add(path, "invalid namespace name %s: %s", textlimit.Quote(ns), strings.Join(msgs, "; "))
			continue
		}
		if out.Namespaces.Has(ns) {
			e.add(path, "duplicate definition in namespaces field: %s", textlimit.Quote(ns))
			continue
		}
		out.Namespaces.Insert(ns)
	}
	nsSelectors := parseSelectors(e, field+".namespaceSelectors", sa.NamespaceSelectors)
	out.NamespaceSelectorsSet = len(sa.NamespaceSelectors) > 0
	for i := range namespaces {
		set := labels.Set(namespaces[i].Labels)
		for _, sel := range nsSelectors {
			if sel.Matches(set) {
				out.Namespaces.Insert(namespaces[i].Name)
				break
			}
		}
	}
	out.ServiceSelectors = parseSelectors(e, field+".serviceSelectors", sa.ServiceSelectors)
	return out
}

// overlaps reports every pair of overlapping entries, blaming the one defined later
// (in input order) and naming both entries and both pools. Sorting by first address
// makes it O(n log n + pairs): only entries starting inside a range can overlap it.
func overlaps(entries []addressEntry) []error {
	// Sort indices, not entries: moving pointer-free ints is much cheaper.
	sorted := make([]int, len(entries))
	for i := range sorted {
		sorted[i] = i
	}
	slices.SortFunc(sorted, func(a, b int) int {
		if c := entries[a].r.First.Compare(entries[b].r.First); c != 0 {
			return c
		}
		return cmp.Compare(entries[a].order, entries[b].order)
	})
	type finding struct {
		order int
		err   error
	}
	var found []finding
	for i := range sorted {
		a := &entries[sorted[i]]
		for j := i + 1; j < len(sorted); j++ {
			b := &entries[sorted[j]]
			if !a.r.Overlaps(b.r) {
				break // b starts after a ends (or is of the next family): so do all later ones.
			}
			earlier, later := a, b
			if later.order < earlier.order {
				earlier, later = later, earlier
			}
			found = append(found, finding{later.order, &FieldError{
				Kind: kindPool, Name: later.pool, Field: fmt.Sprintf("spec.addresses[%d]", later.index),
				Err: fmt.Errorf("CIDR %q in pool %q overlaps with already defined CIDR %q in pool %q",
					later.raw, later.pool, earlier.raw, earlier.pool),
			}})
		}
	}
	slices.SortStableFunc(found, func(a, b finding) int { return cmp.Compare(a.order, b.order) })
	out := make([]error, len(found))
	for i := range found {
		out[i] = found[i].err
	}
	return out
}

func parseL2Advertisement(src *v1beta1.L2Advertisement, poolLabels map[string]labels.Set) (*L2Advertisement, []error) {
	e := &errs{kind: kindL2, name: src.Name}
	if src.Name == "" {
		e.add("metadata.name", "missing L2Advertisement name")
	}
	ad := &L2Advertisement{Name: src.Name, Pools: sets.New[string]()}

	named := sets.New[string]()
	for i, p := range src.Spec.IPAddressPools {
		path := fmt.Sprintf("spec.ipAddressPools[%d]", i)
		switch {
		case p == "":
			e.add(path, "empty pool name")
		case named.Has(p):
			e.add(path, "duplicate definition of ipAddressPools %s", textlimit.Quote(p))
		default:
			named.Insert(p)
			if _, ok := poolLabels[p]; ok { // Pools that do not exist are ignored.
				ad.Pools.Insert(p)
			}
		}
	}
	poolSelectors := parseSelectors(e, "spec.ipAddressPoolSelectors", src.Spec.IPAddressPoolSelectors)
	for name, set := range poolLabels {
		if len(poolSelectors) == 0 {
			break
		}
		for _, sel := range poolSelectors {
			if sel.Matches(set) {
				ad.Pools.Insert(name)
				break
			}
		}
	}
	if len(src.Spec.IPAddressPools) == 0 && len(src.Spec.IPAddressPoolSelectors) == 0 {
		for name := range poolLabels {
			ad.Pools.Insert(name)
		}
	}

	ad.NodeSelectors = parseSelectors(e, "spec.nodeSelectors", src.Spec.NodeSelectors)
	ad.ServiceSelectors = parseSelectors(e, "spec.serviceSelectors", src.Spec.ServiceSelectors)
	ad.PreferredNodes = parsePreferredNodes(e, src.Spec.PreferredNodeSelectors)

	seenIf := sets.New[string]()
	for i, name := range src.Spec.Interfaces {
		if err := validInterfaceName(name); err != nil {
			e.add(fmt.Sprintf("spec.interfaces[%d]", i), "invalid interface name %s: %w", textlimit.Quote(name), err)
			continue
		}
		if !seenIf.Has(name) { // A repeated name means the same thing: keep one.
			seenIf.Insert(name)
			ad.Interfaces = append(ad.Interfaces, name)
		}
	}

	if len(e.list) > 0 {
		return nil, e.list
	}
	return ad, nil
}

// Bounds of a preference's weight, as for a Pod's preferred scheduling term.
const (
	minPreferenceWeight = 1
	maxPreferenceWeight = 100
)

// parsePreferredNodes checks each preference's weight (the CRD enforces the
// range too, but a CRD from before the field, or the webhook run without the
// API server's validation, would not) and selector. Repeated preferences are
// allowed: their weights add up, as MetalLB sums them.
func parsePreferredNodes(e *errs, in []v1beta1.PreferredNodeSelector) []PreferredNodes {
	var out []PreferredNodes
	for i := range in {
		path := fmt.Sprintf("spec.preferredNodeSelectors[%d]", i)
		p := &in[i]
		ok := true
		if p.Weight < minPreferenceWeight || p.Weight > maxPreferenceWeight {
			e.add(path+".weight", "weight %d is out of range: want %d to %d", p.Weight, minPreferenceWeight, maxPreferenceWeight)
			ok = false
		}
		sel, err := parseSelector(&p.Preference)
		if err != nil {
			e.add(path+".preference", "invalid preference %s: %w", selectorText(&p.Preference), err)
			ok = false
		}
		if ok {
			out = append(out, PreferredNodes{Weight: int64(p.Weight), Selector: sel})
		}
	}
	return out
}

// validInterfaceName applies the kernel's rule for network device names, so a name
// that can never match an interface is caught before it silently announces nothing.
func validInterfaceName(name string) error {
	switch {
	case name == "":
		return errors.New("empty")
	case len(name) > 15:
		return errors.New("longer than 15 bytes")
	case name == "." || name == "..":
		return errors.New("reserved name")
	case strings.ContainsAny(name, "/: \t\n\v\f\r"):
		return errors.New("contains '/', ':' or white space")
	}
	return nil
}
