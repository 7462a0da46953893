#!/usr/bin/env bash
# Runs every test of fencelock against real servers.
#
# Installs what a fresh Debian machine lacks (a C toolchain, etcd and etcdctl, ZooKeeper with a
# Java runtime, protoc and protobuf's well-known types, Curator, PostgreSQL, Redis) through
# apt-get, then runs the whole workspace's tests. The test harnesses start etcd, ZooKeeper,
# PostgreSQL and Redis themselves on free loopback ports with temporary data dirs, and stop them
# (by PID) when the tests end. With CI=true a missing server fails the run instead of skipping.
set -euo pipefail
cd "$(dirname "$0")/.."

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
if [ ${#need[@]} -gt 0 ]; then
  echo "== installing: ${need[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

echo "== cargo test (workspace; etcd, ZooKeeper, PostgreSQL and Redis are started by the harnesses)"
cargo test --workspace --all-targets "$@" -- --skip adversity_
cargo test --workspace --doc "$@"

echo "== adversity suite: 3-member etcd cluster, 3-server ZooKeeper ensemble, Redis primary + replica, side by side"
# `--workspace`, not `-p`: the features resolve as for the tests above, whose builds of the
# dependencies are reused (`-p` resolved fewer and rebuilt them: two minutes of a CI run).
# The suites share nothing (own clusters, own ports) and mostly wait on faults: run them at
# once, each printing its summary tables (etcd and ZooKeeper run their crash and gray parts
# side by side too, each part on a cluster of its own).
cargo test --workspace --test etcd_cluster --test zookeeper_cluster --test redis_cluster --no-run "$@"
logs="$(mktemp -d)"
cargo test --workspace --test etcd_cluster "$@" -- --nocapture --test-threads 2 >"$logs/etcd" 2>&1 &
etcd_pid=$!
cargo test --workspace --test zookeeper_cluster "$@" -- --nocapture --test-threads 2 >"$logs/zookeeper" 2>&1 &
zk_pid=$!
cargo test --workspace --test redis_cluster "$@" -- --nocapture >"$logs/redis" 2>&1 &
redis_pid=$!
status=0
wait "$etcd_pid" || status=1
wait "$zk_pid" || status=1
wait "$redis_pid" || status=1
cat "$logs/etcd" "$logs/zookeeper" "$logs/redis"
rm -rf "$logs"
exit "$status"
