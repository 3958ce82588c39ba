#!/bin/sh
# A scripted reviewer for the demo: it runs the tests itself and approves
# only when they pass.
p=$(cat)
id=$(printf '%s\n' "$p" | sed -n "s/.*checkpoint '\([^']*\)'.*/\1/p" | head -n1)
plan=plan_checkpoints.json
if sh tests/test.sh >/dev/null 2>&1; then
  sed -i "/\"id\": \"$id\"/,/\"status\"/ s/\"status\": \"[a-z]*\"/\"status\": \"approved\"/" "$plan"
  echo "approved $id"
else
  sed -i "/\"id\": \"$id\"/,/\"review_notes\"/ s/\"review_notes\": \".*\",/\"review_notes\": \"the tests fail\",/" "$plan"
  echo "rejected $id"
fi
