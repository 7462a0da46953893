#!/usr/bin/env bash
# The lints of CI: clippy on every target and feature, rustdoc's link checks, and the MSRV check.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo clippy --workspace --all-targets --all-features -- -D warnings
RUSTDOCFLAGS="-D rustdoc::broken_intra_doc_links -D rustdoc::private_intra_doc_links" \
  cargo doc --workspace --no-deps --all-features --quiet
bash scripts/msrv.sh
