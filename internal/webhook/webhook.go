// Package webhook serves the validating admission webhooks for IPAddressPool and
// L2Advertisement, at MetalLB's paths, and keeps their serving certificate current.
//
// A webhook validates the incoming object together with every other pool and
// advertisement of the install namespace, read uncached from the API server, with
// the same parser (internal/config) the controller and speakers load, so what the
// API accepts is what the daemons will run.
package webhook

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/ironlb/ironlb/api/v1beta1"
	"github.com/ironlb/ironlb/internal/config"
)

// Paths the webhooks are served at: MetalLB's, so existing webhook configurations
// and tooling keep working.
const (
	IPAddressPoolPath   = "/validate-metallb-io-v1beta1-ipaddresspool"
	L2AdvertisementPath = "/validate-metallb-io-v1beta1-l2advertisement"
)

// The markers below generate config/webhook/manifests.yaml (make manifests).
//
// +kubebuilder:webhookconfiguration:mutating=false,name=ironlb-webhook-configuration
// +kubebuilder:webhook:path=/validate-metallb-io-v1beta1-ipaddresspool,mutating=false,failurePolicy=fail,sideEffects=None,groups=metallb.io,resources=ipaddresspools,verbs=create;update,versions=v1beta1,name=ipaddresspoolvalidationwebhook.metallb.io,admissionReviewVersions=v1
// +kubebuilder:webhook:path=/validate-metallb-io-v1beta1-l2advertisement,mutating=false,failurePolicy=fail,sideEffects=None,groups=metallb.io,resources=l2advertisements,verbs=create;update,versions=v1beta1,name=l2advertisementvalidationwebhook.metallb.io,admissionReviewVersions=v1

// +kubebuilder:rbac:groups=metallb.io,namespace=metallb-system,resources=ipaddresspools;l2advertisements,verbs=get;list;watch
// +kubebuilder:rbac:groups=networking.k8s.io,resources=servicecidrs,verbs=list
// +kubebuilder:rbac:groups="",resources=nodes,verbs=list

// Setup registers both validating webhooks on mgr's webhook server. namespace is the
// install namespace: objects elsewhere are rejected, and the other objects are read
// from it. mgr's scheme must include v1beta1.
//
// Calling Setup starts (or, before mgr.Start, schedules) the webhook server, which
// needs its certificate files: with SetupCertRotation, call Setup after the channel
// it returns is closed.
func Setup(mgr manager.Manager, namespace string) error {
	if namespace == "" {
		return errors.New("webhook: install namespace is empty")
	}
	for _, obj := range []runtime.Object{&v1beta1.IPAddressPool{}, &v1beta1.L2Advertisement{}} {
		if _, _, err := mgr.GetScheme().ObjectKinds(obj); err != nil {
			return fmt.Errorf("webhook: manager scheme lacks metallb.io/v1beta1: %w", err)
		}
	}
	v := &Validator{Reader: mgr.GetAPIReader(), Namespace: namespace}
	if err := builder.WebhookManagedBy(mgr, &v1beta1.IPAddressPool{}).
		WithValidator(poolValidator{v}).
		WithValidatorCustomPath(IPAddressPoolPath).
		Complete(); err != nil {
		return fmt.Errorf("webhook: registering IPAddressPool webhook: %w", err)
	}
	if err := builder.WebhookManagedBy(mgr, &v1beta1.L2Advertisement{}).
		WithValidator(l2Validator{v}).
		WithValidatorCustomPath(L2AdvertisementPath).
		Complete(); err != nil {
		return fmt.Errorf("webhook: registering L2Advertisement webhook: %w", err)
	}
	return nil
}

// Validator checks one incoming IPAddressPool or L2Advertisement against the rest of
// the configuration. It is exported so it can be tested and reused without a server.
type Validator struct {
	// Reader lists the current objects; use an uncached reader (mgr.GetAPIReader())
	// so two quick changes cannot both pass against a stale cache.
	Reader client.Reader
	// Namespace is the install namespace.
	Namespace string
}

