package configstate

import (
	"context"
	"fmt"
	"maps"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
	"github.com/ironlb/ironlb/internal/configload"
)

// Reporter is a reconciler that writes one ConfigurationState: at start, when
// an IPAddressPool or L2Advertisement changes, and when the object itself is
// changed or deleted by someone else (it is re-created). Each time it asks
// Check for the component's verdict and writes only what differs.
type Reporter struct {
	// Client reads from the manager's cache (which must watch
	// ConfigurationStates of Namespace) and writes to the API server.
	Client client.Client
	// Namespace and Name of the object; Labels it carries.
	Namespace, Name string
	Labels          map[string]string
	// Condition is the condition type this component owns.
	Condition string
	// Check returns the verdict on the configuration the component loads:
	// configErr nil when valid, else why not (IsConfigError); err when it
	// could not be read (retried, nothing written).
	Check func(ctx context.Context) (configErr, err error)
	// Owner, if set, returns the owner the object is created with (nil: none),
	// so it is garbage-collected with its component.
	Owner func(ctx context.Context) (*metav1.OwnerReference, error)
	// LeaderOnly runs the reporter only on the elected leader (the
	// controller's replicas share one object).
	LeaderOnly bool
}

// Setup registers the reporter with mgr.
func (r *Reporter) Setup(mgr manager.Manager) error {
	key := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: r.Namespace, Name: r.Name}}
	toKey := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{key}
	})
	mine := predicate.NewPredicateFuncs(func(o client.Object) bool {
		return o.GetNamespace() == r.Namespace && o.GetName() == r.Name
	})
	b := builder.ControllerManagedBy(mgr).
		Named("configurationstate").
		Watches(&v1beta1.ConfigurationState{}, toKey, builder.WithPredicates(mine))
	// The changes that reload the configuration (Namespaces aside: their
	// labels only resolve serviceAllocation, which cannot make it invalid).
	return configload.Watches(b, toKey, false).
		// Report once at start even if no pool or advertisement exists.
		WatchesRawSource(source.Func(func(_ context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
			q.Add(key)
			return nil
		})).
		WithOptions(ctrl.Options{MaxConcurrentReconciles: 1, SkipNameValidation: ptr.To(true), NeedLeaderElection: ptr.To(r.LeaderOnly)}).
		Complete(r)
}

// Reconcile writes the object if the verdict or the object changed.
func (r *Reporter) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	configErr, err := r.Check(ctx)
	if err != nil {
		return reconcile.Result{}, err
	}
	var cs v1beta1.ConfigurationState
	err = r.Client.Get(ctx, types.NamespacedName{Namespace: r.Namespace, Name: r.Name}, &cs)
	switch {
	case apierrors.IsNotFound(err):
		cs = v1beta1.ConfigurationState{ObjectMeta: metav1.ObjectMeta{Namespace: r.Namespace, Name: r.Name, Labels: r.Labels}}
		if r.Owner != nil {
			owner, err := r.Owner(ctx)
			if err != nil {
				return reconcile.Result{}, err
			}
			if owner != nil {
				cs.OwnerReferences = []metav1.OwnerReference{*owner}
			}
		}
		// The status subresource ignores status on create: written below.
		if err := r.Client.Create(ctx, &cs); err != nil {
			return reconcile.Result{}, fmt.Errorf("creating configurationstate %s/%s: %w", r.Namespace, r.Name, err)
		}
	case err != nil:
		return reconcile.Result{}, fmt.Errorf("reading configurationstate %s/%s: %w", r.Namespace, r.Name, err)
	default:
		if !hasLabels(cs.Labels, r.Labels) {
			patch := client.MergeFrom(cs.DeepCopy())
			if cs.Labels == nil {
				cs.Labels = map[string]string{}
			}
			maps.Copy(cs.Labels, r.Labels)
			if err := r.Client.Patch(ctx, &cs, patch); err != nil {
				return reconcile.Result{}, fmt.Errorf("labelling configurationstate %s/%s: %w", r.Namespace, r.Name, err)
			}
		}
	}
	want := Status(cs.Status, r.Condition, configErr, metav1.Now())
	if equality.Semantic.DeepEqual(want, cs.Status) {
		return reconcile.Result{}, nil
	}
	cs.Status = want
	// Update, not patch: the resourceVersion makes a concurrent writer's
	// change a conflict (retried) rather than silently lost.
	if err := r.Client.Status().Update(ctx, &cs); err != nil {
		return reconcile.Result{}, fmt.Errorf("writing configurationstate %s/%s status: %w", r.Namespace, r.Name, err)
	}
	logr.FromContextOrDiscard(ctx).Info("configuration state reported", "name", r.Name, "result", want.Result)
	return reconcile.Result{}, nil
}

func hasLabels(have, want map[string]string) bool {
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}
