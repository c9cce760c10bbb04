package speaker

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/ironlb/ironlb/internal/configstate"
)

// setupConfigState registers the reporter of this speaker's
// ConfigurationState, speaker-<node>: condition configReconcilerValid says
// whether the pools and advertisements parse, as the speaker loads them.
func setupConfigState(mgr manager.Manager, opts Options, r *serviceReconciler, sw *statusWriter) error {
	reader := mgr.GetAPIReader()
	return (&configstate.Reporter{
		Client:    mgr.GetClient(),
		Namespace: opts.Namespace,
		Name:      configstate.SpeakerName(opts.NodeName),
		Labels:    configstate.SpeakerLabels(opts.NodeName),
		Condition: configstate.ConditionConfigReconcilerValid,
		Check:     r.configProblem,
		Owner: func(ctx context.Context) (*metav1.OwnerReference, error) {
			if owner, err := daemonSetOwner(ctx, reader, opts.Namespace, opts.PodName); owner != nil || err != nil {
				return owner, err
			}
			return sw.ownerRef(ctx)
		},
	}).Setup(mgr)
}

// daemonSetOwner returns the DaemonSet that runs pod as the owner of the
// speaker's ConfigurationState: a speaker restart keeps the object, and
// uninstalling ironlb removes every speaker's object, even one re-created by
// a speaker still running after `ironlb cleanup` deleted it. nil when the Pod
// does not exist or no DaemonSet controls it (a speaker run by hand; the
// caller then uses the Node).
func daemonSetOwner(ctx context.Context, reader client.Reader, namespace, pod string) (*metav1.OwnerReference, error) {
	if pod == "" {
		return nil, nil
	}
	var p corev1.Pod
	if err := reader.Get(ctx, client.ObjectKey{Namespace: namespace, Name: pod}, &p); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("get pod %s/%s (owner of its ConfigurationState): %w", namespace, pod, err)
	}
	c := metav1.GetControllerOf(&p)
	if c == nil || c.Kind != "DaemonSet" {
		return nil, nil
	}
	return &metav1.OwnerReference{APIVersion: c.APIVersion, Kind: c.Kind, Name: c.Name, UID: c.UID,
		BlockOwnerDeletion: ptr.To(false), Controller: ptr.To(false)}, nil
}
