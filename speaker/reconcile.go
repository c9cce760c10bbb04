package speaker

import (
	"context"
	"fmt"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/ironlb/ironlb/api/v1beta1"
	"github.com/ironlb/ironlb/internal/config"
	"github.com/ironlb/ironlb/internal/configload"
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
