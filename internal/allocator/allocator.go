// Package allocator assigns LoadBalancer IPs to Services from IPAddressPools,
// with MetalLB's semantics (pool selection, sharing, dual-stack) made
// deterministic, and parses the MetalLB Service annotations into a Request.
//
// It is pure: no Kubernetes client, no I/O, no goroutines, not safe for
// concurrent use (the controller serialises calls). Memory is proportional to
// the addresses in use, never to pool sizes: each pool range keeps an ordered
// set of in-use indexes, so a /8 or a /64 costs nothing until used, and
// allocate/release are O(log n) in the number of addresses in use.
package allocator

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/ironlb/ironlb/internal/config"
	"github.com/ironlb/ironlb/internal/service"
	"github.com/ironlb/ironlb/internal/textlimit"
)

// Stats are a pool's address counts per family. Available counts the free
// usable addresses (avoidBuggyIPs removes .0/.255 from the usable set).
// Counts saturate at math.MaxInt64: a /64 alone has 2^64 addresses, more than
// an int64 holds, so its AvailableIPv6 reads math.MaxInt64.
type Stats struct {
	AvailableIPv4, AvailableIPv6 int64
	AssignedIPv4, AssignedIPv6   int64
}

// Allocator holds the pools and who holds which address.
type Allocator struct {
	pools  map[string]*poolState
	spans  []*span // every range of every pool, sorted by first address
	ips    map[netip.Addr]*ipEntry
	allocs map[string]*allocation
	// shared indexes the in-use addresses by their holders' sharing key, so
	// auto-assignment can find a compatible shared address without scanning.
	shared map[string]map[netip.Addr]struct{}
}

type poolState struct {
	name  string
	cfg   *config.Pool
	spans []*span // sorted by first address; IPv4 before IPv6
}

type ipEntry struct {
	span    *span
	holders []string // keys; more than one only when validly shared
}

type allocation struct {
	ips  []netip.Addr // in the request's family order
	pool string
	req  holding
}

// holding is what the allocator keeps of a key's Request: enough to re-check
// sharing and pool eligibility on later calls and SetPools, and no more, as
// it is paid for every address in use.
type holding struct {
	Namespace  string
	Labels     map[string]string
	Pool       string
	SharingKey string
	BackendKey string
	Ports      []Port
}

func holdingOf(r Request) holding {
	return holding{Namespace: r.Namespace, Labels: r.Labels, Pool: r.Pool,
		SharingKey: r.SharingKey, BackendKey: r.BackendKey, Ports: r.Ports}
}

func (h holding) request() Request {
	return Request{Namespace: h.Namespace, Labels: h.Labels, Pool: h.Pool}
}

// New returns an Allocator serving the given pools (keyed by name).
func New(cfg map[string]*config.Pool) *Allocator {
	a := &Allocator{
		ips:    map[netip.Addr]*ipEntry{},
		allocs: map[string]*allocation{},
		shared: map[string]map[netip.Addr]struct{}{},
	}
	a.SetPools(cfg)
	return a
}

// SetPools replaces the pools. Every key keeps its addresses if they are all
// still in one pool it may use (the named pool if it asked for one, a pool
// whose serviceAllocation still matches it, not an avoided .0/.255): a
// restart or a pool edit never moves a valid address. Other keys are released
// and returned, sorted, as lost. Flipping autoAssign off keeps existing
// holders, as MetalLB does; it only stops new automatic picks.
//
// Pool ranges must not overlap (config.Parse guarantees it).
func (a *Allocator) SetPools(pools map[string]*config.Pool) (lost []string) {
	next := map[string]*poolState{}
	var all []*span
	for name, cfg := range pools {
		if cfg == nil {
			continue
		}
		p := &poolState{name: name, cfg: cfg}
		next[name] = p
		for _, r := range cfg.Ranges {
			f, l := r.First.Unmap(), r.Last.Unmap()
			if !f.IsValid() || !l.IsValid() || f.Is4() != l.Is4() || l.Less(f) {
				continue // config.Parse rejects these; never trust them here
			}
			all = append(all, newSpan(p, config.Range{First: f, Last: l}, cfg.AvoidBuggyIPs && f.Is4()))
		}
	}
	// Sorted by first address (IPv4 before IPv6). An overlapping range, which
	// config.Parse rejects, is skipped rather than allowed to hand out one
	// address twice; the tie-break on pool name keeps the choice stable.
	slices.SortFunc(all, func(x, y *span) int {
		if c := x.first.Compare(y.first); c != 0 {
			return c
		}
		return strings.Compare(x.pool.name, y.pool.name)
	})
	var spans []*span
	for _, s := range all {
		if n := len(spans); n > 0 && spans[n-1].v4 == s.v4 && !spans[n-1].last.Less(s.first) {
			continue
		}
		spans = append(spans, s)
		s.pool.spans = append(s.pool.spans, s) // stays sorted
	}

	probe := &Allocator{pools: next, spans: spans}
	for _, key := range slices.Sorted(maps.Keys(a.allocs)) {
		al := a.allocs[key]
		p, err := probe.poolOf(al.ips)
		if err == nil {
			err = poolAllowed(p, al.req.request())
		}
		if err != nil {
			lost = append(lost, key)
			a.release(key)
			continue
		}
		al.pool = p.name
	}
	a.pools, a.spans = next, spans
	for ip, e := range a.ips {
		s := a.spanFor(ip)
		idx, _ := s.index(ip) // every remaining address was just validated
		e.span = s
		s.used.insert(idx)
	}
	return lost
}

