#!/usr/bin/env bash
# check-shared-deps.sh: the modules the lab's Kubernetes binaries (hack/tools) share with
# ironlb's own binaries must be required at the same versions, built with the same flags
# (CGO_ENABLED=0 -trimpath -buildvcs=false), so that a cold `make demo` or CI compiles
# client-go, apimachinery and the rest once, not once per module: their build cache
# entries are then the same. A dependency bump in go.mod breaks nothing when this is
# forgotten, it only costs minutes; this check says which lines to bump.
set -euo pipefail
cd "$(dirname "$0")/.."

versions() { # the module versions (replacements resolved) the named packages build with
	go list -deps -f '{{with .Module}}{{.Path}} {{if .Replace}}{{.Replace.Version}}{{else}}{{.Version}}{{end}}{{end}}' "$@" | sort -u
}
ours=$(versions ./cmd/ironlb ./test/lab/cmd/lab)
kube=$(cd hack/tools && versions ./etcd k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
	k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kube-proxy k8s.io/kubernetes/cmd/kubectl)
diff=$(join <(echo "$ours") <(echo "$kube") | awk '$2 != $3')
if [ -n "$diff" ]; then
	echo "hack/tools/go.mod builds modules shared with go.mod at other versions (module, go.mod's, hack/tools'):"
	echo "$diff" | sed 's/^/  /'
	echo "next: raise the lower of the two (go get MODULE@VERSION && go mod tidy, at the top or in hack/tools)"
	exit 1
fi
