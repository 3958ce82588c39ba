#!/usr/bin/env bash
# The dashboard's figures, measured in one run against the release binary:
# an event's append to the browser's DOM (median, p95), the server's RSS idle
# and with 1,000 runs in the registry, the first load of the 1,000-run list
# to interactive, and the bytes the embedded page adds to the binary.
# Needs chromium and chromium-driver (scripts/setup-host.sh --tests installs them).
#   ./bench/ui/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release -p belay --locked
target=${CARGO_TARGET_DIR:-target}
BELAY_BIN="$target/release/belay" cargo test -p belay --test ui --locked -- \
  --ignored bench_figures --nocapture 2>&1 | grep '^UI-BENCH' | sed 's/^UI-BENCH //'
ls -l "$target/release/belay" | awk '{print "release binary bytes:", $5}'
