#!/usr/bin/env bash
# Installs what a fresh Debian machine lacks to run every test of fencelock (a C toolchain, etcd
# and etcdctl, ZooKeeper with a Java runtime, protoc and protobuf's well-known types, Curator,
# PostgreSQL, Redis) through apt-get; does nothing when all is there.
set -euo pipefail

need=()
command -v cc >/dev/null 2>&1 || need+=(build-essential)
command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
command -v etcdctl >/dev/null 2>&1 || need+=(etcd-client)   # the CLI's interop tests
command -v protoc >/dev/null 2>&1 || need+=(protobuf-compiler)
# etcd-client's build imports protobuf's well-known types (descriptor.proto, struct.proto).
[ -f /usr/include/google/protobuf/descriptor.proto ] || need+=(libprotobuf-dev)
[ -f /usr/share/java/zookeeper.jar ] || need+=(zookeeper)
command -v java >/dev/null 2>&1 || need+=(default-jre-headless)
command -v javac >/dev/null 2>&1 || need+=(default-jdk-headless)   # the Curator interop tests
[ -f /usr/share/java/curator-recipes.jar ] || need+=(libcurator-recipes-java)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)   # worked examples
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)   # the Redis backend (and redis-cli)
python3 -c 'import json' >/dev/null 2>&1 || need+=(python3)   # test.sh lists the test targets (python3-minimal has no json)
command -v script >/dev/null 2>&1 || need+=(bsdutils)   # the CLI's terminal-hangup test
command -v setsid >/dev/null 2>&1 || need+=(util-linux)
if [ ${#need[@]} -gt 0 ]; then
  echo "== installing: ${need[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
