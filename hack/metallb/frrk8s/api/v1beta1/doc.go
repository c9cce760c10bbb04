// Package v1beta1 is a compile-only stand-in for the FRRConfiguration API of
// github.com/metallb/frr-k8s/api/v1beta1 (group frrk8s.metallb.io, version v1beta1), written
// from what MetalLB v0.16.2 uses of it, not copied: the real module is not on the Go proxy.
//
// MetalLB uses these types only in its frr-k8s BGP backend (internal/bgp/frrk8s) and the
// reconciler that writes FRRConfiguration objects (internal/k8s/controllers), which run only
// with `speaker --bgp-type=frr-k8s`. The Layer-2 benchmark (docs/benchmarks-metallb.md) never
// runs them; MetalLB's Layer-2 code is its own and unmodified. The types carry the fields
// MetalLB sets, with the JSON names of the real API, and register with a scheme so that
// MetalLB's AddToScheme call works; nothing more (no status, no validation markers).
//
// zz_generated.deepcopy.go is generated: `make generate`.
//
// +kubebuilder:object:generate=true
// +groupName=frrk8s.metallb.io
package v1beta1
