#!/usr/bin/env bash
# redis-server's instructions per uncontended lock + release, counted by `valgrind
# --tool=callgrind` on the server (the same on a noisy machine as on a quiet one): fencelock
# against rslock and the bare recipe, each driving its own `redis-server` under callgrind.
# Prints a markdown table. Needs valgrind and redis-server. INSTRUCTIONS_ONLY="redis-fencelock"
# counts only that row; INSTRUCTIONS_BIN=path runs that build of the example instead (to compare
# two versions of the scripts).
#
# Each row runs twice, 50 and 250 acquisitions (bench/examples/instructions.rs), and prints the
# difference over 200: the server's start, the connections and the scripts' loading are left
# out.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "valgrind is not installed (apt-get install valgrind)" >&2; exit 1; }
command -v redis-server >/dev/null || { echo "redis-server is not installed" >&2; exit 1; }
bin="${INSTRUCTIONS_BIN:-}"
if [ -z "$bin" ]; then
  cargo build --release -q -p fencelock-bench --example instructions
  bin=target/release/examples/instructions
fi
work="$(mktemp -d)"
pid=""
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$work"' EXIT
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
count() { # what n → the server's instructions
  valgrind --tool=callgrind --callgrind-out-file="$work/callgrind.out" \
    redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" \
    >"$work/server.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 150); do
    redis-cli -p "$port" ping >/dev/null 2>&1 && break
    sleep 0.2
  done
  "$bin" "$1" "$2" "redis://127.0.0.1:$port" >/dev/null
  redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
  wait "$pid" || true
  pid=""
  awk '/Collected :/ { gsub(",", "", $4); print $4 }' "$work/server.log"
}
echo "| client, lock + release | redis-server instructions per acquisition |"
echo "|---|---:|"
for what in ${INSTRUCTIONS_ONLY:-redis-fencelock redis-rslock redis-bare}; do
  small=$(count "$what" 50)
  large=$(count "$what" 250)
  echo "| $what | $(((large - small) / 200)) |"
done