// Assign claims exactly ips for key: restoring state from Service status at
// start-up, or re-validating. The addresses must all lie in one pool req may
// use, fit req's families, and be free or validly shareable. Any previous
// allocation of key is replaced; after an error key holds nothing.
func (a *Allocator) Assign(key string, req Request, ips []netip.Addr) (pool string, err error) {
	a.release(key)
	nreq, e := normalize(req)
	if e != nil {
		e.Key = key
		return "", e
	}
	if len(ips) == 0 {
		return "", errorf(ReasonInvalidRequest, key, netip.Addr{}, "", "no addresses to assign")
	}
	seen := map[corev1.IPFamily]int{}
	for _, ip := range ips {
		if !ip.IsValid() || ip.Zone() != "" || ip.Is4In6() {
			return "", errorf(ReasonInvalidRequest, key, ip, "", "invalid address %q", ip)
		}
		f := familyOf(ip)
		if seen[f]++; seen[f] > nreq.Count {
			if nreq.Count == 1 {
				return "", errorf(ReasonFamilyMismatch, key, ip, "", "at most one address per family, got two %s addresses", f)
			}
			return "", errorf(ReasonFamilyMismatch, key, ip, "", "at most %d addresses per family, got more %s addresses", nreq.Count, f)
		}
		if !slices.Contains(nreq.Families, f) {
			return "", errorf(ReasonFamilyMismatch, key, ip, "",
				"address %s does not match the service's ipFamilies %v (policy %s)", ip, nreq.Families, nreq.Policy)
		}
	}
	p, e := a.claim(key, nreq, ips)
	if e != nil {
		return "", e
	}
	return p, nil
}

// Allocate gives key addresses satisfying req. If key already holds
// addresses that satisfy req (right pool, requested IPs, families, sharing),
// they are returned unchanged (a PreferDualStack key holding one family gains
// the other from the same pool when it is free). Otherwise the old addresses
// are freed and key gets the requested IPs, or the first free addresses of the
// best pool: pools whose serviceAllocation matches by priority (1 first, 0
// last), then pools without serviceAllocation, ties broken by pool name.
// Deterministic. After an error key holds nothing.
func (a *Allocator) Allocate(key string, req Request) (ips []netip.Addr, pool string, err error) {
	nreq, e := normalize(req)
	if e != nil {
		a.release(key)
		e.Key = key
		return nil, "", e
	}
	if cur := a.allocs[key]; cur != nil && a.satisfies(key, cur, nreq) {
		a.updateInPlace(key, cur, nreq)
		return slices.Clone(cur.ips), cur.pool, nil
	}
	a.release(key)

	if len(nreq.IPs) > 0 {
		p, e := a.claim(key, nreq, nreq.IPs)
		if e != nil {
			return nil, "", e
		}
		return slices.Clone(a.allocs[key].ips), p, nil
	}

	var candidates []*poolState
	if nreq.Pool != "" {
		p := a.pools[nreq.Pool]
		if p == nil {
			return nil, "", errorf(ReasonUnknownPool, key, netip.Addr{}, nreq.Pool, "pool %q does not exist", nreq.Pool)
		}
		if e := poolAllowed(p, nreq); e != nil {
			e.Key = key
			return nil, "", e
		}
		candidates = []*poolState{p}
	} else {
		candidates = a.autoPools(nreq)
		if len(candidates) == 0 {
			return nil, "", errorf(ReasonNoAvailableIPs, key, netip.Addr{}, "",
				"no available IPs: no pool with autoAssign serves namespace %q and labels %s (pools with serviceAllocation that does not match are not used)",
				nreq.Namespace, textlimit.Quote(labels.Set(nreq.Labels).String()))
		}
	}
	got, p := a.pick(key, nreq, candidates)
	if got == nil {
		names := make([]string, len(candidates))
		for i, c := range candidates {
			names[i] = c.name
		}
		if nreq.Count > 1 {
			// Never a partial result: fewer than Count stays none.
			return nil, "", errorf(ReasonNoAvailableIPs, key, netip.Addr{}, strings.Join(names, ","),
				"no available IPs: %s asks for %d %s addresses (policy %s); no pool of %s has that many free, and none is assigned until one has",
				service.AnnotationAddressCount, nreq.Count, familiesString(nreq.Families), nreq.Policy, strings.Join(names, ", "))
		}
		return nil, "", errorf(ReasonNoAvailableIPs, key, netip.Addr{}, strings.Join(names, ","),
			"no available IPs: no free %s address (policy %s) in pools %s", familiesString(nreq.Families), nreq.Policy, strings.Join(names, ", "))
	}
	a.commit(key, nreq, p, got)
	return slices.Clone(got), p.name, nil
}

