#!/bin/sh
# The round supervisor on a copy of the notes repository, with a scripted
# agent (no model, deterministic): three rounds, alternating the draft and
# review phases. Round 2 leaves its work uncommitted: belay stashes it by SHA,
# and round 3 finds it in its round context and applies it.
#
#   ./examples/rounds-demo/run.sh            # the agent in a container (Docker)
#   ./examples/rounds-demo/run.sh --on-host  # the agent on this machine
set -eu
here=$(cd "$(dirname "$0")" && pwd)
belay=${BELAY:-belay}
command -v "$belay" >/dev/null 2>&1 || belay="cargo run -q --release -p belay --"
work=$(mktemp -d)
cp -r "$here/repo" "$work/repo"
(cd "$work/repo" && git init -q -b main && git add -A &&
  git -c user.name=demo -c user.email=demo@example.invalid commit -qm "notes: start")
sed -e "s#@AGENTS@#$here/agents#" -e "s#@WORK@#$work#" "$here/agent-runner.toml" > "$work/agent-runner.toml"
if [ "${1:-}" = "--on-host" ]; then
  sed -i 's/^# placement = "host".*/placement = "host"/' "$work/agent-runner.toml"
fi
$belay rounds --config "$work/agent-runner.toml" doctor
$belay rounds --config "$work/agent-runner.toml" serve
$belay rounds --config "$work/agent-runner.toml" status
git -C "$work/repo" log --format='%h %s'
echo "config: $work/agent-runner.toml"
