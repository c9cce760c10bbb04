#!/usr/bin/env bash
# ensure-packages.sh installs the Debian packages ironlb's tests and lab need, only when a
# command is missing, so it is fast and idempotent on a prepared machine.
set -euo pipefail

# command -> Debian package that provides it.
declare -A want=(
  [ip]=iproute2
  [iptables]=iptables
  [conntrack]=conntrack
  [curl]=curl
  [arping]=arping
  [ndisc6]=ndisc6
  [tcpdump]=tcpdump
  [promtool]=prometheus   # the lab's Prometheus (lab up --prometheus), `promtool test rules`
  [make]=make
  [git]=git
)

missing=()
for cmd in "${!want[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || missing+=("${want[$cmd]}")
done
# The Debian prometheus package ships a systemd service: it must never run on this host
# (the lab starts its own Prometheus inside a lab namespace). Disabled after an install, and
# checked on every run in case the package came some other way.
stop_host_prometheus() {
  if [ -d /run/systemd/system ] && systemctl is-enabled prometheus >/dev/null 2>&1; then
    systemctl disable --now prometheus >/dev/null 2>&1 || true
  fi
}
if [ ${#missing[@]} -eq 0 ]; then
  stop_host_prometheus
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "ensure-packages: missing ${missing[*]}; run as root or: sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
echo ">> installing Debian packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# No service may start during the install (a container's /usr/sbin/policy-rc.d often says so
# already): otherwise a temporary policy-rc.d denies every start, removed afterwards.
policy=/usr/sbin/policy-rc.d
ours=
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\n# hack/ensure-packages.sh: no service starts during the install\nexit 101\n' >"$policy"
  chmod 755 "$policy"
  ours=1
fi
trap '[ -z "$ours" ] || rm -f "$policy"' EXIT
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
stop_host_prometheus