// Release frees everything key holds; unknown keys are ignored.
func (a *Allocator) Release(key string) { a.release(key) }

// Allocation returns what key holds.
func (a *Allocator) Allocation(key string) (ips []netip.Addr, pool string, ok bool) {
	al := a.allocs[key]
	if al == nil {
		return nil, "", false
	}
	return slices.Clone(al.ips), al.pool, true
}

// PoolStats returns the counts of pool; zero for an unknown pool.
func (a *Allocator) PoolStats(pool string) Stats {
	p := a.pools[pool]
	if p == nil {
		return Stats{}
	}
	var free4, free6 u128
	var used4, used6 int64
	for _, s := range p.spans {
		n := int64(s.used.Len())
		free := s.sizeSat().sub(u128{0, uint64(n)})
		if s.v4 {
			used4 += n
			free4 = free4.addSat(free)
		} else {
			used6 += n
			free6 = free6.addSat(free)
		}
	}
	return Stats{AvailableIPv4: free4.int64Sat(), AvailableIPv6: free6.int64Sat(), AssignedIPv4: used4, AssignedIPv6: used6}
}

func familiesString(fs []corev1.IPFamily) string {
	parts := make([]string, len(fs))
	for i, f := range fs {
		parts[i] = string(f)
	}
	return strings.Join(parts, "+")
}

// spanFor finds the range holding ip, or nil.
func (a *Allocator) spanFor(ip netip.Addr) *span {
	i, found := slices.BinarySearchFunc(a.spans, ip, func(s *span, ip netip.Addr) int { return s.first.Compare(ip) })
	if !found {
		i-- // the last span starting before ip
	}
	if i < 0 || i >= len(a.spans) || !a.spans[i].contains(ip) {
		return nil
	}
	return a.spans[i]
}

// poolOf returns the single pool holding every address of ips, as usable
// addresses.
func (a *Allocator) poolOf(ips []netip.Addr) (*poolState, *Error) {
	var p *poolState
	for _, ip := range ips {
		s := a.spanFor(ip)
		if s == nil {
			return nil, errorf(ReasonIPNotInPool, "", ip, "", "address %s is not in any pool", ip)
		}
		if _, ok := s.index(ip); !ok {
			return nil, errorf(ReasonIPNotInPool, "", ip, s.pool.name,
				"address %s is not usable: pool %q has avoidBuggyIPs, which excludes .0 and .255 addresses", ip, s.pool.name)
		}
		if p != nil && p != s.pool {
			return nil, errorf(ReasonIPNotInPool, "", ip, s.pool.name,
				"addresses must come from one pool: %s is in pool %q, %s is in pool %q", ips[0], p.name, ip, s.pool.name)
		}
		p = s.pool
	}
	return p, nil
}

