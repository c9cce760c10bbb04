package controllers

import (
	"context"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/ironlb/ironlb/internal/configstate"
)

// The controller's ConfigurationState ("controller" in the install namespace),
// written by the leader only: the replicas share it.
// +kubebuilder:rbac:groups=metallb.io,namespace=metallb-system,resources=configurationstates,verbs=get;list;watch;create;patch
// +kubebuilder:rbac:groups=metallb.io,namespace=metallb-system,resources=configurationstates/status,verbs=get;update;patch

// setupConfigState registers the reporter of the controller's
// ConfigurationState: condition poolReconcilerValid says whether the pools and
// advertisements parse, as the allocator would load them.
func setupConfigState(mgr manager.Manager, st *state, opts Options) error {
	r := &configstate.Reporter{
		Client:     mgr.GetClient(),
		Namespace:  opts.Namespace,
		Name:       configstate.ControllerName,
		Labels:     configstate.ControllerLabels(),
		Condition:  configstate.ConditionPoolReconcilerValid,
		LeaderOnly: true,
		Check: func(ctx context.Context) (error, error) {
			_, err := st.check(ctx)
			if err == nil || configstate.IsConfigError(err) {
				return err, nil
			}
			return nil, err
		},
	}
	if opts.DeploymentName != "" {
		reader := mgr.GetAPIReader()
		r.Owner = func(ctx context.Context) (*metav1.OwnerReference, error) {
			return deploymentOwner(ctx, reader, opts.Namespace, opts.DeploymentName)
		}
	}
	return r.Setup(mgr)
}

// deploymentOwner returns the controller Deployment as the owner of an object
// the controller creates, so uninstalling ironlb removes it; nil when the
// Deployment does not exist (run outside a cluster, or being deleted).
func deploymentOwner(ctx context.Context, reader client.Reader, namespace, name string) (*metav1.OwnerReference, error) {
	var dep appsv1.Deployment
	switch err := reader.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &dep); {
	case err == nil:
		return &metav1.OwnerReference{
			APIVersion: "apps/v1", Kind: "Deployment", Name: dep.Name, UID: dep.UID,
			BlockOwnerDeletion: ptr.To(false), Controller: ptr.To(false),
		}, nil
	case apierrors.IsNotFound(err):
		return nil, nil
	default:
		return nil, fmt.Errorf("reading deployment %s/%s: %w", namespace, name, err)
	}
}
