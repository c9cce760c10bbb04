#!/usr/bin/env bash
# kind-demo.sh runs the walkthrough on kind, for machines with Docker (the lab is for
# machines without). It creates the walkthrough's cluster, loads the image `make image` built
# (the one the release publishes, as a `docker load` archive: no docker build), installs the
# chart and applies the walkthrough; the e2e suite can then run against it.
#
#   hack/kind-demo.sh            run it (needs docker, kind, kubectl, helm)
#   hack/kind-demo.sh --dry-run  check what it would use (the image archive for Docker's
#                                platform holds the chart's image) and print every command;
#                                needs none of the tools (make test runs it)
set -euo pipefail
cd "$(dirname "$0")/.."

DRY_RUN=0
case "${1:-}" in
--dry-run) DRY_RUN=1 ;;
"") ;;
*) echo "usage: hack/kind-demo.sh [--dry-run]" >&2; exit 2 ;;
esac
# run runs a command, or prints it in a dry run.
run() {
	if [ "$DRY_RUN" = 1 ]; then echo "+ $*"; else "$@"; fi
}

CLUSTER=${CLUSTER:-myk8s}
VERSION=$(awk '/^appVersion:/ {gsub(/"/, "", $2); print $2}' charts/ironlb/Chart.yaml)
IMAGE=${IMAGE:-ghcr.io/ironlb/ironlb:$VERSION}
HELM=helm
[ -x bin/helm ] && HELM=bin/helm
for cmd in docker kind kubectl "$HELM"; do
	if ! command -v "$cmd" >/dev/null; then
		[ "$DRY_RUN" = 1 ] && { echo "(dry run) $cmd is not installed; a real run needs it"; continue; }
		echo "kind-demo: $cmd is required (the lab needs none of them: make demo)" >&2
		exit 1
	fi
done

# kind's nodes run on Docker's platform; the image archive for it comes from make image.
if [ "$DRY_RUN" = 0 ]; then
	ARCH=$(docker info --format '{{.Architecture}}')
else
	ARCH=$(uname -m)
fi
case "$ARCH" in x86_64 | amd64) ARCH=amd64 ;; aarch64 | arm64) ARCH=arm64 ;; *) echo "kind-demo: no image for $ARCH (make image builds linux/amd64 and linux/arm64)" >&2; exit 1 ;; esac
ARCHIVE=bin/image/ironlb-linux-$ARCH.tar
[ "$DRY_RUN" = 1 ] || make --no-print-directory image
[ -f "$ARCHIVE" ] || { echo "kind-demo: $ARCHIVE is missing: run make image" >&2; exit 1; }
tar -xOf "$ARCHIVE" manifest.json | grep -qF "\"$IMAGE\"" ||
	{ echo "kind-demo: $ARCHIVE does not hold $IMAGE (it has $(tar -xOf "$ARCHIVE" manifest.json | grep -o '"RepoTags":[^]]*]')): run make image" >&2; exit 1; }
if command -v "$HELM" >/dev/null; then
	"$HELM" template ironlb charts/ironlb -n metallb-system --kube-version "${KUBE_VERSION:-v1.37.1}" | grep -qF "image: $IMAGE" ||
		{ echo "kind-demo: the chart does not deploy $IMAGE" >&2; exit 1; }
fi
echo ">> image $IMAGE for linux/$ARCH from $ARCHIVE (digest of the index: $(cat bin/image/digest))"

echo ">> creating kind cluster $CLUSTER (1 control plane, 3 workers, pod CIDR 10.10.0.0/16, services 10.200.1.0/24)"
config=$(mktemp)
trap 'rm -f "$config"' EXIT
cat >"$config" <<YAML
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
nodes:
- role: control-plane
- role: worker
- role: worker
- role: worker
networking:
  podSubnet: 10.10.0.0/16
  serviceSubnet: 10.200.1.0/24
YAML
if [ "$DRY_RUN" = 1 ] || ! kind get clusters | grep -qx "$CLUSTER"; then
	run kind create cluster --name "$CLUSTER" --config "$config"
fi

echo ">> loading $IMAGE into the nodes (no registry, no docker build)"
run kind load image-archive "$ARCHIVE" --name "$CLUSTER"

echo ">> installing ironlb into metallb-system"
run "$HELM" upgrade --install ironlb charts/ironlb -n metallb-system --create-namespace --wait --timeout 5m

echo ">> applying the walkthrough"
run kubectl apply -f examples/walkthrough/pods.yaml
run kubectl apply -f examples/walkthrough/pool.yaml
run kubectl apply -f examples/walkthrough/services.yaml
run kubectl wait --for=jsonpath='{.status.loadBalancer.ingress[0].ip}' svc/svc1 svc/svc2 svc/svc3 --timeout 2m
run kubectl get svc

echo ">> from a container on kind's network (stands in for mypc)"
if [ "$DRY_RUN" = 1 ]; then
	IPS="SVC1_IP SVC2_IP SVC3_IP"
else
	IPS=$(kubectl get svc svc1 svc2 svc3 -o jsonpath='{.items[*].status.loadBalancer.ingress[0].ip}')
fi
for ip in $IPS; do
	echo "$ip:"
	run docker run --rm --network kind nicolaka/netshoot sh -c \
		"for i in \$(seq 100); do curl -s $ip | grep Hostname; done | sort | uniq -c | sort -nr"
done
echo ">> starting the client container mypc on kind's network (for the e2e suite)"
if [ "$DRY_RUN" = 1 ] || ! docker inspect mypc >/dev/null 2>&1; then
	run docker run -d --name mypc --network kind nicolaka/netshoot sleep infinity
fi
echo ">> run the e2e suite against this cluster (docker exec into the nodes and mypc):"
echo "   kind get kubeconfig --name $CLUSTER > /tmp/kind-$CLUSTER.kubeconfig"
echo "   E2E_KUBECONFIG=/tmp/kind-$CLUSTER.kubeconfig E2E_HOSTS=docker E2E_CLIENT=mypc E2E_INSTALL=0 go test -tags e2e ./test/e2e -v"
echo ">> done; remove with: docker rm -f mypc; kind delete cluster --name $CLUSTER"
