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
  [nft]=nftables
  [make]=make
  [git]=git
  # The lab's DNS server (lab up --dns: BIND, authoritative for lb.lab, RFC2136 updates
  # from external-dns) and dig to query it from mypc.
  [named]=bind9
  [dig]=bind9-dnsutils
)

missing=()
for cmd in "${!want[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || missing+=("${want[$cmd]}")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "ensure-packages: missing ${missing[*]}; run as root or: sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
echo ">> installing Debian packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# bind9's maintainer scripts would start (and enable) the system's named: a recursive
# resolver that queries the Internet's root servers. The lab runs its own named in a
# namespace only, so keep services from starting during the install (policy-rc.d, as in
# containers) unless the machine already has such a policy.
policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\n# Written by ironlb hack/ensure-packages.sh for one apt-get install.\nexit 101\n' > "$policy"
  chmod 755 "$policy"
  trap 'rm -f "$policy"' EXIT
fi
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# On a systemd machine the unit is still enabled for the next boot: disable it.
if [[ " ${missing[*]} " == *" bind9 "* ]] && command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
  systemctl disable --now named.service >/dev/null 2>&1 || true
fi
