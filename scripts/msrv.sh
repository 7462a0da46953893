#!/usr/bin/env bash
# MSRV check: every crate of the workspace and every dependency it builds on this platform must
# declare a `rust-version` no newer than the workspace's own. (Only one toolchain can be
# installed here; clippy's `incompatible_msrv` lint checks our own use of newer std APIs.)
set -euo pipefail
cd "$(dirname "$0")/.."
target="$(rustc -vV | sed -n 's/^host: //p')"
cargo metadata --format-version 1 --locked --filter-platform "$target" | python3 -c '
import json, sys
meta = json.load(sys.stdin)
members = set(meta["workspace_members"])
def key(v):
    parts = [int(x) for x in v.split(".")]
    return tuple(parts + [0] * (3 - len(parts)))
msrv = max((p.get("rust_version") or "0" for p in meta["packages"] if p["id"] in members), key=key)
resolved = {n["id"] for n in meta["resolve"]["nodes"]}
bad = []
for p in meta["packages"]:
    rv = p.get("rust_version")
    if p["id"] in resolved and rv and key(rv) > key(msrv):
        bad.append("%s %s needs Rust %s" % (p["name"], p["version"], rv))
print("MSRV %s: %d crates checked" % (msrv, len(resolved)))
if bad:
    print("newer than the declared rust-version:\n  " + "\n  ".join(sorted(bad)))
    sys.exit(1)
'
