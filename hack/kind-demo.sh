#!/usr/bin/env bash
# kind-demo.sh runs the walkthrough on kind, for machines with Docker (the lab is for
# machines without). It creates the walkthrough's cluster, loads the image, installs the chart
# and applies the walkthrough; the e2e suite can then run against it.
set -euo pipefail
cd "$(dirname "$0")/.."

CLUSTER=${CLUSTER:-myk8s}
IMAGE=${IMAGE:-ghcr.io/ironlb/ironlb:$(awk '/^appVersion:/ {gsub(/"/, "", $2); print $2}' charts/ironlb/Chart.yaml)}
for cmd in docker kind kubectl helm; do
  command -v "$cmd" >/dev/null || { echo "kind-demo: $cmd is required (the lab needs none of them: make demo)" >&2; exit 1; }
done

echo ">> creating kind cluster $CLUSTER (1 control plane, 3 workers, pod CIDR 10.10.0.0/16, services 10.200.1.0/24)"
kind get clusters | grep -qx "$CLUSTER" || kind create cluster --name "$CLUSTER" --config - <<YAML
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

echo ">> building and loading $IMAGE"
docker build -t "$IMAGE" .
kind load docker-image "$IMAGE" --name "$CLUSTER"

echo ">> installing ironlb into metallb-system"
helm upgrade --install ironlb charts/ironlb -n metallb-system --create-namespace --wait --timeout 5m

echo ">> applying the walkthrough"
kubectl apply -f examples/walkthrough/pods.yaml
kubectl apply -f examples/walkthrough/pool.yaml
kubectl apply -f examples/walkthrough/services.yaml
kubectl wait --for=jsonpath='{.status.loadBalancer.ingress[0].ip}' svc/svc1 svc/svc2 svc/svc3 --timeout 2m
kubectl get svc

echo ">> from a container on kind's network (stands in for mypc)"
for ip in $(kubectl get svc svc1 svc2 svc3 -o jsonpath='{.items[*].status.loadBalancer.ingress[0].ip}'); do
  echo "$ip:"
  docker run --rm --network kind nicolaka/netshoot sh -c \
    "for i in \$(seq 100); do curl -s $ip | grep Hostname; done | sort | uniq -c | sort -nr"
done
echo ">> starting the client container mypc on kind's network (for the e2e suite)"
docker inspect mypc >/dev/null 2>&1 || docker run -d --name mypc --network kind nicolaka/netshoot sleep infinity >/dev/null
echo ">> run the e2e suite against this cluster (docker exec into the nodes and mypc):"
echo "   kind get kubeconfig --name $CLUSTER > /tmp/kind-$CLUSTER.kubeconfig"
echo "   E2E_KUBECONFIG=/tmp/kind-$CLUSTER.kubeconfig E2E_HOSTS=docker E2E_CLIENT=mypc E2E_INSTALL=0 go test -tags e2e ./test/e2e -v"
echo ">> done; remove with: docker rm -f mypc; kind delete cluster --name $CLUSTER"
