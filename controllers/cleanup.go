package controllers

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ironlb/ironlb/api/v1beta1"
	"github.com/ironlb/ironlb/internal/service"
)

// DefaultCleanupTimeout bounds how long Cleanup waits for the controller's pods to go.
const DefaultCleanupTimeout = 2 * time.Minute

// CleanupOptions configure Cleanup. The names are those the controller was run with.
type CleanupOptions struct {
	// Namespace is the install namespace.
	Namespace string
	// DeploymentName is the controller Deployment, scaled to 0 first so nothing
	// allocates again while IPs are released. Empty skips that step.
	DeploymentName string
	// LoadBalancerClass is the controller's --lb-class: only Services of that
	// class ("" = without a class) are released.
	LoadBalancerClass string
	// MemberlistSecretName and WebhookSecretName are the Secrets the controller
	// created; empty skips one.
	MemberlistSecretName string
	WebhookSecretName    string
	// Timeout bounds the wait for the controller's pods to terminate
	// (DefaultCleanupTimeout when zero).
	Timeout time.Duration

	// RESTConfig is the API server connection; nil means ctrl.GetConfig().
	RESTConfig *rest.Config
	// Out receives one line per step and per object changed (nil discards).
	Out io.Writer
}

// Cleanup runs with its own ServiceAccount (the chart's cleanup hook,
// charts/ironlb/templates/cleanup-hook.yaml), not the controller's, so its
// permissions are written there rather than as markers here, which would widen
// the controller's role: services list/patch, services/status patch (cluster);
// deployments get/patch, pods list, secrets delete, servicel2statuses and
// configurationstates list/delete (install namespace).

// Cleanup undoes what ironlb did to the cluster, for an uninstall: it stops the
// controller (Deployment scaled to 0, waiting until its pods are gone, so nothing
// allocates again), releases the IPs of every Service the controller allocated
// (status.loadBalancer.ingress cleared and the metallb.io/ip-allocated-from-pool
// annotation removed, only on Services carrying that annotation and of our class),
// then deletes the ServiceL2Status and ConfigurationState objects of the install
// namespace and the memberlist and webhook certificate Secrets. Running it again does nothing more;
// objects already gone are skipped.
func Cleanup(ctx context.Context, opts CleanupOptions) error {
	if opts.Namespace == "" {
		return errors.New("cleanup: the install namespace is not set (--namespace)")
	}
	out := opts.Out
	if out == nil {
		out = io.Discard
	}
	cfg := opts.RESTConfig
	if cfg == nil {
		var err error
		if cfg, err = getConfig(); err != nil {
			return fmt.Errorf("cleanup: loading the kubeconfig: %w", err)
		}
	}
	c, err := client.New(cfg, client.Options{Scheme: Scheme()})
	if err != nil {
		return fmt.Errorf("cleanup: creating the API client: %w", err)
	}
	cl := &cleaner{c: c, opts: opts, out: out}
	if err := cl.stopController(ctx); err != nil {
		return fmt.Errorf("cleanup: %w", err)
	}
	if err := cl.releaseServices(ctx); err != nil {
		return fmt.Errorf("cleanup: %w", err)
	}
	if err := cl.deleteObjects(ctx); err != nil {
		return fmt.Errorf("cleanup: %w", err)
	}
	cl.say("cleanup complete")
	return nil
}

type cleaner struct {
	c    client.Client
	opts CleanupOptions
	out  io.Writer
}

// say prints one line of progress; a failing writer does not stop the cleanup.
func (cl *cleaner) say(format string, args ...any) {
	_, _ = fmt.Fprintf(cl.out, format+"\n", args...)
}

func (cl *cleaner) stopController(ctx context.Context) error {
	name := cl.opts.DeploymentName
	if name == "" {
		cl.say("no controller deployment given, not stopping it")
		return nil
	}
	key := types.NamespacedName{Namespace: cl.opts.Namespace, Name: name}
	var dep appsv1.Deployment
	if err := cl.c.Get(ctx, key, &dep); err != nil {
		if apierrors.IsNotFound(err) {
			cl.say("deployment %s not found, nothing to stop", key)
			return nil
		}
		return fmt.Errorf("reading deployment %s: %w", key, err)
	}
	if dep.Spec.Replicas == nil || *dep.Spec.Replicas != 0 {
		patch := client.RawPatch(types.MergePatchType, []byte(`{"spec":{"replicas":0}}`))
		if err := cl.c.Patch(ctx, &dep, patch); err != nil {
			return fmt.Errorf("scaling deployment %s to 0 replicas: %w", key, err)
		}
		cl.say("deployment %s scaled to 0 replicas", key)
	}
	sel, err := metav1.LabelSelectorAsSelector(dep.Spec.Selector)
	if err != nil {
		return fmt.Errorf("deployment %s: spec.selector: %w", key, err)
	}
	timeout := cl.opts.Timeout
	if timeout <= 0 {
		timeout = DefaultCleanupTimeout
	}
	// A plain loop rather than a poll with a deadline context: the list itself
	// runs under ctx, so a slow request near the deadline is not mistaken for a
	// listing error.
	deadline := time.Now().Add(timeout)
	for {
		var pods corev1.PodList
		if err := cl.c.List(ctx, &pods, client.InNamespace(key.Namespace), client.MatchingLabelsSelector{Selector: sel}); err != nil {
			return fmt.Errorf("listing the pods of deployment %s: %w", key, err)
		}
		if len(pods.Items) == 0 {
			break
		}
		if time.Now().After(deadline) {
			left := make([]string, len(pods.Items))
			for i := range pods.Items {
				left[i] = pods.Items[i].Name
			}
			return fmt.Errorf("the pods of deployment %s did not terminate within %s: %v", key, timeout, left)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the pods of deployment %s to terminate: %w", key, ctx.Err())
		case <-time.After(time.Second):
		}
	}
	cl.say("controller pods of deployment %s are gone", key)
	return nil
}

