package controllers

import (
	"context"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ironlb/ironlb/api/v1beta1"
	"github.com/ironlb/ironlb/internal/allocator"
	"github.com/ironlb/ironlb/internal/config"
	"github.com/ironlb/ironlb/internal/configload"
	"github.com/ironlb/ironlb/internal/service"
)

// AnnotationAllocatedFromPool is written on every Service the controller gave an IP,
// naming the IPAddressPool the IP came from (MetalLB's annotation).
const AnnotationAllocatedFromPool = service.AnnotationIPAllocatedFromPool

// state is what the reconcilers of one controller process share: the last valid
// configuration and the allocator built from it. The allocator is not safe for
// concurrent use, so every call to it happens under mu; the API writes that follow
// a decision happen outside the lock, so Service status writes run in parallel.
type state struct {
	log       logr.Logger
	cache     cache.Cache
	namespace string
	lbClass   string
	metrics   *metrics

	mu sync.Mutex
	// alloc is nil until the first valid configuration with at least one pool,
	// and again while the configuration has no pool (noPools).
	alloc   *allocator.Allocator
	cfg     *config.Config
	noPools bool
	// loader parses the configuration for check (its own lock).
	loader configload.Loader
	// configErr is why the newest configuration was refused ("" when it loaded);
	// the allocator keeps running on the last good one meanwhile. poolErrs are
	// its parts about each IPAddressPool, by pool name.
	configErr string
	poolErrs  map[string]string

	// ready is closed once the first valid configuration is loaded and the
	// allocator was rebuilt from Service status. Service reconciles wait for it,
	// so no event is handled before every existing IP is claimed again.
	ready     chan struct{}
	readyOnce sync.Once

	hooksMu sync.Mutex
	// requeueServices enqueues every Service that may need work (set by the
	// service controller once its queue exists).
	requeueServices func()
	// poolsChanged schedules a status refresh of these pools (set by the pool
	// status controller once its queue exists).
	poolsChanged func(pools []string)
}

func newState(log logr.Logger, c cache.Cache, namespace, lbClass string, m *metrics) *state {
	s := &state{log: log, cache: c, namespace: namespace, lbClass: lbClass, metrics: m, ready: make(chan struct{})}
	s.loader.Metrics = m.k8s
	return s
}

