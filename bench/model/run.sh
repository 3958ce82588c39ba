#!/usr/bin/env bash
# Model and agent figures (issue: models and agents):
#  - agent stream parse throughput (MB/s) and the runner's memory on a 100 MB stream;
#  - belay's added latency per model call against the replay server (median);
#  - the real-model smoke (SmolLM2-135M), when --smoke is given.
# Prints the JSON lines the benches print.
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo bench -q -p belay-agent --bench stream 2>/dev/null
cargo bench -q -p belay-model --bench latency 2>/dev/null
if [ "${1:-}" = "--smoke" ]; then
  cargo build --release -q -p belay
  BELAY="${CARGO_TARGET_DIR:-target}/release/belay" ./scripts/smoke-smollm2.sh
fi
