package controllers

import (
	"context"
	"errors"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrl "sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/ironlb/ironlb/internal/configload"
	"github.com/ironlb/ironlb/internal/configstate"
	"github.com/ironlb/ironlb/internal/textlimit"
)

// configReconciler reloads the configuration whenever an IPAddressPool, an
// L2Advertisement or a Namespace's labels change. Every event maps to one fixed
// key, so a burst of changes is parsed once.
//
// It runs on every replica, not only the leader, so that each replica's
// metallb_k8s_client_config_loaded_bool and config_stale_bool say whether the
// configuration parses (a standby reporting "not loaded" forever would fire the
// MetalLBConfigNotLoaded alert). Only the leader goes further and applies it to
// the allocator: elected is closed when this replica becomes leader, which also
// triggers one more reload, so the allocator is rebuilt from the Service status of
// that moment rather than of the replica's start.
type configReconciler struct {
	state   *state
	elected <-chan struct{}
}

// +kubebuilder:rbac:groups=metallb.io,namespace=metallb-system,resources=ipaddresspools;l2advertisements,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get;list;watch

var configKey = reconcile.Request{NamespacedName: types.NamespacedName{Name: "configuration"}}

func (r *configReconciler) setup(mgr manager.Manager) error {
	toKey := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{configKey}
	})
	// Pools, advertisements and (serviceAllocation.namespaceSelectors)
	// Namespace labels; not pool status updates, written with every allocation.
	return configload.Watches(builder.ControllerManagedBy(mgr).Named("config"), toKey, true).
		// Load once at start even if no watched object exists yet, and again on
		// becoming leader.
		WatchesRawSource(source.Func(func(ctx context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
			q.Add(configKey)
			go func() {
				select {
				case <-r.elected:
					q.Add(configKey)
				case <-ctx.Done():
				}
			}()
			return nil
		})).
		WithOptions(ctrl.Options{MaxConcurrentReconciles: 1, SkipNameValidation: ptr.To(true), NeedLeaderElection: ptr.To(false)}).
		Complete(r)
}

func (r *configReconciler) isLeader() bool {
	select {
	case <-r.elected:
		return true
	default:
		return false
	}
}

// maxLoggedProblems bounds the refused configuration's problems in one log line:
// each quotes a bounded value, but a pool can have thousands of bad entries.
const maxLoggedProblems = 8192

func (r *configReconciler) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	r.state.metrics.k8s.Updates.Inc()
	if !r.isLeader() {
		// Metrics only; the allocator is the leader's.
		if _, err := r.state.check(ctx); err != nil {
			logr.FromContextOrDiscard(ctx).Info("configuration refused", "reason", textlimit.Note(err.Error(), maxLoggedProblems))
		}
		return reconcile.Result{}, nil
	}
	if err := r.state.reload(ctx); err != nil {
		if !configstate.IsConfigError(err) {
			// A refused configuration is counted once by the loader.
			r.state.metrics.k8s.UpdateErrors.Inc()
		}
		// Not returned: retrying cannot fix a bad configuration; the next change
		// of a watched object triggers a new attempt.
		logr.FromContextOrDiscard(ctx).Error(errors.New(textlimit.Note(err.Error(), maxLoggedProblems)), "configuration refused, keeping the last valid one")
	}
	return reconcile.Result{}, nil
}
