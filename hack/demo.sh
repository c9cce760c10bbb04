#!/usr/bin/env bash
# demo.sh: the users' walkthrough (docs: /README.md, examples/walkthrough) in the lab, end to end.
#
# Builds what is needed, brings the lab up (or reuses the running one), installs ironlb with
# Helm into metallb-system, applies the walkthrough's pods, pool, L2Advertisement and three
# LoadBalancer services, waits for their EXTERNAL-IPs and shows, from the external client mypc,
# that each IP answers (Hostname distribution of 100 curls), which MAC mypc learned for it and
# which node announces it. The lab is left running; `make lab-down` removes it.
#
# Needs root (the lab is made of network namespaces). Run as `make demo`.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
DEMO=demo
SERVICES=(svc1 svc2 svc3)
# shellcheck source=hack/demo-lib.sh
. "$ROOT/hack/demo-lib.sh"

[ "$(id -u)" -eq 0 ] || fail "the lab needs root (it creates network namespaces)" "sudo make demo"

# Only what the demo runs: the image for this machine's architecture alone, Prometheus only
# with LAB_PROMETHEUS=1, each skipped by make when already built. Two chains at once: the
# Kubernetes binaries, and beside them the rest one after the other (ironlb's image and
# bin/ironlb share their packages: one after the other, nothing is compiled twice).
ARCH=$(go env GOARCH)
kubernetes() {
	build_step kubernetes "Kubernetes (etcd, kube-apiserver, controller-manager, scheduler, kube-proxy, kubectl)" \
		"$ROOT/bin/etcd" "$ROOT/bin/kube-apiserver" "$ROOT/bin/kube-controller-manager" "$ROOT/bin/kube-scheduler" "$ROOT/bin/kube-proxy" "$ROOT/bin/kubectl"
}
ironlb() {
	build_step ironlb "helm" "$ROOT/bin/helm" &&
		build_step ironlb "ironlb's image (linux/$ARCH) and its builder" image PLATFORMS="linux/$ARCH" &&
		build_step ironlb "the lab command, ironlb and the kubectl plugin (bin/kubectl-ironlb)" lab build &&
		if [ "${LAB_PROMETHEUS:-}" = 1 ]; then build_step ironlb "Prometheus (LAB_PROMETHEUS=1)" prometheus; fi
}
build_chains "cold: ~9 min, Kubernetes the longest part" kubernetes ironlb
# The lab's nodes run ironlb from this image (bin/image/oci), as a cluster would pull it.
IMAGE_ID="ghcr.io/ironlb/ironlb@$(cat bin/image/digest)"
step "image: $IMAGE_ID"

step "bringing the lab up (an already running lab is reused)"
"$LAB" up --workers "${LAB_WORKERS:-3}" --service-cidr "${LAB_SERVICE_CIDR:-10.200.1.0/24}" --ip-family "${LAB_IP_FAMILY:-dual}" ||
	fail "lab up failed" "$LAB status" "ls $ROOT/.lab/logs/" "$LAB down && make demo"
export KUBECONFIG="$KUBECONFIG_PATH"

step "installing ironlb into $NS with Helm (charts/ironlb)"
"${HELM[@]}" upgrade --install ironlb charts/ironlb -n "$NS" --create-namespace --wait=false ||
	fail "helm install failed" "${HELM[*]} status ironlb -n $NS" "${KUBECTL[*]} get events -n $NS"

# Pods started before the last `make image` run the old image (a reused lab after a code
# change): restart them. A pod's imageID is the image digest its node ran.
for id in $("${KUBECTL[@]}" get pods -n "$NS" -l app.kubernetes.io/name=ironlb \
	-o jsonpath='{range .items[*]}{.status.containerStatuses[0].imageID}{"\n"}{end}'); do
	if [ "$id" != "$IMAGE_ID" ]; then
		step "the running pods run $id, not the image just built: restarting them"
		"${KUBECTL[@]}" rollout restart -n "$NS" deployment/ironlb-controller daemonset/ironlb-speaker
		break
	fi
