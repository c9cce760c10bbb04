package speaker

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/ironlb/ironlb/api/v1beta1"
	"github.com/ironlb/ironlb/internal/config"
	"github.com/ironlb/ironlb/internal/configload"
	"github.com/ironlb/ironlb/internal/election"
	"github.com/ironlb/ironlb/internal/k8smetrics"
)

// serviceReconciler turns each Service (with its EndpointSlices, the Nodes
// and the configuration) into an Input for the ownership layer. It decides
// nothing and writes nothing: ownership and the announcer act at once, the
// status writer follows.
type serviceReconciler struct {
	client.Client
	log  logr.Logger
	opts Options
	own  *owners
	// k8s are the metallb_k8s_client_* metrics (newMetrics).
	k8s *k8smetrics.Metrics
	// cfg loads the configuration (Namespaces not read: the speaker does
	// not use serviceAllocation); its Metrics are k8s.
	cfg configload.Loader
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

// setupIndexes registers indexService on the manager's cache (and on the
// tests' clients): the reconcilers list by it and by nothing else.
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

// config returns the configuration in effect (configload: re-parsed only
// when a pool or advertisement changed; an invalid one is logged and the
// last valid one kept, as MetalLB's speaker does).
func (r *serviceReconciler) config(ctx context.Context) (*config.Config, error) {
	cfg, _, err := r.cfg.Read(ctx, r.log, r, r.opts.Namespace, false)
	return cfg, err
}

// configProblem is the speaker's verdict for its ConfigurationState: why the
// current pools and advertisements do not parse (nil: they do); err when
// they cannot be read.
func (r *serviceReconciler) configProblem(ctx context.Context) (problem, err error) {
	_, problem, err = r.cfg.Read(ctx, r.log, r, r.opts.Namespace, false)
	return problem, err
}

// Reconcile computes one Service's Input; it counts in
// metallb_k8s_client_updates_total and, on error, update_errors_total.
func (r *serviceReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	r.k8s.Updates.Inc()
	err := r.reconcile(ctx, req)
	if err != nil {
		r.k8s.UpdateErrors.Inc()
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
	if self := snap.Nodes[snap.Self]; self != nil {
		r.own.RequestRebalance(self.Annotations[election.RebalanceAnnotation], time.Now())
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
	if err := r.List(ctx, &list, client.InNamespace(key.Namespace), client.MatchingFields{indexService: key.String()}); err != nil {
		return nil, nil, fmt.Errorf("list EndpointSlices of %s: %w", key, err)
	}
	eps := make([]*discoveryv1.EndpointSlice, 0, len(list.Items))
	for i := range list.Items {
		eps = append(eps, &list.Items[i])
	}
	return svc, eps, nil
}

// answers reports whether this speaker can answer for the IPs it owns, as
// far as it knows: once its caches are synced, only with a valid
// configuration (the last one that parsed). Before, it does not know yet and
// says it does, as a speaker of the previous release: a starting speaker is
// placeable as before, and one that finds no valid configuration says so as
// soon as its caches tell it.
func (r *serviceReconciler) answers(ctx context.Context, cacheSynced *atomic.Bool) bool {
	if !cacheSynced.Load() {
		return true
	}
	cfg, err := r.config(ctx)
	return err != nil || cfg != nil
}

// serviceKeyFromLabels maps a ServiceL2Status to its Service.
func serviceKeyFromLabels(o client.Object) (types.NamespacedName, bool) {
	l := o.GetLabels()
	ns, name := l[v1beta1.ServiceL2StatusServiceNamespaceLabel], l[v1beta1.ServiceL2StatusServiceNameLabel]
	return types.NamespacedName{Namespace: ns, Name: name}, ns != "" && name != ""
}

// serviceKeyFromSlice maps an EndpointSlice to its Service.
func serviceKeyFromSlice(o client.Object) (types.NamespacedName, bool) {
	name := o.GetLabels()[discoveryv1.LabelServiceName]
	return types.NamespacedName{Namespace: o.GetNamespace(), Name: name}, name != ""
}

func (r *serviceReconciler) setup(mgr ctrl.Manager) error {
	one := func(f func(client.Object) (types.NamespacedName, bool)) handler.EventHandler {
		return handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			if k, ok := f(o); ok {
				return []reconcile.Request{{NamespacedName: k}}
			}
			return nil
		})
	}
	all := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, _ client.Object) []reconcile.Request {
		return r.allServices(ctx)
	})
	return ctrl.NewControllerManagedBy(mgr).Named("speaker-services").
		For(&corev1.Service{}).
		Watches(&discoveryv1.EndpointSlice{}, one(serviceKeyFromSlice)).
		Watches(&corev1.Node{}, all, builder.WithPredicates(nodeChanged())).
		// Not on status updates: the controller rewrites a pool's status
		// with every allocation, and each would re-queue every Service on
		// every speaker (5,000 Services: ~90 config parses a second each).
		Watches(&v1beta1.IPAddressPool{}, all, builder.WithPredicates(configload.PoolChanged())).
		Watches(&v1beta1.L2Advertisement{}, all, builder.WithPredicates(configload.AdvertisementChanged())).
		WithOptions(controller.Options{MaxConcurrentReconciles: 4}).
		Complete(r)
}

// nodeChanged passes Node events that can change which nodes are eligible:
// labels (node selectors, exclude label), the drain and rebalance
// annotations and the NetworkUnavailable condition, not the heartbeat-driven status churn. (Without memberlist the
// Ready condition is liveness: readyNodes follows it.)
func nodeChanged() predicate.Predicate {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, ok1 := e.ObjectOld.(*corev1.Node)
			n, ok2 := e.ObjectNew.(*corev1.Node)
			if !ok1 || !ok2 {
				return true
			}
			return !labels.Equals(o.Labels, n.Labels) || election.NetworkUnavailable(o) != election.NetworkUnavailable(n) ||
				election.Drained(o) != election.Drained(n) ||
				o.Annotations[election.RebalanceAnnotation] != n.Annotations[election.RebalanceAnnotation]
		},
	}
}

// exclusions computes, from the cache, why each node may not announce each
// of services (Exclusions), reading the cluster-wide inputs once.
func (r *serviceReconciler) exclusions(ctx context.Context, services []string) map[string]map[string]string {
	snap, err := r.snapshot(ctx)
	if err != nil {
		r.log.V(1).Info("status: cannot read the configuration and nodes", "error", err.Error())
		return nil
	}
	out := make(map[string]map[string]string, len(services))
	for _, name := range services {
		ns, n, _ := cutKey(name)
		svc, eps, err := r.service(ctx, types.NamespacedName{Namespace: ns, Name: n})
		if err != nil || svc == nil {
			continue
		}
		if ex := Exclusions(snap, svc, eps); len(ex) > 0 {
			out[name] = ex
		}
	}
	return out
}