// poolAllowed says whether req may hold addresses of p at all (explicitly or
// automatically): the requested pool if any, and a serviceAllocation that
// matches. autoAssign is checked by autoPools only.
func poolAllowed(p *poolState, req Request) *Error {
	if req.Pool != "" && req.Pool != p.name {
		return errorf(ReasonIPNotInPool, "", netip.Addr{}, p.name,
			"address is in pool %q, not in the requested pool %q", p.name, req.Pool)
	}
	if sa := p.cfg.ServiceAllocation; sa != nil && !serviceAllocationMatches(sa, req) {
		return errorf(ReasonPoolNotAllowed, "", netip.Addr{}, p.name,
			"pool %q serviceAllocation does not admit namespace %q with labels %s",
			p.name, req.Namespace, textlimit.Quote(labels.Set(req.Labels).String()))
	}
	return nil
}

// serviceAllocationMatches: namespaces (if restricted) AND one of the
// service selectors (if any).
func serviceAllocationMatches(sa *config.ServiceAllocation, req Request) bool {
	if (len(sa.Namespaces) > 0 || sa.NamespaceSelectorsSet) && !sa.Namespaces.Has(req.Namespace) {
		return false
	}
	if len(sa.ServiceSelectors) == 0 {
		return true
	}
	set := labels.Set(req.Labels)
	for _, sel := range sa.ServiceSelectors {
		if sel != nil && sel.Matches(set) {
			return true
		}
	}
	return false
}

// autoPools lists the pools automatic assignment may use, best first:
// matching serviceAllocation pools by priority (lower first, 0 last), then
// pools without serviceAllocation; equal ranks by name (MetalLB picks at
// random here; being deterministic makes restarts and tests reproducible).
func (a *Allocator) autoPools(req Request) []*poolState {
	var out []*poolState
	for _, p := range a.pools {
		if !p.cfg.AutoAssign || poolAllowed(p, req) != nil {
			continue
		}
		out = append(out, p)
	}
	rank := func(p *poolState) int {
		sa := p.cfg.ServiceAllocation
		switch {
		case sa == nil:
			return 2
		case sa.Priority > 0:
			return 0
		default:
			return 1
		}
	}
	slices.SortFunc(out, func(x, y *poolState) int {
		if c := cmp.Compare(rank(x), rank(y)); c != 0 {
			return c
		}
		if rank(x) == 0 {
			if c := cmp.Compare(x.cfg.ServiceAllocation.Priority, y.cfg.ServiceAllocation.Priority); c != 0 {
				return c
			}
		}
		return strings.Compare(x.name, y.name)
	})
	return out
}

// pick chooses addresses from the first candidate pool that can serve req's
// policy, req.Count per family. PreferDualStack takes the first pool offering
// both families, else the first offering the primary, else the first offering
// the secondary (MetalLB's order).
func (a *Allocator) pick(key string, req Request, pools []*poolState) ([]netip.Addr, *poolState) {
	fams := req.Families
	if len(fams) == 1 {
		for _, p := range pools {
			if ips, ok := a.pickFamily(key, req, p, fams[0]); ok {
				return ips, p
			}
		}
		return nil, nil
	}
	var (
		primary, secondary       []netip.Addr
		primaryPool, secondaryPl *poolState
	)
	for _, p := range pools {
		ips0, ok0 := a.pickFamily(key, req, p, fams[0])
		ips1, ok1 := a.pickFamily(key, req, p, fams[1])
		if ok0 && ok1 {
			return append(ips0, ips1...), p
		}
		if ok0 && primaryPool == nil {
			primary, primaryPool = ips0, p
		}
		if ok1 && secondaryPl == nil {
			secondary, secondaryPl = ips1, p
		}
	}
	if req.Policy != corev1.IPFamilyPolicyPreferDualStack {
		return nil, nil
	}
	if primaryPool != nil {
		return primary, primaryPool
	}
	if secondaryPl != nil {
		return secondary, secondaryPl
	}
	return nil, nil
}

// pickFamily returns the req.Count lowest addresses of family f in pool p
// that req can take, or false when the pool has fewer. Each is the first
// free one or a lower one already held by services req may share with
// (MetalLB walks the pool in order and takes the first address passing its
// sharing check, which is the same choice). The addresses picked are held
// for key while it picks the next, so that they are not picked twice, and
// released before it returns: the caller commits them.
func (a *Allocator) pickFamily(key string, req Request, p *poolState, f corev1.IPFamily) ([]netip.Addr, bool) {
	n := max(req.Count, 1)
	got := make([]netip.Addr, 0, n)
	defer func() {
		for _, ip := range got {
			a.unhold(key, ip, req.SharingKey)
		}
	}()
	for len(got) < n {
		ip, ok := a.pickOne(key, req, p, f, got)
		if !ok {
			return nil, false
		}
		a.hold(key, req, ip)
		got = append(got, ip)
	}
	return slices.Clone(got), true
}