// ValidatePool validates pool as if it replaced the pool of the same name (or was
// added). It rejects the pool when any problem concerns it; problems only in other
// objects (which were there before) do not block it and come back as warnings.
func (v *Validator) ValidatePool(ctx context.Context, pool *v1beta1.IPAddressPool) (admission.Warnings, error) {
	if err := v.checkNamespace("IPAddressPool", pool.Name, pool.Namespace); err != nil {
		return nil, err
	}
	pools, ads, err := v.list(ctx)
	if err != nil {
		return nil, err
	}
	pools = replace(pools, pool, func(p *v1beta1.IPAddressPool) string { return p.Name })
	_, err = config.Parse(pools, ads, nil)
	nets, netErr := v.clusterNetworks(ctx)
	if overlaps := config.CheckClusterNetworks(pool, nets); len(overlaps) > 0 {
		err = errors.Join(append([]error{err}, overlaps...)...)
	}
	warnings, err := v.verdict(ctx, "IPAddressPool", pool.Name, err)
	if netErr != nil {
		warnings = append(warnings, "cannot check the pool against the cluster's pod and Service networks: "+netErr.Error())
	}
	return warnings, err
}

// clusterNetworks lists the blocks the cluster routes itself: every ServiceCIDR
// (networking.k8s.io/v1, which the API server creates from
// --service-cluster-ip-range) and every node's spec.podCIDRs. Pod networks that a
// CNI allocates without writing spec.podCIDRs (e.g. Calico's or Cilium's own IPAM)
// are not visible here. Whatever it could list is returned along with the error.
func (v *Validator) clusterNetworks(ctx context.Context) ([]config.ClusterNetwork, error) {
	var nets []config.ClusterNetwork
	var errs []error
	var cidrs networkingv1.ServiceCIDRList
	if err := v.Reader.List(ctx, &cidrs); err != nil {
		errs = append(errs, fmt.Errorf("listing ServiceCIDRs: %w", err))
	}
	for i := range cidrs.Items {
		for _, c := range cidrs.Items[i].Spec.CIDRs {
			if p, err := netip.ParsePrefix(c); err == nil {
				nets = append(nets, config.ClusterNetwork{Prefix: p, What: fmt.Sprintf("Service network (ServiceCIDR %q)", cidrs.Items[i].Name)})
			}
		}
	}
	var nodes corev1.NodeList
	if err := v.Reader.List(ctx, &nodes); err != nil {
		errs = append(errs, fmt.Errorf("listing nodes: %w", err))
	}
	for i := range nodes.Items {
		for _, c := range nodes.Items[i].Spec.PodCIDRs {
			if p, err := netip.ParsePrefix(c); err == nil {
				nets = append(nets, config.ClusterNetwork{Prefix: p, What: fmt.Sprintf("pod network of node %q", nodes.Items[i].Name)})
			}
		}
	}
	return nets, errors.Join(errs...)
}

// ValidateL2Advertisement validates ad as ValidatePool validates a pool.
func (v *Validator) ValidateL2Advertisement(ctx context.Context, ad *v1beta1.L2Advertisement) (admission.Warnings, error) {
	if err := v.checkNamespace("L2Advertisement", ad.Name, ad.Namespace); err != nil {
		return nil, err
	}
	pools, ads, err := v.list(ctx)
	if err != nil {
		return nil, err
	}
	ads = replace(ads, ad, func(a *v1beta1.L2Advertisement) string { return a.Name })
	_, err = config.Parse(pools, ads, nil)
	return v.verdict(ctx, "L2Advertisement", ad.Name, err)
}

func (v *Validator) checkNamespace(kind, name, namespace string) error {
	if namespace != v.Namespace {
		return fmt.Errorf("%s %q is in namespace %q: resource must be created in %s namespace", kind, name, namespace, v.Namespace)
	}
	return nil
}