// waitReady blocks until the allocator has been restored from Service status.
func (s *state) waitReady(ctx context.Context) error {
	select {
	case <-s.ready:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// handles reports whether svc is a LoadBalancer Service of our class
// (service.Handles: with no class configured, only Services without
// spec.loadBalancerClass, as MetalLB does).
func (s *state) handles(svc *corev1.Service) bool {
	return service.Handles(svc, s.lbClass)
}

func (s *state) setRequeueServices(f func()) {
	s.hooksMu.Lock()
	s.requeueServices = f
	s.hooksMu.Unlock()
}

func (s *state) setPoolsChanged(f func([]string)) {
	s.hooksMu.Lock()
	s.poolsChanged = f
	s.hooksMu.Unlock()
}

func (s *state) notifyServices() {
	s.hooksMu.Lock()
	f := s.requeueServices
	s.hooksMu.Unlock()
	if f != nil {
		f()
	}
}

func (s *state) notifyPools(pools ...string) {
	s.hooksMu.Lock()
	f := s.poolsChanged
	s.hooksMu.Unlock()
	if f != nil && len(pools) > 0 {
		f(pools)
	}
}

// reload parses the IPAddressPools, L2Advertisements and Namespaces in the cache and,
// when they are valid, makes them the running configuration. The first valid
// configuration also rebuilds the allocator from Service status. An invalid
// configuration is reported (metric, pool conditions, the returned error) and the
// last good one stays in effect.
func (s *state) reload(ctx context.Context) error {
	cfg, err := s.check(ctx)
	if err != nil {
		s.mu.Lock()
		s.configErr = err.Error()
		s.poolErrs = poolProblems(err)
		s.mu.Unlock()
		// Every pool object, not only the running ones: the refused pool is
		// the one whose condition must say why.
		s.notifyPools(s.poolObjectNames(ctx)...)
		return err
	}

	if len(cfg.Pools) == 0 {
		s.loadWithoutPools(cfg)
		return nil
	}

	s.mu.Lock()
	first := s.alloc == nil
	var oldPools []string
	changed := first
	if first {
		if err := s.restoreLocked(ctx, cfg); err != nil {
			s.mu.Unlock()
			return err
		}
	} else {
		oldPools = s.poolNamesLocked()
		// Only pools matter to allocation; advertisements and namespace labels
		// that leave the pools as they were do not need every Service revisited.
		if !reflect.DeepEqual(s.cfg.Pools, cfg.Pools) {
			changed = true
			lost := s.alloc.SetPools(cfg.Pools)
			if len(lost) > 0 {
				s.log.Info("services lost their IPs: no pool contains them any more", "services", lost)
			}
		}
	}
	hadErr := s.configErr != ""
	s.cfg, s.noPools = cfg, false
	s.configErr, s.poolErrs = "", nil
	newPools := s.poolNamesLocked()
	for _, p := range newPools {
		s.metrics.setPoolGauges(p, s.alloc.PoolStats(p))
	}
	s.mu.Unlock()

	for _, p := range oldPools {
		if !slices.Contains(newPools, p) {
			s.metrics.deletePoolGauges(p)
		}
	}
	s.readyOnce.Do(func() { close(s.ready) })
	if changed {
		s.log.Info("configuration loaded", "pools", newPools, "l2Advertisements", len(cfg.L2Advertisements))
		s.notifyServices()
	}
	if changed || hadErr {
		s.notifyPools(append(oldPools, newPools...)...)
	}
	return nil
}

// loadWithoutPools makes cfg, which has no IPAddressPool at all, the running
// configuration. That is what a controller sees when it starts before the pools
// are applied (a fresh install, a migration from MetalLB, a restore from backup) or
// when every pool was deleted: refusing every IP Services show would move them all
// once the pools come back. So the allocator is dropped, Services are left exactly
// as they are (the service reconciler writes nothing while alloc is nil) and
// nothing is allocated; the next configuration with pools rebuilds the allocator
// from Service status, as at start-up.
func (s *state) loadWithoutPools(cfg *config.Config) {
	s.mu.Lock()
	oldPools := s.poolNamesLocked()
	wasFrozen := s.noPools
	s.alloc, s.cfg, s.noPools = nil, cfg, true
	s.configErr, s.poolErrs = "", nil
	s.mu.Unlock()
	for _, p := range oldPools {
		s.metrics.deletePoolGauges(p)
	}
	s.readyOnce.Do(func() { close(s.ready) })
	if !wasFrozen {
		s.log.Info("configuration has no IPAddressPool: services keep the IPs they show and nothing is allocated until a pool exists",
			"l2Advertisements", len(cfg.L2Advertisements))
	}
	s.notifyPools(oldPools...)
}

// check loads the configuration in the cache (configload: parsed only when
// it changed; it sets config_loaded_bool, config_stale_bool and
// update_errors_total), without applying it. Every replica runs it; reload,
// on the leader, applies the result.
func (s *state) check(ctx context.Context) (*config.Config, error) {
	// Not logged here: configReconciler logs the refusal, reload the load.
	cfg, problem, err := s.loader.Read(ctx, logr.Discard(), s.cache, s.namespace, true)
	switch {
	case err != nil:
		return nil, err
	case problem != nil:
		return nil, fmt.Errorf("invalid configuration: %w", problem)
	}
	return cfg, nil
}

func (s *state) poolNamesLocked() []string {
	if s.cfg == nil {
		return nil
	}
	names := make([]string, 0, len(s.cfg.Pools))
	for n := range s.cfg.Pools {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// restoreLocked builds the allocator for cfg and claims, before anything is
// allocated, every IP that existing Services already show in their status, so a
// restart or a leader change never moves an IP. Services are visited oldest first:
// if two of them claim the same address without being allowed to share it, the
// older one keeps it and the newer one is given a new address by its reconcile.
func (s *state) restoreLocked(ctx context.Context, cfg *config.Config) error {
	start := time.Now()
	inf, err := s.cache.GetInformer(ctx, &corev1.Service{}, cache.BlockUntilSynced(true))
	if err != nil {
		return fmt.Errorf("starting the Service informer: %w", err)
	}
	if !toolscache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return fmt.Errorf("waiting for the Service cache to sync: %w", ctx.Err())
	}
	var svcs corev1.ServiceList
	// Read-only use: skip the cache's deep copy of every Service of the cluster.
	if err := s.cache.List(ctx, &svcs, client.UnsafeDisableDeepCopy); err != nil {
		return fmt.Errorf("listing Services: %w", err)
	}
	items := svcs.Items
	sort.Slice(items, func(i, j int) bool {
		ti, tj := items[i].CreationTimestamp, items[j].CreationTimestamp
		if !ti.Equal(&tj) {
			return ti.Before(&tj)
		}
		if items[i].Namespace != items[j].Namespace {
			return items[i].Namespace < items[j].Namespace
		}
		return items[i].Name < items[j].Name
	})

	a := allocator.New(cfg.Pools)
	restored, refused := 0, 0
	for i := range items {
		svc := &items[i]
		if !s.handles(svc) {
			continue
		}
		// An entry that does not parse cannot be held; the others are, so no
		// other Service is given them. The reconcile rewrites the status.
		ips, _ := service.IngressIPs(svc)
		if len(ips) == 0 {
			continue
		}
		key := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}.String()
		req, _, err := allocator.ParseService(svc)
		if err != nil {
			// The Service's annotations became unparsable while we were away. Its
			// IPs must still be held, or another Service could be given them;
			// its reconcile reports the annotation.
			req = fallbackRequest(svc, ips)
		}
		if _, err := a.Assign(key, req, ips); err != nil {
			refused++
			s.log.Info("cannot keep the IPs in the service's status; its reconcile will pick new ones",
				"service", key, "ips", ips, "reason", err.Error())
			continue
		}
		restored++
	}
	s.alloc = a
	s.log.Info("allocator rebuilt from service status", "services", len(items), "restored", restored,
		"refused", refused, "duration", time.Since(start).String())
	return nil
}

// fallbackRequest describes svc from its spec alone, for Services whose
// annotations no longer parse: enough to re-claim the IPs it already shows.
func fallbackRequest(svc *corev1.Service, ips []netip.Addr) allocator.Request {
	req := allocator.Request{
		Namespace: svc.Namespace,
		Labels:    svc.Labels,
		Families:  svc.Spec.IPFamilies,
		IPs:       ips,
	}
	if svc.Spec.IPFamilyPolicy != nil {
		req.Policy = *svc.Spec.IPFamilyPolicy
	}
	for _, p := range svc.Spec.Ports {
		req.Ports = append(req.Ports, allocator.Port{Protocol: p.Protocol, Port: p.Port})
	}
	return req
}

// inAnyPoolLocked reports whether ip lies in a range of the running configuration.
func (s *state) inAnyPoolLocked(ip netip.Addr) bool {
	return s.cfg.PoolFor([]netip.Addr{ip}) != ""
}

// poolObjectNames lists the IPAddressPool objects in the cache, valid or not.
func (s *state) poolObjectNames(ctx context.Context) []string {
	var pools v1beta1.IPAddressPoolList
	if err := s.cache.List(ctx, &pools, client.InNamespace(s.namespace)); err != nil {
		return nil
	}
	names := make([]string, len(pools.Items))
	for i := range pools.Items {
		names[i] = pools.Items[i].Name
	}
	return names
}

// poolProblems collects, per IPAddressPool name, the messages of the parser's
// field errors about it (Parse joins one *config.FieldError per problem).
func poolProblems(err error) map[string]string {
	out := map[string]string{}
	var walk func(error)
	walk = func(err error) {
		// Walk the whole tree by hand: errors.As would stop at the first FieldError.
		if fe, ok := err.(*config.FieldError); ok { //nolint:errorlint // see above
			if fe.Kind == "IPAddressPool" {
				if out[fe.Name] != "" {
					out[fe.Name] += "; "
				}
				out[fe.Name] += fe.Error()
			}
			return
		}
		switch u := err.(type) { //nolint:errorlint // walks the tree itself
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				walk(e)
			}
		case interface{ Unwrap() error }:
			walk(u.Unwrap())
		}
	}
	walk(err)
	return out
}
