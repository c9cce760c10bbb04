#!/usr/bin/env bash
# demo-dualstack.sh: the walkthrough (hack/demo.sh), then examples/dualstack on top of it: a
# pool with an IPv4 and an IPv6 range and three Services (SingleStack IPv6, PreferDualStack,
# RequireDualStack) in front of the walkthrough's pods. Shows `kubectl get svc` with both
# EXTERNAL-IPs, 100 `curl -6` per IPv6 IP from mypc with the backends that answered, mypc's
# neighbour entries and which node announces each Service (both families from one node).
#
# Needs root and the dual-stack lab (the default; not LAB_IP_FAMILY=ipv4). Run as
# `make demo-dualstack`. The lab is left running; `make lab-down` removes it.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
DEMO=demo-dualstack
SERVICES=(svc-v6 svc-prefer svc-require)
# shellcheck source=hack/demo-lib.sh
. "$ROOT/hack/demo-lib.sh"

[ "${LAB_IP_FAMILY:-dual}" = dual ] ||
	fail "LAB_IP_FAMILY=$LAB_IP_FAMILY: the dual-stack demo needs the dual-stack lab" "make lab-down && make $DEMO"
"$ROOT/hack/demo.sh"
export KUBECONFIG="$KUBECONFIG_PATH"

echo
step "applying examples/dualstack: pool.yaml (IPv4 and IPv6 ranges), services.yaml"
"${KUBECTL[@]}" apply -f examples/dualstack/pool.yaml -f examples/dualstack/services.yaml

# ingress SERVICE: the Service's EXTERNAL-IPs, one per line.
ingress() { "${KUBECTL[@]}" get svc "$1" -o jsonpath='{range .status.loadBalancer.ingress[*]}{.ip}{"\n"}{end}'; }
# complete: svc-v6 has one IP, the two dual-stack Services two each.
complete() {
	[ "$(ingress svc-v6 | wc -l)" -eq 1 ] && [ "$(ingress svc-prefer | wc -l)" -eq 2 ] && [ "$(ingress svc-require | wc -l)" -eq 2 ]
}
wait_for "EXTERNAL-IPs of both families assigned" 120 complete ||
	fail "the dual-stack Services did not get their addresses" "${KUBECTL[*]} get svc" \
		"${KUBECTL[*]} describe svc svc-require" "${KUBECTL[*]} get ipaddresspools -n $NS -o wide"
announced() { local s; for s in "${SERVICES[@]}"; do [ -n "$(announcer "$s")" ] || return 1; done; }
wait_for "every dual-stack Service announced (ServiceL2Status)" 120 announced ||
	fail "not every Service has an announcing node" "${KUBECTL[*]} get servicel2statuses -n $NS" "$LAB logs $NS/<speaker pod>"
for s in "${SERVICES[@]}"; do
	for ip in $(ingress "$s"); do
		wait_for "$ip answers from mypc" 60 answers "$ip" ||
			fail "$ip does not answer from mypc" "$LAB exec mypc -- ip -6 neigh" \
				"$LAB exec <announcing node> -- ip6tables -t nat -S KUBE-SERVICES"
	done
done

echo
echo "\$ kubectl get svc"
"${KUBECTL[@]}" get svc
for s in "${SERVICES[@]}"; do
	for ip in $(ingress "$s"); do
		case $ip in *:*) ;; *) continue ;; esac
		echo
		echo "\$ bin/lab exec mypc -- sh -c 'for i in \$(seq 100); do curl -6 -s http://[$ip]/ | grep Hostname; done | sort | uniq -c'"
		"$LAB" exec mypc -- sh -c "for i in \$(seq 100); do curl -6 -s -m 2 'http://[$ip]/' | grep Hostname || echo FAILED; done | sort | uniq -c | sort -nr"
	done
done
echo
echo "\$ bin/lab exec mypc -- ip -6 neigh   (service IPs)"
"$LAB" exec mypc -- ip -6 neigh show | grep -F ':ffff::' || true

node_of_mac
echo
printf '%-12s %-30s %-19s %-20s %s\n' SERVICE EXTERNAL-IP "MAC (mypc's neigh)" "NODE WITH THAT MAC" "ANNOUNCER (ServiceL2Status)"
for s in "${SERVICES[@]}"; do
	ann=$(announcer "$s")
	for ip in $(ingress "$s"); do
		mac=$(neigh_mac "$ip")
		printf '%-12s %-30s %-19s %-20s %s\n' "$s" "$ip" "${mac:-?}" "${NODE_OF_MAC[${mac:-none}]:-?}" "${ann:-?}"
	done
done

cat <<EOT

>> done: the walkthrough and examples/dualstack are applied; both addresses of a Service are
   answered by the node ServiceL2Status names.
   bin/lab exec mypc -- curl -6 -s 'http://[$(ingress svc-v6)]/'
   bin/lab exec mypc -- ndisc6 $(ingress svc-v6) eth0      (who answers NDP for it)
   tear down: make lab-down
EOT
