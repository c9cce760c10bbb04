package controllers

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrl "sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/ironlb/ironlb/internal/allocator"
	"github.com/ironlb/ironlb/internal/service"
)

// serviceReconciler gives LoadBalancer Services of our class an IP and mirrors the
// allocator's decision into status.loadBalancer.ingress and the
// metallb.io/ip-allocated-from-pool annotation. It reads from the cache, decides
// under the state lock and writes only what differs.
type serviceReconciler struct {
	client client.Client
	state  *state
	events *onChangeRecorder
}

// +kubebuilder:rbac:groups="",resources=services,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups="",resources=services/status,verbs=get;update;patch
// +kubebuilder:rbac:groups="";events.k8s.io,resources=events,verbs=create;patch

func (r *serviceReconciler) setup(mgr manager.Manager, workers int) error {
	return builder.ControllerManagedBy(mgr).
		Named("service").
		For(&corev1.Service{}).
		// The queue is captured so a configuration change can revisit every
		// Service without listing them through the API server.
		WatchesRawSource(source.Func(func(_ context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
			r.state.setRequeueServices(func() { r.enqueueAll(q) })
			return nil
		})).
		WithOptions(ctrl.Options{MaxConcurrentReconciles: workers, SkipNameValidation: ptr.To(true)}).
		Complete(r)
}

// enqueueAll queues every Service that is, or was, a LoadBalancer we may own.
func (r *serviceReconciler) enqueueAll(q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	var svcs corev1.ServiceList
	if err := r.state.cache.List(context.Background(), &svcs, client.UnsafeDisableDeepCopy); err != nil {
		r.state.log.Error(err, "cannot list services to revisit them after a configuration change")
		return
	}
	for i := range svcs.Items {
		svc := &svcs.Items[i]
		if svc.Spec.Type == corev1.ServiceTypeLoadBalancer || wroteState(svc) {
			q.Add(reconcile.Request{NamespacedName: types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}})
		}
	}
}

// wroteState reports whether svc carries anything this controller writes.
func wroteState(svc *corev1.Service) bool {
	_, ok := svc.Annotations[AnnotationAllocatedFromPool]
	return ok || len(svc.Status.LoadBalancer.Ingress) > 0
}

func (r *serviceReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	if err := r.state.waitReady(ctx); err != nil {
		return reconcile.Result{}, err
	}
	r.state.metrics.k8s.Updates.Inc()
	err := r.reconcile(ctx, req)
	if errors.Is(err, errStale) {
		logr.FromContextOrDiscard(ctx).V(1).Info("service changed since it was read; its newer version will be reconciled")
		return reconcile.Result{}, nil
	}
	if err != nil {
		r.state.metrics.k8s.UpdateErrors.Inc()
	}
	return reconcile.Result{}, err
}