// pickOne is one step of pickFamily: the lowest address it can take that is
// not in taken.
func (a *Allocator) pickOne(key string, req Request, p *poolState, f corev1.IPFamily, taken []netip.Addr) (netip.Addr, bool) {
	v4 := f == corev1.IPv4Protocol
	var best netip.Addr
	for _, s := range p.spans {
		if s.v4 != v4 {
			continue
		}
		if ip, ok := s.firstFree(); ok {
			best = ip
			break
		}
	}
	if req.SharingKey != "" {
		for ip := range a.shared[req.SharingKey] {
			if ip.Is4() != v4 || (best.IsValid() && !ip.Less(best)) || slices.Contains(taken, ip) {
				continue
			}
			if e := a.ips[ip]; e.span.pool != p || a.checkSharing(key, ip, req) != nil {
				continue
			}
			best = ip
		}
	}
	return best, best.IsValid()
}

// satisfies says whether key's current allocation still fits req.
func (a *Allocator) satisfies(key string, cur *allocation, req Request) bool {
	if req.Pool != "" && cur.pool != req.Pool {
		return false
	}
	if len(req.IPs) > 0 {
		if len(req.IPs) != len(cur.ips) {
			return false
		}
		for _, ip := range req.IPs {
			if !slices.Contains(cur.ips, ip) {
				return false
			}
		}
	}
	for _, ip := range cur.ips {
		if !slices.Contains(req.Families, familyOf(ip)) {
			return false
		}
	}
	perFamily := map[corev1.IPFamily]int{}
	for _, ip := range cur.ips {
		perFamily[familyOf(ip)]++
	}
	for _, n := range perFamily {
		if n != req.Count {
			return false
		}
	}
	switch req.Policy {
	case corev1.IPFamilyPolicySingleStack:
		if len(perFamily) != 1 {
			return false
		}
	case corev1.IPFamilyPolicyRequireDualStack:
		if len(perFamily) != 2 {
			return false
		}
	}
	p := a.pools[cur.pool]
	if p == nil || poolAllowed(p, req) != nil {
		return false
	}
	for _, ip := range cur.ips {
		if a.checkSharing(key, ip, req) != nil {
			return false
		}
	}
	return true
}

// updateInPlace records req's new sharing parameters for a satisfied
// allocation (checkSharing allowed them: either key is alone on its
// addresses or nothing sharing-relevant changed), and lets a
// PreferDualStack key holding one family gain the other from its pool.
func (a *Allocator) updateInPlace(key string, cur *allocation, req Request) {
	if cur.req.SharingKey != req.SharingKey {
		for _, ip := range cur.ips {
			a.unindexShared(ip, cur.req.SharingKey)
			a.indexShared(ip, req.SharingKey)
		}
	}
	cur.req = holdingOf(req)
	if req.Policy == corev1.IPFamilyPolicyPreferDualStack && len(req.Families) == 2 && len(cur.ips) == req.Count && len(req.IPs) == 0 {
		missing := otherFamily(familyOf(cur.ips[0]))
		if ips, ok := a.pickFamily(key, req, a.pools[cur.pool], missing); ok {
			for _, ip := range ips {
				a.hold(key, req, ip)
			}
			cur.ips = append(cur.ips, ips...)
			slices.SortStableFunc(cur.ips, func(x, y netip.Addr) int {
				return cmp.Compare(slices.Index(req.Families, familyOf(x)), slices.Index(req.Families, familyOf(y)))
			})
		}
	}
}

// claim validates and takes exactly ips for key (which holds nothing).
func (a *Allocator) claim(key string, req Request, ips []netip.Addr) (string, *Error) {
	p, e := a.poolOf(ips)
	if e == nil {
		e = poolAllowed(p, req)
		switch {
		case e != nil && e.Reason == ReasonIPNotInPool:
			e.Message = fmt.Sprintf("address %s is in pool %q, not in the requested pool %q", ips[0], p.name, req.Pool)
			e.IP = ips[0]
		case e != nil && e.Reason == ReasonPoolNotAllowed:
			// Name the address asked for: the pool alone does not say
			// which request the user has to change.
			e.Message = fmt.Sprintf("requested address %s: %s", ips[0], e.Message)
			e.IP = ips[0]
		}
	}
	if e != nil {
		e.Key = key
		return "", e
	}
	for _, ip := range ips {
		if e := a.checkSharing(key, ip, req); e != nil {
			return "", e
		}
	}
	sorted := slices.Clone(ips)
	slices.SortStableFunc(sorted, func(x, y netip.Addr) int {
		return cmp.Compare(slices.Index(req.Families, familyOf(x)), slices.Index(req.Families, familyOf(y)))
	})
	a.commit(key, req, p, sorted)
	return p.name, nil
}

