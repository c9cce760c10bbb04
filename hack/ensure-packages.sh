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
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
