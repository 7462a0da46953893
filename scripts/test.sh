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

bash scripts/install.sh

echo "== cargo test (workspace; etcd, ZooKeeper, PostgreSQL and Redis are started by the harnesses)"
# Every package but the benchmark (`bench/`, which has no tests: the lints check it). Every
# cargo command below selects the same packages, so that the dependencies' features resolve
# alike and their builds are shared.
packages=(--workspace --exclude fencelock-bench)
# The fault suites (`adversity_*`, and the paused-member tests `gray_*`) run below, side by side.
cargo test "${packages[@]}" --all-targets --no-run "$@"
# The test binaries mostly wait (on servers starting, on timeouts): they run in two lanes side
# by side, each printing its output when it ends. ZooKeeper's tests (whose servers start
# slowest), the worked examples and the two longest Redis targets (Cluster mode, Sentinel) in
# one; every other test target (found in the packages' metadata, so that a new one is never left
# out), the unit tests and the doctests in the other. (Without the two Redis targets the second
# lane took ~5.5 min in CI and the first ~2.5.)
mapfile -t test_targets < <(cargo metadata --no-deps --format-version 1 | python3 -c '
import json, sys
for p in json.load(sys.stdin)["packages"]:
    if p["name"] != "fencelock-bench":
        for t in p["targets"]:
            if "test" in t["kind"]:
                print(t["name"])')
# Empty, every target would run in one lane beside the other's repeat of the unit tests.
[ ${#test_targets[@]} -gt 0 ] || { echo "test.sh: no test targets listed (python3 with json?)" >&2; exit 1; }
slow=() rest=()
for t in "${test_targets[@]}"; do
  case "$t" in
    zookeeper* | worked_examples | leader_example | long_held_example | redis_cluster_mode | redis_sentinel)
      slow+=("--test=$t") ;;
    *) rest+=("--test=$t") ;;
  esac
done
lanes="$(mktemp -d)"
# The fault suites' tests by their prefixes (a unit test whose name merely contains `gray_`
# still runs here).
skip=(-- --skip adversity_ --skip gray_etcd_ --skip gray_zookeeper_)
# Every cargo test is bounded (the whole test process group is killed after 20 minutes, where a
# lane takes 3–6): a hung test then fails the run with its lane's log printed, instead of
# running on, silent, until CI's own limit.
bounded() { timeout --kill-after=30s 1200 "$@"; }
bounded cargo test "${packages[@]}" "${slow[@]}" "$@" "${skip[@]}" >"$lanes/slow" 2>&1 &
slow_pid=$!
lane=0
{ bounded cargo test "${packages[@]}" --lib --bins --examples "${rest[@]}" "$@" "${skip[@]}" &&
  bounded cargo test "${packages[@]}" --doc "$@"; } >"$lanes/rest" 2>&1 || lane=1
wait "$slow_pid" || lane=1
cat "$lanes/rest" "$lanes/slow"
rm -rf "$lanes"
if [ "$lane" != 0 ]; then
  echo "== tests failed (above)"
  exit 1
fi

echo "== fault suites: 3-member etcd clusters, 3-server ZooKeeper ensembles, Redis primary + replica, side by side"
# The packages as above, not `-p`: the features resolve as for the tests above, whose builds of
# the dependencies are reused (`-p` resolved fewer and rebuilt them: two minutes of a CI run).
# The suites share nothing (own clusters, own ports) and mostly wait on faults: run them at
# once, each printing its summary tables (etcd and ZooKeeper run their crash and gray parts
# side by side too, each part on a cluster of its own). The paused-member tests follow the
# shorter suites (Redis ~3 min, etcd ~4.5 min, ZooKeeper ~5.5 min in CI), so that the phase
# lasts as long as the longest suite.
tests=(etcd_cluster zookeeper_cluster redis_cluster paused_member zookeeper_paused_server)
cargo test "${packages[@]}" "${tests[@]/#/--test=}" --no-run "$@"
logs="$(mktemp -d)"
cargo_args=("$@")
suite() {   # suite <test> <test binary's arguments>...: its output into the log of its name
  local test="$1"
  shift
  bounded cargo test "${packages[@]}" --test "$test" "${cargo_args[@]}" -- --nocapture "$@" >"$logs/$test" 2>&1
}
(s=0; suite etcd_cluster --test-threads 2 || s=1; suite zookeeper_paused_server gray_ || s=1; exit $s) &
etcd_pid=$!
suite zookeeper_cluster --test-threads 2 &
zk_pid=$!
(s=0; suite redis_cluster || s=1; suite paused_member gray_ || s=1; exit $s) &
redis_pid=$!
status=0
wait "$etcd_pid" || status=1
wait "$zk_pid" || status=1
wait "$redis_pid" || status=1
for test in "${tests[@]}"; do
  if [ -f "$logs/$test" ]; then cat "$logs/$test"; fi
done
rm -rf "$logs"
exit "$status"
