package speaker

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/ironlb/ironlb/api/v1beta1"
	"github.com/ironlb/ironlb/internal/config"
	"github.com/ironlb/ironlb/internal/k8smetrics"
)

type eventUpdate = event.UpdateEvent

// Event reasons on the Service. nodeAssigned and announceFailed are MetalLB's.
const (
	EventNodeAssigned     = "nodeAssigned"
	EventAnnounceFailed   = "announceFailed"
	EventAddressConflict  = "AddressConflict"
	EventKernelAnswersARP = "KernelAnswersARP"
)

// cfgState is the last parsed configuration, re-parsed only when what it is
// parsed from changed: a pool's or advertisement's name or spec, or a pool's
// labels (advertisements select pools by them).
type cfgState struct {
	mu  sync.Mutex
	key string
	cfg *config.Config
	// problem is why the last parse failed; nil when it succeeded.
	problem error
	// sums caches each object's content fingerprint by resourceVersion: the
	// controller rewrites a pool's status with every allocation, and each of
	// those must cost neither a parse nor a fresh fingerprint.
	sums map[string]objectSum
}

// objectSum is an object's content fingerprint at one resourceVersion.
type objectSum struct{ resourceVersion, sum string }

// serviceReconciler turns each Service (with its EndpointSlices, the Nodes
// and the configuration) into an Input for the ownership layer. It decides
// nothing and writes nothing: ownership and the announcer act at once, the
// status writer follows.
type serviceReconciler struct {
	client.Client
	log  logr.Logger
	opts Options
	own  *owners
	cfg  cfgState
	// indexed: the cache has the indexService index (always in Run; tests
	// with a plain client select by labels instead).
	indexed bool
}

// allServices lists every LoadBalancer Service in the cache as requests.
func (r *serviceReconciler) allServices(ctx context.Context) []reconcile.Request {
	var svcs corev1.ServiceList
	if err := r.List(ctx, &svcs, client.UnsafeDisableDeepCopy); err != nil {
		r.log.Error(err, "listing services to recompute their inputs")
		return nil
	}
	out := make([]reconcile.Request, 0, len(svcs.Items))
	for i := range svcs.Items {
		if svcs.Items[i].Spec.Type == corev1.ServiceTypeLoadBalancer {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&svcs.Items[i])})
		}
	}
	return out
}

// indexService indexes EndpointSlices and ServiceL2Status objects by the
// namespace/name of their Service, so a reconcile finds them without scanning
// every object (the label selector path is O(objects) per reconcile).
const indexService = "ironlb.speaker.service"

