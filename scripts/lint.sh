#!/usr/bin/env bash
# The lints of CI: clippy on every target and feature, rustdoc's link checks, and the MSRV check.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo clippy --workspace --all-targets --all-features -- -D warnings
RUSTDOCFLAGS="-D rustdoc::broken_intra_doc_links -D rustdoc::private_intra_doc_links" \
  cargo doc --workspace --no-deps --all-features --quiet
bash scripts/msrv.sh
# Each published crate built alone, with its default features: in the workspace, the features
# other crates enable on shared dependencies are unified and can hide one a crate forgot to ask
# for (fencelock used Tokio's macros without asking for them, and `cargo check -p fencelock`
# failed while every workspace build passed).
for p in fencelock fencelock-net fencelock-etcd fencelock-zookeeper fencelock-redis fencelock-cli; do
  cargo check --quiet -p "$p"
done
