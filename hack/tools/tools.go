//go:build tools

// Package tools records the Kubernetes commands and helm built into bin/ so that `go mod
// tidy` keeps their dependencies in go.sum. helm is built here, not with `go install`, so
// that it compiles against the same k8s.io modules as the Kubernetes binaries and shares
// their build cache (a cold `make demo` builds client-go, cli-runtime and kubectl once).
package tools

import (
	_ "helm.sh/helm/v3/cmd/helm"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