// setupIndexes registers indexService on the manager's cache.
func setupIndexes(ctx context.Context, idx client.FieldIndexer) error {
	if err := idx.IndexField(ctx, &discoveryv1.EndpointSlice{}, indexService, func(o client.Object) []string {
		if k, ok := serviceKeyFromSlice(o); ok {
			return []string{k.String()}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("index EndpointSlices by service: %w", err)
	}
	if err := idx.IndexField(ctx, &v1beta1.ServiceL2Status{}, indexService, func(o client.Object) []string {
		if k, ok := serviceKeyFromLabels(o); ok {
			return []string{k.String()}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("index ServiceL2Status by service: %w", err)
	}
	return nil
}

// snapshot gathers the cluster-wide inputs from the cache.
func (r *serviceReconciler) snapshot(ctx context.Context) (Snapshot, error) {
	cfg, err := r.config(ctx)
	if err != nil {
		return Snapshot{}, err
	}
	var nodes corev1.NodeList
	if err := r.List(ctx, &nodes, client.UnsafeDisableDeepCopy); err != nil {
		return Snapshot{}, fmt.Errorf("list nodes: %w", err)
	}
	s := Snapshot{
		Config:            cfg,
		Nodes:             make(map[string]*corev1.Node, len(nodes.Items)),
		Self:              r.opts.NodeName,
		LoadBalancerClass: r.opts.LoadBalancerClass,
		IgnoreExcludeLB:   r.opts.IgnoreExcludeLB,
	}
	for i := range nodes.Items {
		s.Nodes[nodes.Items[i].Name] = &nodes.Items[i]
	}
	return s, nil
}

// config returns the parsed configuration, re-parsing only when a pool or
// advertisement changed. An invalid configuration is logged and the last
// valid one kept, as MetalLB's speaker does.
func (r *serviceReconciler) config(ctx context.Context) (*config.Config, error) {
	var pools v1beta1.IPAddressPoolList
	var ads v1beta1.L2AdvertisementList
	// No deep copies: config.Parse does not modify its arguments.
	if err := r.List(ctx, &pools, client.InNamespace(r.opts.Namespace), client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("list IPAddressPools: %w", err)
	}
	if err := r.List(ctx, &ads, client.InNamespace(r.opts.Namespace), client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("list L2Advertisements: %w", err)
	}
	return r.cfg.load(r.log, pools.Items, ads.Items), nil
}

// configProblem is the speaker's verdict for its ConfigurationState: why the
// current pools and advertisements do not parse (nil: they do); err when
// they cannot be read.
func (r *serviceReconciler) configProblem(ctx context.Context) (problem, err error) {
	if _, err := r.config(ctx); err != nil {
		return nil, err
	}
	r.cfg.mu.Lock()
	defer r.cfg.mu.Unlock()
	return r.cfg.problem, nil
}

// load parses pools and advertisements, unless their content is what was
// parsed last time, and returns the configuration in effect. A failed parse
// counts as an update error and, while an older configuration stays in use,
// sets metallb_k8s_client_config_stale_bool; a good one sets
// config_loaded_bool and clears stale.
func (s *cfgState) load(log logr.Logger, pools []v1beta1.IPAddressPool, ads []v1beta1.L2Advertisement) *config.Config {
	s.mu.Lock()
	defer s.mu.Unlock()
	key := s.keyLocked(pools, ads)
	if key == s.key {
		return s.cfg
	}
	// Namespaces only resolve serviceAllocation selectors, which the speaker
	// does not use; nil keeps the speaker's RBAC and cache smaller.
	cfg, err := config.Parse(pools, ads, nil)
	s.key = key
	if err != nil {
		k8smetrics.UpdateErrors.Inc()
		if s.cfg != nil {
			k8smetrics.ConfigStale.Set(1)
		}
		if s.problem == nil || err.Error() != s.problem.Error() {
			log.Error(err, "invalid configuration; keeping the last valid one", "haveValid", s.cfg != nil)
		}
		s.problem = err
		return s.cfg
	}
	s.problem = nil
	s.cfg = cfg
	k8smetrics.ConfigLoaded.Set(1)
	k8smetrics.ConfigStale.Set(0)
	log.Info("configuration loaded", "pools", len(cfg.Pools), "l2Advertisements", len(cfg.L2Advertisements))
	return cfg
}

// keyLocked fingerprints what the configuration is parsed from, reusing the
// fingerprint of every object whose resourceVersion has not changed.
func (s *cfgState) keyLocked(pools []v1beta1.IPAddressPool, ads []v1beta1.L2Advertisement) string {
	next := make(map[string]objectSum, len(pools)+len(ads))
	add := func(id string, m metav1.Object, content any) {
		o, ok := s.sums[id]
		if !ok || o.resourceVersion != m.GetResourceVersion() || o.resourceVersion == "" {
			raw, _ := json.Marshal(content) // plain API types: cannot fail
			h := sha256.Sum256(raw)
			o = objectSum{resourceVersion: m.GetResourceVersion(), sum: hex.EncodeToString(h[:16])}
		}
		next[id] = o
	}
	for i := range pools {
		p := &pools[i]
		add("p/"+p.Name, p, struct {
			Labels map[string]string
			Spec   v1beta1.IPAddressPoolSpec
		}{p.Labels, p.Spec})
	}
	for i := range ads {
		add("a/"+ads[i].Name, &ads[i], ads[i].Spec)
	}
	s.sums = next
	// In name order: the cache lists objects in no stable order, and a key
	// that followed it would re-parse on almost every reconcile (6,600
	// parses per speaker while 5,000 Services were created).
	var b strings.Builder
	for _, id := range slices.Sorted(maps.Keys(next)) {
		fmt.Fprintf(&b, "%s/%s;", id, next[id].sum)
	}
	return b.String()
}

// Reconcile computes one Service's Input; it counts in
// metallb_k8s_client_updates_total and, on error, update_errors_total.
func (r *serviceReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	k8smetrics.Updates.Inc()
	err := r.reconcile(ctx, req)
	if err != nil {
		k8smetrics.UpdateErrors.Inc()
	}
	return reconcile.Result{}, err
}

func (r *serviceReconciler) reconcile(ctx context.Context, req reconcile.Request) error {
	select {
	case <-ctx.Done():
		// Shutting down: keep what is announced until the announcer stops
		// after the memberlist leave.
		return nil
	default:
	}
	key := req.String()
	svc, eps, err := r.service(ctx, req.NamespacedName)
	if err != nil {
		return err
	}
	if svc == nil {
		r.own.SetService(key, Input{Reason: ReasonServiceDeleted}, nil)
		return nil
	}
	snap, err := r.snapshot(ctx)
	if err != nil {
		return err
	}
	r.own.SetService(key, Inputs(snap, svc, eps), svc)
	return nil
}

// service reads a Service and its EndpointSlices from the cache; nil when
// the Service does not exist.
func (r *serviceReconciler) service(ctx context.Context, key types.NamespacedName) (*corev1.Service, []*discoveryv1.EndpointSlice, error) {
	svc := &corev1.Service{}
	if err := r.Get(ctx, key, svc); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil, nil
		}
		return nil, nil, err
	}
	var list discoveryv1.EndpointSliceList
	sel := []client.ListOption{client.InNamespace(key.Namespace), client.MatchingLabels{discoveryv1.LabelServiceName: key.Name}}
	if r.indexed {
		sel = []client.ListOption{client.InNamespace(key.Namespace), client.MatchingFields{indexService: key.String()}}
	}
	if err := r.List(ctx, &list, sel...); err != nil {
		return nil, nil, fmt.Errorf("list EndpointSlices of %s: %w", key, err)
	}
	eps := make([]*discoveryv1.EndpointSlice, 0, len(list.Items))
	for i := range list.Items {
		eps = append(eps, &list.Items[i])
	}
	return svc, eps, nil
}
