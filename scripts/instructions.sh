#!/usr/bin/env bash
# Client instructions per uncontended lock + release, counted by `valgrind --tool=callgrind`
# (the same on a noisy machine as on a quiet one): fencelock against the peers' recipes and
# the raw requests, on etcd, ZooKeeper and Redis. Prints a markdown table. Needs valgrind, etcd,
# ZooKeeper and Redis (scripts/install.sh, plus `apt-get install valgrind`). INSTRUCTIONS_ONLY=
# "redis-fencelock redis-bare" counts only those rows.
#
# Each row runs its program twice under callgrind, 50 and 250 acquisitions, and prints the
# difference over 200: connecting and starting the session are left out. See
# bench/examples/instructions.rs.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "valgrind is not installed (apt-get install valgrind)" >&2; exit 1; }
cargo build --release -q -p fencelock-bench --example instructions
bin=target/release/examples/instructions
work="$(mktemp -d)"
# The servers run natively, in a process group of their own. The trap asks the serving
# process to stop them (it removes their data dirs as it does), then stops whatever is left.
setsid "$bin" serve >"$work/addresses" 2>"$work/serve.log" &
serve=$!
stop_servers() {
  kill "$serve" 2>/dev/null || true
  for _ in $(seq 1 100); do kill -0 "$serve" 2>/dev/null || break; sleep 0.1; done
  kill -- -"$serve" 2>/dev/null || true
  wait "$serve" 2>/dev/null || true
  rm -rf "$work"
}
trap stop_servers EXIT
for _ in $(seq 1 120); do
  [ -s "$work/addresses" ] && break
  kill -0 "$serve" 2>/dev/null || { cat "$work/serve.log" >&2; exit 1; }
  sleep 0.5
done
[ -s "$work/addresses" ] || { echo "the servers did not start within a minute" >&2; exit 1; }
read -r etcd zookeeper redis <"$work/addresses"
count() { # what n address → instructions
  valgrind --tool=callgrind --callgrind-out-file="$work/$1.$2" "$bin" "$1" "$2" "$3" 2>&1 |
    awk '/Collected :/ { gsub(",", "", $4); print $4 }'
}
echo "| client, lock + release | instructions per acquisition |"
echo "|---|---:|"
for what in ${INSTRUCTIONS_ONLY:-memory-fencelock etcd-fencelock etcd-client-lock etcd-raw-txn zookeeper-fencelock zookeeper-fencelock-4 zookeeper-client-lock zookeeper-client-lock-4 zookeeper-raw redis-fencelock redis-fencelock-4 redis-rslock redis-bare}; do
  case "$what" in etcd-*) address="http://$etcd" ;; redis-*) address="$redis" ;; *) address="$zookeeper" ;; esac
  small=$(count "$what" 50 "$address")
  large=$(count "$what" 250 "$address")
  echo "| $what | $(((large - small) / 200)) |"
done
