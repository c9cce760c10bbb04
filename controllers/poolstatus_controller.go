package controllers

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrl "sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/ironlb/ironlb/api/v1beta1"
	"github.com/ironlb/ironlb/internal/allocator"
	"github.com/ironlb/ironlb/internal/textlimit"
)

// Pool condition type and reasons written by the pool status reconciler.
const (
	ConditionReady = "Ready"

	ReasonLoaded       = "Loaded"
	ReasonInvalid      = "Invalid"
	ReasonStaleConfig  = "StaleConfiguration"
	ReasonNotInConfig  = "NotLoaded"
	poolStatusDebounce = 500 * time.Millisecond
)

// poolStatusReconciler writes each IPAddressPool's usage counts and Ready
// condition. Allocation changes are batched: a pool's status is written at most
// about twice a second however many Services change, so a burst of 10,000
// allocations costs a handful of writes.
type poolStatusReconciler struct {
	client client.Client
	state  *state
}

// +kubebuilder:rbac:groups=metallb.io,namespace=metallb-system,resources=ipaddresspools/status,verbs=get;update;patch

func (r *poolStatusReconciler) setup(mgr manager.Manager) error {
	ns := r.state.namespace
	return builder.ControllerManagedBy(mgr).
		Named("ipaddresspool-status").
		// Our own status writes do not bump the generation, so they do not loop.
		For(&v1beta1.IPAddressPool{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		WatchesRawSource(source.Func(func(_ context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
			r.state.setPoolsChanged(func(pools []string) {
				for _, p := range pools {
					q.AddAfter(reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: p}}, poolStatusDebounce)
				}
			})
			return nil
		})).
		WithOptions(ctrl.Options{MaxConcurrentReconciles: 1, SkipNameValidation: ptr.To(true)}).
		Complete(r)
}

func (r *poolStatusReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var pool v1beta1.IPAddressPool
	if err := r.client.Get(ctx, req.NamespacedName, &pool); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}

	r.state.mu.Lock()
	// Before the first valid configuration (alloc nil) only the condition is
	// known: the counts are left as they are rather than reported as zero.
	loaded := r.state.alloc != nil
	inConfig := false
	var stats allocator.Stats
	if loaded {
		_, inConfig = r.state.cfg.Pools[pool.Name]
		stats = r.state.alloc.PoolStats(pool.Name)
	}
	configErr, problem := r.state.configErr, r.state.poolErrs[pool.Name]
	r.state.mu.Unlock()

	orig := pool.DeepCopy()
	if loaded {
		pool.Status.AssignedIPv4 = stats.AssignedIPv4
		pool.Status.AssignedIPv6 = stats.AssignedIPv6
		pool.Status.AvailableIPv4 = stats.AvailableIPv4
		pool.Status.AvailableIPv6 = stats.AvailableIPv6
	}
	meta.SetStatusCondition(&pool.Status.Conditions, readyCondition(&pool, inConfig, configErr, problem))
	if equality.Semantic.DeepEqual(orig.Status, pool.Status) {
		return reconcile.Result{}, nil
	}
	// A full update, not a merge patch: the schema requires all four counts and a
	// patch would leave out those still zero. A conflict is retried by the queue.
	if err := r.client.Status().Update(ctx, &pool); err != nil {
		if apierrors.IsNotFound(err) {
			return reconcile.Result{}, nil
		}
		r.state.metrics.k8s.UpdateErrors.Inc()
		return reconcile.Result{}, fmt.Errorf("writing status of IPAddressPool %s: %w", req, err)
	}
	return reconcile.Result{}, nil
}

// readyCondition says whether the pool is in use. problem is what the newest,
// refused configuration found wrong with this pool ("" if nothing).
func readyCondition(pool *v1beta1.IPAddressPool, inConfig bool, configErr, problem string) metav1.Condition {
	c := metav1.Condition{Type: ConditionReady, ObservedGeneration: pool.Generation}
	switch {
	case !inConfig && problem != "":
		c.Status, c.Reason = metav1.ConditionFalse, ReasonInvalid
		c.Message = problem
	case !inConfig:
		c.Status, c.Reason = metav1.ConditionFalse, ReasonNotInConfig
		c.Message = "the pool is not part of the running configuration"
		if configErr != "" {
			c.Message += "; the newest configuration was refused: " + configErr
		}
	case problem != "":
		c.Status, c.Reason = metav1.ConditionFalse, ReasonStaleConfig
		c.Message = "the pool's newest spec was refused, addresses are allocated from its last valid one: " + problem
	default:
		c.Status, c.Reason = metav1.ConditionTrue, ReasonLoaded
		c.Message = "addresses are allocated from this pool"
	}
	// The API server refuses a longer condition message, and with it the whole
	// status update: a pool with thousands of bad entries would get no feedback.
	c.Message = textlimit.Note(c.Message, maxConditionMessage)
	return c
}

// maxConditionMessage is metav1.Condition's limit on Message.
const maxConditionMessage = 32768