func (r *serviceReconciler) reconcile(ctx context.Context, req reconcile.Request) error {
	log := logr.FromContextOrDiscard(ctx)
	key := req.String()

	var svc corev1.Service
	if err := r.client.Get(ctx, req.NamespacedName, &svc); err != nil {
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("getting service %s: %w", key, err)
		}
		if pool, had := r.release(key); had {
			log.Info("service deleted, IP released", "pool", pool)
		}
		r.events.forget(key)
		return nil
	}

	if !r.state.handles(&svc) {
		pool, had := r.release(key)
		r.events.forget(key)
		if svc.Spec.Type == corev1.ServiceTypeLoadBalancer {
			// Another class: another load balancer implementation owns its status.
			return nil
		}
		if had {
			log.Info("service is no longer of type LoadBalancer, IP released", "pool", pool, "type", svc.Spec.Type)
		}
		if wroteState(&svc) {
			return r.writeState(ctx, &svc, nil, "")
		}
		return nil
	}

	// Decide under the lock; write afterwards.
	want, warnings, parseErr := allocator.ParseService(&svc)
	for _, w := range warnings {
		r.events.emit(key, &svc, corev1.EventTypeWarning, w.Reason, "Parse", w.Message)
	}
	if parseErr != nil {
		// Keep whatever the Service holds: a typo in an annotation must not take
		// a working IP away. The event names the annotation and the value.
		r.events.emit(key, &svc, corev1.EventTypeWarning, ReasonAllocationFailed, "Allocate",
			fmt.Sprintf("Failed to allocate IP for %q: %s", key, parseErr))
		log.Info("cannot parse service", "reason", parseErr.Error())
		return nil
	}

	r.state.mu.Lock()
	if r.state.alloc == nil {
		// No pool configured (see state.loadWithoutPools): whatever the Service
		// shows stays, and nothing is allocated until a pool exists.
		r.state.mu.Unlock()
		return nil
	}
	_, prevPool, _ := r.state.alloc.Allocation(key)
	_, _, allocErr := r.state.alloc.Allocate(key, want)
	ips, pool, has := r.state.alloc.Allocation(key)
	touched := poolsOf(prevPool, pool)
	for _, p := range touched {
		r.state.metrics.setPoolGauges(p, r.state.alloc.PoolStats(p))
	}
	old, _ := service.IngressIPs(&svc) // entries that do not parse are rewritten
	var withdrawn []netip.Addr
	for _, ip := range old {
		if !slices.Contains(ips, ip) && !r.state.inAnyPoolLocked(ip) {
			withdrawn = append(withdrawn, ip)
		}
	}
	r.state.mu.Unlock()
	if prevPool != pool || !sameIPs(old, ips) {
		r.state.notifyPools(touched...)
	}

	if allocErr != nil {
		reason := allocErr.Error()
		var aerr *allocator.Error
		if errors.As(allocErr, &aerr) {
			log = log.WithValues("reason", aerr.Reason)
		}
		r.events.emit(key, &svc, corev1.EventTypeWarning, ReasonAllocationFailed, "Allocate",
			fmt.Sprintf("Failed to allocate IP for %q: %s", key, reason))
		r.events.reset(key, ReasonIPAllocated)
		log.Info("allocation failed", "error", reason)
	} else {
		r.events.reset(key, ReasonAllocationFailed)
	}
	if len(withdrawn) > 0 {
		msg := fmt.Sprintf("IP %s is no longer in any IPAddressPool and was withdrawn", service.JoinIPs(withdrawn, ", "))
		if has {
			msg += fmt.Sprintf("; assigned %s from pool %q instead", service.JoinIPs(ips, ", "), pool)
		}
		r.events.emit(key, &svc, corev1.EventTypeWarning, ReasonIPWithdrawn, "Allocate", msg)
	}
	if !has {
		ips, pool = nil, ""
	}
	// Announce only a change of what the Service shows; a restart that finds the
	// status already right stays silent.
	changed := !sameIPs(old, ips) || svc.Annotations[AnnotationAllocatedFromPool] != pool
	if err := r.writeState(ctx, &svc, ips, pool); err != nil {
		return err
	}
	if has && changed {
		r.events.emit(key, &svc, corev1.EventTypeNormal, ReasonIPAllocated, "Allocate",
			fmt.Sprintf("Assigned IP %s from pool %q", quoteIPs(ips), pool))
		log.Info("service IP allocated", "ips", ips, "pool", pool)
	}
	return nil
}

// release frees key's IPs, if it held any, and reports the pool they came from.
func (r *serviceReconciler) release(key string) (string, bool) {
	r.state.mu.Lock()
	if r.state.alloc == nil {
		r.state.mu.Unlock()
		return "", false
	}
	_, pool, had := r.state.alloc.Allocation(key)
	if had {
		r.state.alloc.Release(key)
		r.state.metrics.setPoolGauges(pool, r.state.alloc.PoolStats(pool))
	}
	r.state.mu.Unlock()
	if had {
		r.state.notifyPools(pool)
	}
	return pool, had
}