// ours reports whether the controller allocated svc's IPs: it carries the pool
// annotation and is of the controller's class.
func (cl *cleaner) ours(svc *corev1.Service) bool {
	if _, ok := svc.Annotations[AnnotationAllocatedFromPool]; !ok {
		return false
	}
	return service.ClassMatches(svc, cl.opts.LoadBalancerClass)
}

func (cl *cleaner) releaseServices(ctx context.Context) error {
	var svcs corev1.ServiceList
	if err := cl.c.List(ctx, &svcs); err != nil {
		return fmt.Errorf("listing services: %w", err)
	}
	released := 0
	for i := range svcs.Items {
		svc := &svcs.Items[i]
		if !cl.ours(svc) {
			continue
		}
		key := client.ObjectKeyFromObject(svc)
		ips, _ := service.IngressIPs(svc) // for the message only
		// Status first, annotation last: if this is interrupted, the annotation
		// still marks the Service for the next run.
		if len(svc.Status.LoadBalancer.Ingress) > 0 {
			patch := client.RawPatch(types.MergePatchType, []byte(`{"status":{"loadBalancer":{"ingress":null}}}`))
			if err := cl.c.Status().Patch(ctx, svc, patch); err != nil {
				if apierrors.IsNotFound(err) {
					continue
				}
				return fmt.Errorf("clearing status.loadBalancer.ingress of service %s: %w", key, err)
			}
		}
		patch := client.RawPatch(types.MergePatchType,
			[]byte(fmt.Sprintf(`{"metadata":{"annotations":{%q:null}}}`, AnnotationAllocatedFromPool)))
		if err := cl.c.Patch(ctx, svc, patch); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return fmt.Errorf("removing annotation %s of service %s: %w", AnnotationAllocatedFromPool, key, err)
		}
		released++
		cl.say("service %s: released %v", key, ips)
	}
	cl.say("released the IPs of %d services", released)
	return nil
}

func (cl *cleaner) deleteObjects(ctx context.Context) error {
	ns := cl.opts.Namespace
	if err := cl.deleteAll(ctx, &v1beta1.ServiceL2StatusList{}, "servicel2statuses"); err != nil {
		return err
	}
	// The speakers' are owned by their Nodes, which stay.
	if err := cl.deleteAll(ctx, &v1beta1.ConfigurationStateList{}, "configurationstates"); err != nil {
		return err
	}
	for _, name := range []string{cl.opts.MemberlistSecretName, cl.opts.WebhookSecretName} {
		if name == "" {
			continue
		}
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
		switch err := cl.c.Delete(ctx, s); {
		case err == nil:
			cl.say("deleted secret %s/%s", ns, name)
		case apierrors.IsNotFound(err):
			cl.say("secret %s/%s already gone", ns, name)
		default:
			return fmt.Errorf("deleting secret %s/%s: %w", ns, name, err)
		}
	}
	return nil
}

// deleteAll deletes every object of list's kind in the install namespace;
// a kind whose CRD is gone has no objects left.
func (cl *cleaner) deleteAll(ctx context.Context, list client.ObjectList, resource string) error {
	ns := cl.opts.Namespace
	switch err := cl.c.List(ctx, list, client.InNamespace(ns)); {
	case apierrors.IsNotFound(err) || isNoMatch(err):
		cl.say("no %s resource, nothing to delete", resource)
		return nil
	case err != nil:
		return fmt.Errorf("listing %s in namespace %s: %w", resource, ns, err)
	}
	items, err := meta.ExtractList(list)
	if err != nil {
		return fmt.Errorf("listing %s in namespace %s: %w", resource, ns, err)
	}
	for _, item := range items {
		o, ok := item.(client.Object)
		if !ok {
			return fmt.Errorf("listing %s: unexpected item %T", resource, item)
		}
		if err := cl.c.Delete(ctx, o); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting %s %s/%s: %w", resource, ns, o.GetName(), err)
		}
	}
	cl.say("deleted %d %s in namespace %s", len(items), resource, ns)
	return nil
}

func getConfig() (*rest.Config, error) { return ctrl.GetConfig() }

func isNoMatch(err error) bool { return meta.IsNoMatchError(err) }