done

controller_ready() { "${KUBECTL[@]}" rollout status -n "$NS" deployment/ironlb-controller --timeout=2s; }
speakers_ready() { "${KUBECTL[@]}" rollout status -n "$NS" daemonset/ironlb-speaker --timeout=2s; }
# The pool and advertisement go through the validating webhook: wait until it answers.
webhook_ready() {
	"${KUBECTL[@]}" get endpointslices -n "$NS" -l kubernetes.io/service-name=ironlb-webhook-service \
		-o jsonpath='{.items[*].endpoints[?(@.conditions.ready==true)].addresses[0]}' | grep -q .
}
wait_for "controller Ready" 180 controller_ready ||
	fail "the controller did not become Ready in 180 s" "${KUBECTL[*]} get pods -n $NS -o wide" \
		"${KUBECTL[*]} describe deploy -n $NS ironlb-controller" "$LAB logs $NS/<controller pod>"
wait_for "speakers Ready on every node" 180 speakers_ready ||
	fail "the speakers did not become Ready in 180 s" "${KUBECTL[*]} get pods -n $NS -o wide" \
		"${KUBECTL[*]} get events -n $NS" "$LAB logs $NS/<speaker pod>"
wait_for "webhook serving" 120 webhook_ready ||
	fail "the webhook Service has no ready endpoint" "${KUBECTL[*]} get endpointslices -n $NS"

step "applying the walkthrough: examples/walkthrough/pods.yaml, pool.yaml, services.yaml"
"${KUBECTL[@]}" apply -f examples/walkthrough/pods.yaml
# The webhook may still be taking its certificate: retry for a while.
apply_pool() { "${KUBECTL[@]}" apply -f examples/walkthrough/pool.yaml; }
for i in $(seq 30); do
	if out=$(apply_pool 2>&1); then echo "$out"; break; fi
	[ "$i" -lt 30 ] || fail "applying the pool failed: $out" "${KUBECTL[*]} get validatingwebhookconfigurations" \
		"$LAB logs $NS/<controller pod>"
	sleep 2
done
"${KUBECTL[@]}" apply -f examples/walkthrough/services.yaml

pods_ready() { "${KUBECTL[@]}" wait --for=condition=Ready pod/webpod1 pod/webpod2 --timeout=2s; }
wait_for "webpod1 and webpod2 Ready" 120 pods_ready ||
	fail "the backends are not Ready" "${KUBECTL[*]} describe pod webpod1 webpod2"

external_ip() { "${KUBECTL[@]}" get svc "$1" -o jsonpath='{.status.loadBalancer.ingress[0].ip}'; }
all_ips() {
	local s
	for s in "${SERVICES[@]}"; do [ -n "$(external_ip "$s")" ] || return 1; done
}
wait_for "EXTERNAL-IPs assigned" 120 all_ips ||
	fail "not every service got an EXTERNAL-IP" "${KUBECTL[*]} get svc" "${KUBECTL[*]} describe svc svc1" \
		"${KUBECTL[*]} get events -n $NS"
IPS=()
for s in "${SERVICES[@]}"; do IPS+=("$(external_ip "$s")"); done

announced() {
	local n
	n=$("${KUBECTL[@]}" get servicel2statuses -n "$NS" -o name | wc -l)
	[ "$n" -ge "${#SERVICES[@]}" ]
}
wait_for "every service announced (ServiceL2Status)" 120 announced ||
	fail "not every service has an announcing node" "${KUBECTL[*]} get servicel2statuses -n $NS" \
		"${KUBECTL[*]} get events" "$LAB logs $NS/<speaker pod>"

