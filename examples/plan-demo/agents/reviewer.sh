#!/bin/sh
# A scripted reviewer for the demo: it runs the tests itself and approves
# only when they pass. Its verdict is the last line of its answer (stdout):
# belay never reads a verdict from the plan file.
p=$(cat)
id=$(printf '%s\n' "$p" | sed -n "s/.*checkpoint '\([^']*\)'.*/\1/p" | head -n1)
if sh tests/test.sh >/dev/null 2>&1; then
  echo "the tests pass for $id"
  echo "VERDICT: approved"
else
  echo "the tests fail for $id: sh tests/test.sh"
  echo "VERDICT: rejected"
fi
