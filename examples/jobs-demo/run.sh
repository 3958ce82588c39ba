#!/bin/sh
# The job queue builder on a copy of a one-page site, with a scripted agent
# (no model, deterministic). Three jobs: the owner's (committed and pushed),
# a third party's (waits for the owner's `accept`, then committed), and one
# whose answer has no commit block (nothing committed).
#
#   ./examples/jobs-demo/run.sh            # the agent in a container (Docker)
#   ./examples/jobs-demo/run.sh --on-host  # the agent on this machine
set -eu
here=$(cd "$(dirname "$0")" && pwd)
belay=${BELAY:-belay}
command -v "$belay" >/dev/null 2>&1 || belay="cargo run -q --release -p belay --"
work=$(mktemp -d)
git init -q --bare -b main "$work/remote.git"
cp -r "$here/site" "$work/site"
(cd "$work/site" && git init -q -b main && git add -A &&
  git -c user.name=demo -c user.email=demo@example.invalid commit -qm "site: start" &&
  git remote add origin "$work/remote.git" && git push -q -u origin main)
sed -e "s#@AGENTS@#$here/agents#" -e "s#@WORK@#$work#" "$here/jobs.toml" > "$work/jobs.toml"
if [ "${1:-}" = "--on-host" ]; then
  sed -i 's/^placement = "container".*/placement = "host"/' "$work/jobs.toml"
fi
jobs="$belay jobs --config $work/jobs.toml"
$jobs submit "Please make the title friendlier."
third=$($jobs submit --sender friend@example.invalid "Could you add a footer?" | cut -d' ' -f1)
$jobs submit "Is the site fine?"
$jobs list
$jobs accept "$third"
$jobs work --once
$jobs list
for r in "$work"/queue/done/*.json; do
  sed -n 's/^  "status": "\(.*\)",$/\1/p' "$r" | sed "s#^#$(basename "$r" .json): #"
done
git -C "$work/remote.git" log --format='%h %an: %s' main
echo "config: $work/jobs.toml"