func (v *Validator) list(ctx context.Context) ([]v1beta1.IPAddressPool, []v1beta1.L2Advertisement, error) {
	var pools v1beta1.IPAddressPoolList
	if err := v.Reader.List(ctx, &pools, client.InNamespace(v.Namespace)); err != nil {
		return nil, nil, fmt.Errorf("listing IPAddressPools in %s: %w", v.Namespace, err)
	}
	var ads v1beta1.L2AdvertisementList
	if err := v.Reader.List(ctx, &ads, client.InNamespace(v.Namespace)); err != nil {
		return nil, nil, fmt.Errorf("listing L2Advertisements in %s: %w", v.Namespace, err)
	}
	// Oldest first, so a conflict between two stored objects is blamed on the newer.
	slices.SortStableFunc(pools.Items, func(a, b v1beta1.IPAddressPool) int { return config.OlderFirst(&a.ObjectMeta, &b.ObjectMeta) })
	slices.SortStableFunc(ads.Items, func(a, b v1beta1.L2Advertisement) int { return config.OlderFirst(&a.ObjectMeta, &b.ObjectMeta) })
	return pools.Items, ads.Items, nil
}

// replace drops the item named like obj and appends obj, so obj is parsed last and
// an overlap is blamed on it rather than on the object that was there first (Parse
// blames the later of two conflicting entries, in input order).
func replace[T any](items []T, obj *T, name func(*T) string) []T {
	n := name(obj)
	items = slices.DeleteFunc(items, func(it T) bool { return name(&it) == n })
	return append(items, *obj)
}

// maxProblems is how many problems one admission response reports.
const maxProblems = 20

// verdict splits Parse's problems into those about the incoming object (the
// rejection) and the rest (warnings).
func (v *Validator) verdict(ctx context.Context, kind, name string, err error) (admission.Warnings, error) {
	if err == nil {
		return nil, nil
	}
	var mine []error
	var warnings admission.Warnings
	for _, e := range flatten(err) {
		var fe *config.FieldError
		if errors.As(e, &fe) && (fe.Kind != kind || fe.Name != name) {
			warnings = append(warnings, "existing configuration has a problem (not caused by this change): "+e.Error())
			continue
		}
		mine = append(mine, e)
	}
	if len(mine) == 0 {
		return warnings, nil
	}
	// Each problem quotes a bounded value, but their number is the user's: an
	// object with thousands of bad entries must not yield a response (and log
	// line) of megabytes.
	if n := len(mine); n > maxProblems {
		mine = append(mine[:maxProblems], fmt.Errorf("... and %d more problems", n-maxProblems))
	}
	if n := len(warnings); n > maxProblems {
		warnings = append(warnings[:maxProblems], fmt.Sprintf("... and %d more problems in the existing configuration", n-maxProblems))
	}
	rejected := errors.Join(mine...)
	logf.FromContext(ctx).Info("rejecting invalid configuration", "kind", kind, "name", name, "namespace", v.Namespace, "reason", rejected.Error())
	return warnings, rejected
}

func flatten(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, flatten(e)...)
		}
		return out
	}
	return []error{err}
}

type poolValidator struct{ v *Validator }

func (p poolValidator) ValidateCreate(ctx context.Context, obj *v1beta1.IPAddressPool) (admission.Warnings, error) {
	return p.v.ValidatePool(ctx, obj)
}

func (p poolValidator) ValidateUpdate(ctx context.Context, _, obj *v1beta1.IPAddressPool) (admission.Warnings, error) {
	return p.v.ValidatePool(ctx, obj)
}

// ValidateDelete allows every delete: a pool in use is released by the controller.
func (poolValidator) ValidateDelete(context.Context, *v1beta1.IPAddressPool) (admission.Warnings, error) {
	return nil, nil
}

type l2Validator struct{ v *Validator }

func (l l2Validator) ValidateCreate(ctx context.Context, obj *v1beta1.L2Advertisement) (admission.Warnings, error) {
	return l.v.ValidateL2Advertisement(ctx, obj)
}

func (l l2Validator) ValidateUpdate(ctx context.Context, _, obj *v1beta1.L2Advertisement) (admission.Warnings, error) {
	return l.v.ValidateL2Advertisement(ctx, obj)
}

// ValidateDelete allows every delete.
func (l2Validator) ValidateDelete(context.Context, *v1beta1.L2Advertisement) (admission.Warnings, error) {
	return nil, nil
}
