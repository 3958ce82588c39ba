#!/usr/bin/env bash
# The dashboard without Docker or a model: replays a recorded pipeline run and a
# recorded env build into a fresh state directory and serves `belay ui` on it.
#   ./examples/ui-demo/run.sh [BELAY_BINARY] [--speed N]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
belay=${1:-$here/../../target/release/belay}
shift || true
home=$(mktemp -d /tmp/belay-ui-demo.XXXXXX)
export BELAY_STATE_HOME=$home
"$belay" ui --port "${BELAY_UI_PORT:-0}" > "$home/url" &
ui=$!
trap 'kill $ui 2>/dev/null || true' EXIT
for _ in $(seq 50); do [ -s "$home/url" ] && break; sleep 0.1; done
echo "open $(head -1 "$home/url")"
python3 "$here/replay.py" "$home" "$here/recorded/pipeline" "$here/recorded/env-build" "$@"
echo "replayed; the page stays up until Ctrl-C"
wait $ui
