#!/bin/sh
# The plan loop on a copy of the demo repository, with scripted agents (no
# model, deterministic): c1 is built and approved; c2's first build breaks
# the tests, belay's own gate sends it back without a review, the second
# build passes and is approved. Every step is a commit on feature/greet.
#
#   ./examples/plan-demo/run.sh            # agents in containers (Docker)
#   ./examples/plan-demo/run.sh --on-host  # agents on the host (the gate still needs Docker)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
belay=${BELAY:-belay}
command -v "$belay" >/dev/null 2>&1 || belay="cargo run -q --release -p belay --"
work=$(mktemp -d)
cp -r "$here/repo" "$work/repo"
cd "$work/repo"
git init -q -b main
git add -A
git -c user.name=demo -c user.email=demo@example.invalid commit -qm "greet: the plan"
$belay plan validate
$belay plan run \
  --developer "cmd:$here/agents/developer.sh" \
  --reviewer "cmd:$here/agents/reviewer.sh" "$@"
git log --format='%h %s' main..feature/greet
echo "repository: $work/repo"
