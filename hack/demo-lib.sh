# demo-lib.sh: what hack/demo.sh and hack/demo-dualstack.sh share; sourced, not run.
# The caller sets ROOT and DEMO (its make target, for the hints).
NS=metallb-system
KUBECONFIG_PATH="$ROOT/.lab/kubeconfig"
KUBECTL=("$ROOT/bin/kubectl" --kubeconfig "$KUBECONFIG_PATH")
HELM=("$ROOT/bin/helm" --kubeconfig "$KUBECONFIG_PATH")
LAB="$ROOT/bin/lab"

step() { echo ">> $*"; }
# fail prints what went wrong and what to do next, then exits.
fail() {
	echo "!! $1" >&2
	shift
	for hint in "$@"; do echo "   next: $hint" >&2; done
	exit 1
}
trap 'rc=$?; [ $rc -eq 0 ] || echo "!! $DEMO failed (exit $rc); the lab is left as it is: look around with the hints above, or start over with: make lab-down && make $DEMO" >&2' EXIT

# build DESCRIPTION MAKE_ARGS...: runs make for one component of the demo, its output in
# /tmp/ironlb-demo-build.log, with a line when it starts, one every 30 s while it runs (never
# minutes of silence) and one with its elapsed time when done; on failure, the log's tail.
build() {
	local what=$1 start=$SECONDS total_start=${DEMO_BUILD_START:-$SECONDS}
	shift
	DEMO_BUILD_START=$total_start
	step "building $what"
	(while sleep 30; do echo "   ... still building $what ($((SECONDS - start)) s; the whole build so far $((SECONDS - total_start)) s)"; done) &
	local beat=$!
	if ! make --no-print-directory "$@" >>/tmp/ironlb-demo-build.log 2>&1; then
		kill "$beat" 2>/dev/null || true
		fail "building $what failed; the log is /tmp/ironlb-demo-build.log:" "tail -50 /tmp/ironlb-demo-build.log"
	fi
	kill "$beat" 2>/dev/null || true
	wait "$beat" 2>/dev/null || true
	step "built $what ($((SECONDS - start)) s)"
}

# wait_for DESCRIPTION TIMEOUT_SECONDS COMMAND...: polls COMMAND every second until it succeeds.
wait_for() {
	local what=$1 timeout=$2 start=$SECONDS
	shift 2
	until "$@" >/dev/null 2>&1; do
		if ((SECONDS - start >= timeout)); then
			return 1
		fi
		sleep 1
	done
	step "$what ($((SECONDS - start)) s)"
}

# url IP: the URL of port 80 of an IPv4 or IPv6 address.
url() { case $1 in *:*) echo "http://[$1]/" ;; *) echo "http://$1/" ;; esac; }

# answers IP: one request from mypc to IP succeeds.
answers() { "$LAB" exec mypc -- curl -s -m 1 -o /dev/null "$(url "$1")"; }

# node_of_mac fills NODE_OF_MAC: each node's eth0 MAC -> node name.
declare -A NODE_OF_MAC
node_of_mac() {
	local node mac
	for node in $("${KUBECTL[@]}" get nodes -o jsonpath='{.items[*].metadata.name}'); do
		mac=$("$LAB" exec "$node" -- cat /sys/class/net/eth0/address 2>/dev/null || true)
		[ -n "$mac" ] && NODE_OF_MAC[$mac]=$node
	done
}

# neigh_mac IP: the MAC in mypc's neighbour entry for IP.
neigh_mac() { "$LAB" exec mypc -- ip neigh show to "$1" | grep -o 'lladdr [0-9a-f:]*' | cut -d' ' -f2 || true; }

# announcer SERVICE: the node ServiceL2Status names for default/SERVICE.
announcer() {
	"${KUBECTL[@]}" get servicel2statuses -n "$NS" -l "metallb.io/service-name=$1,metallb.io/service-namespace=default" \
		-o jsonpath='{.items[*].status.node}'
}
