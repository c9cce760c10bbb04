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

# build_step CHAIN DESCRIPTION MAKE_ARGS...: runs make for one component of the demo, its
# output appended to the chain's log, with a line when it starts and one with its elapsed
# time when done. The component building now is in $BUILD_DIR/CHAIN.now for the heartbeat.
BUILD_DIR=/tmp/ironlb-demo-build
build_step() {
	local chain=$1 what=$2 start=$SECONDS
	shift 2
	step "building $what"
	echo "$SECONDS $what" >"$BUILD_DIR/$chain.now"
	if ! make --no-print-directory "$@" >>"$BUILD_DIR/$chain.log" 2>&1; then
		echo "!! building $what failed; the log is $BUILD_DIR/$chain.log" >&2
		return 1
	fi
	rm -f "$BUILD_DIR/$chain.now"
	step "built $what ($((SECONDS - start)) s)"
}

# build_chains HINT CHAIN...: runs the chains (functions of build_step calls, named after
# their chain) at once, so that one component's downloads and links overlap another's
# compiles on a small machine; every 30 s one line says what is still building (never
# minutes of silence), with HINT on what is left. When a chain fails the others are
# stopped and the demo fails with the failed log's tail.
build_chains() {
	local hint=$1 start=$SECONDS c i
	shift
	local -a chains=("$@")
	rm -rf "$BUILD_DIR" && mkdir -p "$BUILD_DIR"
	local -a pids=()
	set -m # each chain in its own process group: a failure stops all of its makes
	for c in "$@"; do
		"$c" &
		pids+=($!)
	done
	set +m
	local left=$# beat=$((SECONDS + ${DEMO_BEAT:-30}))
	while ((left > 0)); do
		sleep 1
		for i in "${!pids[@]}"; do
			[ -n "${pids[$i]}" ] && ! kill -0 "${pids[$i]}" 2>/dev/null || continue
			if ! wait "${pids[$i]}"; then
				for c in "${pids[@]}"; do [ -z "$c" ] || kill -- -"$c" 2>/dev/null || true; done
				fail "building the demo failed (the other builds were stopped)" "tail -50 $BUILD_DIR/${chains[$i]}.log"
			fi
			pids[i]=""
			left=$((left - 1))
		done
		if ((left > 0 && SECONDS >= beat)); then
			beat=$((SECONDS + ${DEMO_BEAT:-30}))
			local now="" f since what
			for f in "$BUILD_DIR"/*.now; do
				read -r since what <"$f" 2>/dev/null || continue
				now+="${now:+; }$what ($((SECONDS - since)) s)"
			done
			echo "   ... still building: ${now:-?}; the whole build so far $((SECONDS - start)) s ($hint)"
		fi
	done
	step "built everything ($((SECONDS - start)) s)"
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
