#!/bin/sh
# A scripted round agent (no model, deterministic): it reads the prompt on
# stdin, as Claude Code would with `-p`, and works in the phase the round
# context names. Round 2 leaves its work uncommitted on purpose; round 3
# finds that stash in its context and applies it.
set -eu
prompt=$(cat)
round=$AGENT_RUNNER_ROUND_NUM
phase=${AGENT_RUNNER_PHASE:-draft}
echo "round $round ($phase)"
stash=$(printf '%s\n' "$prompt" | sed -n 's/.*"ref": "\([0-9a-f]\{40\}\)".*/\1/p' | tail -n1)
if [ -n "$stash" ]; then
  echo "applying the stash $stash that round $((round - 1)) left"
  git stash apply -q "$stash"
  git stash drop -q "$(git stash list --format='%gd %H' | awk -v s="$stash" '$2 == s {print $1}')"
fi
case "$phase" in
  draft) echo "- note $round: drafted" >> NOTES.md ;;
  review) sed -i '$ s/drafted/reviewed/' NOTES.md 2>/dev/null || echo "- note $round: reviewed" >> NOTES.md ;;
esac
git add NOTES.md
if [ "$round" = 2 ]; then
  echo "leaving round 2's work uncommitted"
  exit 0
fi
git -c user.name=notes-agent -c user.email=agent@example.invalid commit -qm "round $round: $phase"
echo '{"type":"result","subtype":"success"}'
