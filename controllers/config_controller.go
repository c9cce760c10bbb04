package controllers

import (
	"context"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrl "sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/ironlb/ironlb/api/v1beta1"
)

// configReconciler reloads the configuration whenever an IPAddressPool, an
// L2Advertisement or a Namespace's labels change. Every event maps to one fixed
// key, so a burst of changes is parsed once.
type configReconciler struct {
	state *state
}

// +kubebuilder:rbac:groups=metallb.io,resources=ipaddresspools;l2advertisements,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get;list;watch

var configKey = reconcile.Request{NamespacedName: types.NamespacedName{Name: "configuration"}}

func (r *configReconciler) setup(mgr manager.Manager) error {
	toKey := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{configKey}
	})
	return builder.ControllerManagedBy(mgr).
		Named("config").
		Watches(&v1beta1.IPAddressPool{}, toKey).
		Watches(&v1beta1.L2Advertisement{}, toKey).
		// Namespace labels feed serviceAllocation.namespaceSelectors.
		Watches(&corev1.Namespace{}, toKey, builder.WithPredicates(predicate.LabelChangedPredicate{})).
		// Load once at start even if no watched object exists yet.
		WatchesRawSource(source.Func(func(_ context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
			q.Add(configKey)
			return nil
		})).
		WithOptions(ctrl.Options{MaxConcurrentReconciles: 1, SkipNameValidation: ptr.To(true)}).
		Complete(r)
}

func (r *configReconciler) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	clientUpdates.Inc()
	if err := r.state.reload(ctx); err != nil {
		clientUpdateErrors.Inc()
		// Not returned: retrying cannot fix a bad configuration; the next change
		// of a watched object triggers a new attempt.
		logr.FromContextOrDiscard(ctx).Error(err, "configuration refused, keeping the last valid one")
	}
	return reconcile.Result{}, nil
}
