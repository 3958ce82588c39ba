#!/usr/bin/env bash
# The pipeline demo, deterministic: copies repo/ into a fresh git repository,
# serves replay.yaml as the model on :18765, and runs `belay run pipeline.yaml`.
#   ./examples/pipeline-demo/run.sh [BELAY_BINARY]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
belay=${1:-$here/../../target/release/belay}
work=$(mktemp -d /tmp/belay-pipeline-demo.XXXXXX)
cp -r "$here/repo/." "$work/"
git -C "$work" init -q -b main
git -C "$work" add -A
git -C "$work" -c user.name=demo -c user.email=demo@localhost commit -q -m "calc: initial"
"$belay" model replay --script "$here/replay.yaml" --port 18765 --log "$work/../$(basename "$work")-requests.jsonl" >/dev/null &
replay=$!
trap 'kill $replay 2>/dev/null || true' EXIT
sleep 0.5
"$belay" run "$work/pipeline.yaml" --state-dir "$work.state"
git -C "$work" log --stat -1