// writeState makes svc's status and pool annotation say ips/pool (nothing when ips
// is empty), writing only if they differ. Both go in one request to the status
// subresource, which for Services also stores metadata changes; if the API server
// ever stops doing that, a second patch writes the annotation.
//
// The status is written with an update (PUT), not a merge patch: the API server
// then decodes the object instead of encoding the stored one to JSON, patching and
// decoding it again. svc comes from the cache, so its resourceVersion guards the
// update: a conflict (errStale) means the cache is behind, and the newer version's
// watch event queues this Service again. MetalLB's controller writes status the
// same way.
func (r *serviceReconciler) writeState(ctx context.Context, svc *corev1.Service, ips []netip.Addr, pool string) error {
	want := make([]corev1.LoadBalancerIngress, 0, len(ips))
	for _, ip := range ips {
		want = append(want, corev1.LoadBalancerIngress{IP: ip.String(), IPMode: ptr.To(corev1.LoadBalancerIPModeVIP)})
	}
	statusOK := ingressEqual(svc.Status.LoadBalancer.Ingress, want)
	annoOK := svc.Annotations[AnnotationAllocatedFromPool] == pool
	if _, present := svc.Annotations[AnnotationAllocatedFromPool]; pool == "" && present {
		annoOK = false
	}
	if statusOK && annoOK {
		return nil
	}
	key := client.ObjectKeyFromObject(svc).String()
	if !statusOK {
		setPoolAnnotation(svc, pool)
		if len(want) == 0 {
			svc.Status.LoadBalancer = corev1.LoadBalancerStatus{}
		} else {
			svc.Status.LoadBalancer.Ingress = want
		}
		if err := r.client.Status().Update(ctx, svc); err != nil {
			if apierrors.IsNotFound(err) {
				return nil // deleted meanwhile; the delete event releases it
			}
			if apierrors.IsConflict(err) {
				return errStale
			}
			return fmt.Errorf("writing status.loadBalancer of service %s: %w", key, err)
		}
		if got, present := svc.Annotations[AnnotationAllocatedFromPool]; got == pool && (pool != "" || !present) {
			return nil
		}
	}
	// Only the annotation differs, or the status write did not keep it: a merge
	// patch of the annotation alone.
	orig := svc.DeepCopy()
	setPoolAnnotation(svc, pool)
	if err := r.client.Patch(ctx, svc, client.MergeFrom(orig)); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("writing annotation %s of service %s: %w", AnnotationAllocatedFromPool, key, err)
	}
	return nil
}

// errStale is writeState's report that the Service changed since the cache copy
// it was given; the reconcile of the newer version writes instead.
var errStale = errors.New("service changed since it was read")

func setPoolAnnotation(svc *corev1.Service, pool string) {
	if pool == "" {
		delete(svc.Annotations, AnnotationAllocatedFromPool)
		return
	}
	if svc.Annotations == nil {
		svc.Annotations = map[string]string{}
	}
	svc.Annotations[AnnotationAllocatedFromPool] = pool
}

func ingressEqual(have, want []corev1.LoadBalancerIngress) bool {
	if len(have) != len(want) {
		return false
	}
	for i := range have {
		h, w := have[i], want[i]
		if h.IP != w.IP || h.Hostname != "" || len(h.Ports) != 0 || !ptr.Equal(h.IPMode, w.IPMode) {
			return false
		}
	}
	return true
}

func poolsOf(a, b string) []string {
	var out []string
	for _, p := range []string{a, b} {
		if p != "" && !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out
}

func sameIPs(a, b []netip.Addr) bool { return slices.Equal(a, b) }

// quoteIPs formats like MetalLB's event text: ["172.18.255.200"].
func quoteIPs(ips []netip.Addr) string {
	s := make([]string, len(ips))
	for i, ip := range ips {
		s[i] = fmt.Sprintf("%q", ip.String())
	}
	return "[" + strings.Join(s, " ") + "]"
}