# kube-proxy programs the nodes asynchronously after the Services appear: wait until each IP
# answers once, as a user would after seeing the EXTERNAL-IP.
for ip in "${IPS[@]}"; do
	wait_for "$ip answers from mypc" 60 answers "$ip" ||
		fail "$ip does not answer from mypc" "$LAB exec mypc -- ip neigh" "${KUBECTL[*]} get servicel2statuses -n $NS" \
			"$LAB exec <announcing node> -- iptables -t nat -S KUBE-SERVICES"
done

echo
echo "\$ kubectl get pods -n $NS -o custom-columns=NAME:.metadata.name,NODE:.spec.nodeName,IMAGE:.spec.containers[0].image,IMAGEID:.status.containerStatuses[0].imageID"
"${KUBECTL[@]}" get pods -n "$NS" -l app.kubernetes.io/name=ironlb \
	-o custom-columns='NAME:.metadata.name,NODE:.spec.nodeName,IMAGE:.spec.containers[0].image,IMAGEID:.status.containerStatuses[0].imageID'
echo
echo "\$ kubectl get ipaddresspools,l2advertisements -n $NS"
"${KUBECTL[@]}" get ipaddresspools,l2advertisements -n "$NS"
echo
echo "\$ kubectl get svc"
"${KUBECTL[@]}" get svc

for ip in "${IPS[@]}"; do
	echo
	echo "\$ bin/lab exec mypc -- sh -c 'for i in \$(seq 100); do curl -s $ip | grep Hostname; done | sort | uniq -c | sort -nr'"
	"$LAB" exec mypc -- sh -c "for i in \$(seq 100); do curl -s -m 2 $ip | grep Hostname; done | sort | uniq -c | sort -nr"
done

echo
echo "\$ bin/lab exec mypc -- ip neigh   (service IPs)"
"$LAB" exec mypc -- ip neigh show | grep -F -e "${IPS[0]} " -e "${IPS[1]} " -e "${IPS[2]} " || true
echo
echo "\$ kubectl get servicel2statuses -n $NS   (which node announces each service)"
"${KUBECTL[@]}" get servicel2statuses -n "$NS" \
	-o custom-columns='NAME:.metadata.name,SERVICE:.status.serviceName,NAMESPACE:.status.serviceNamespace,NODE:.status.node,INTERFACES:.status.interfaces[*].name'

# Tie it together: the MAC mypc learned for each IP, the node owning that MAC, and the node
# ServiceL2Status names. They agree when exactly one node answers ARP for the IP.
node_of_mac
echo
printf '%-8s %-16s %-19s %-22s %s\n' SERVICE EXTERNAL-IP "MAC (mypc's ARP)" "NODE WITH THAT MAC" "ANNOUNCER (ServiceL2Status)"
for i in "${!SERVICES[@]}"; do
	s=${SERVICES[$i]} ip=${IPS[$i]}
	mac=$(neigh_mac "$ip")
	ann=$(announcer "$s")
	printf '%-8s %-16s %-19s %-22s %s\n' "$s" "$ip" "${mac:-?}" "${NODE_OF_MAC[${mac:-none}]:-?}" "${ann:-?}"
done

cat <<EOF

>> done: the lab is up with ironlb and the walkthrough applied.
   kubeconfig: $KUBECONFIG_PATH
   look around:
     export KUBECONFIG=$KUBECONFIG_PATH
     bin/kubectl get pods -A -o wide
     bin/kubectl get servicel2statuses -n $NS
     bin/kubectl get events -n $NS
     bin/lab exec mypc -- curl -s ${IPS[0]}
     bin/lab exec mypc -- ip neigh
     bin/lab exec myk8s-worker -- iptables -t nat -S KUBE-SERVICES
     bin/lab logs $NS/<pod>          (pod logs)
     bin/lab kill-node myk8s-worker3 (take a node down hard; bin/lab restore-node to undo)
     make lab-status
   who announces what, as the speakers and the segment see it (the plugin is bin/kubectl-ironlb):
     export PATH=$ROOT/bin:\$PATH
     kubectl ironlb status
   tear down: make lab-down
EOF
