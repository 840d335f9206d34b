#!/usr/bin/env bash
# Installs the system packages the tests use, only when they are missing: PostgreSQL 15
# (the tests start a throwaway cluster of their own), a Java runtime (for Spark) and the
# openssl command (the TLS tests make their own certificate authority with it), and Chromium
# with its WebDriver (the web console's browser test drives them headless), and Node.js with
# npm (the Node SDK's compatibility test installs the SDK from the npm registry), Redis and
# NATS (benchmark peers) and etcd (the cluster's control plane), and, as root, nftables (the
# nemesis's partitions between network namespaces; without root it cuts with TCP proxies).
set -euo pipefail
need=()
pg_bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
if [ -z "$pg_bin" ] || [ ! -x "$pg_bin/initdb" ]; then need+=(postgresql); fi
if ! command -v java >/dev/null 2>&1; then need+=(openjdk-17-jre-headless); fi
if ! command -v openssl >/dev/null 2>&1; then need+=(openssl); fi
if [ ! -x /usr/bin/chromium ]; then need+=(chromium); fi
if [ ! -x /usr/bin/chromedriver ]; then need+=(chromium-driver); fi
if ! command -v node >/dev/null 2>&1; then need+=(nodejs); fi
if ! command -v npm >/dev/null 2>&1; then need+=(npm); fi
# benchmark peers (Redis Streams, NATS JetStream) and the cluster's control plane (etcd)
if [ ! -x /usr/bin/redis-server ]; then need+=(redis-server); fi
if [ ! -x /usr/sbin/nats-server ] && ! command -v nats-server >/dev/null 2>&1; then need+=(nats-server); fi
if [ ! -x /usr/bin/etcd ]; then need+=(etcd-server); fi
# the nemesis's network namespaces (root only; iproute2's ip is there already)
if [ "$(id -u)" -eq 0 ] && [ ! -x /usr/sbin/nft ] && ! command -v nft >/dev/null 2>&1; then need+=(nftables); fi
if [ ${#need[@]} -eq 0 ]; then exit 0; fi
if [ "$(id -u)" -ne 0 ]; then
  echo "missing system packages: ${need[*]}; install them (apt-get install ${need[*]})" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}"
