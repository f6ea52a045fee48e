#!/usr/bin/env bash
# Installs what the test suite needs and is missing on this machine:
# redis-server and redis-cli (Debian packages redis-server, redis-tools) and
# nft (nftables).
# As root with apt-get it installs them; otherwise it says what to install
# and fails.
set -euo pipefail

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
# The deployed tests (e2e, internal/netlab) cut links with nftables inside
# network namespaces; they need root, so nft is installed only as root (the
# tests say they skip without root).
if [ "$(id -u)" = 0 ]; then command -v nft >/dev/null 2>&1 || missing+=(nftables); fi

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "deps: installing ${missing[*]} with apt-get" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
  # The Debian package starts a system redis on 6379; the tests never use it,
  # but stop it so it costs nothing.
  if command -v systemctl >/dev/null 2>&1; then systemctl stop redis-server >/dev/null 2>&1 || true; fi
  service redis-server stop >/dev/null 2>&1 || true
  exit 0
fi

echo "deps: missing ${missing[*]}; install them, e.g. 'sudo apt-get install -y redis-server redis-tools'" >&2
exit 1