// commit records key as holder of ips, taking ownership of the slice.
func (a *Allocator) commit(key string, req Request, p *poolState, ips []netip.Addr) {
	for _, ip := range ips {
		a.hold(key, req, ip)
	}
	a.allocs[key] = &allocation{ips: ips, pool: p.name, req: holdingOf(req)}
}

// hold adds key as a holder of ip (already validated).
func (a *Allocator) hold(key string, req Request, ip netip.Addr) {
	e := a.ips[ip]
	if e == nil {
		s := a.spanFor(ip)
		idx, _ := s.index(ip)
		e = &ipEntry{span: s}
		a.ips[ip] = e
		s.used.insert(idx)
		a.indexShared(ip, req.SharingKey)
	}
	e.holders = append(e.holders, key)
}

func (a *Allocator) release(key string) {
	al := a.allocs[key]
	if al == nil {
		return
	}
	delete(a.allocs, key)
	for _, ip := range al.ips {
		a.unhold(key, ip, al.req.SharingKey)
	}
}

// unhold removes key from ip's holders, freeing ip when none is left.
func (a *Allocator) unhold(key string, ip netip.Addr, sharingKey string) {
	e := a.ips[ip]
	if e == nil {
		return
	}
	e.holders = slices.DeleteFunc(e.holders, func(h string) bool { return h == key })
	if len(e.holders) > 0 {
		return
	}
	idx, _ := e.span.index(ip)
	e.span.used.remove(idx)
	delete(a.ips, ip)
	a.unindexShared(ip, sharingKey)
}

func (a *Allocator) indexShared(ip netip.Addr, sk string) {
	if sk == "" {
		return
	}
	m := a.shared[sk]
	if m == nil {
		m = map[netip.Addr]struct{}{}
		a.shared[sk] = m
	}
	m[ip] = struct{}{}
}

func (a *Allocator) unindexShared(ip netip.Addr, sk string) {
	if m := a.shared[sk]; m != nil {
		delete(m, ip)
		if len(m) == 0 {
			delete(a.shared, sk)
		}
	}
}

// checkSharing applies MetalLB's sharing rules for key taking ip: every
// other holder must have the same non-empty sharing key and the same backend
// key, and no (protocol, port) may be used twice. A key alone on its address
// may change its parameters freely.
func (a *Allocator) checkSharing(key string, ip netip.Addr, req Request) *Error {
	e := a.ips[ip]
	if e == nil {
		return nil
	}
	for _, h := range e.holders {
		if h == key {
			continue
		}
		o := a.allocs[h].req
		switch {
		case o.SharingKey == "":
			return errorf(ReasonIPAlreadyInUse, key, ip, e.span.pool.name,
				"address %s is already in use by %s: existing service does not allow sharing", ip, h)
		case req.SharingKey == "":
			return errorf(ReasonIPAlreadyInUse, key, ip, e.span.pool.name,
				"address %s is already in use by %s: new service does not allow sharing (no %s annotation)", ip, h, AnnotationAllowSharedIP)
		case req.SharingKey != o.SharingKey:
			return errorf(ReasonSharingConflict, key, ip, e.span.pool.name,
				"address %s is shared by %s: sharing key %s does not match existing sharing key %s", ip, h, textlimit.Quote(req.SharingKey), textlimit.Quote(o.SharingKey))
		case req.BackendKey != o.BackendKey:
			return errorf(ReasonSharingConflict, key, ip, e.span.pool.name,
				"address %s is shared by %s: backend key %s does not match existing backend key %s (externalTrafficPolicy Local services share only with the same selector)",
				ip, h, textlimit.Quote(req.BackendKey), textlimit.Quote(o.BackendKey))
		}
		for _, p := range req.Ports {
			if slices.Contains(o.Ports, p) {
				return errorf(ReasonSharingConflict, key, ip, e.span.pool.name,
					"port %s is already in use on %s by %s", p, ip, h)
			}
		}
	}
	return nil
}
