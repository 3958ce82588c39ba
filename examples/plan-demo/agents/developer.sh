#!/bin/sh
# A scripted developer for the demo: the prompt arrives on stdin, like any
# agent's. It finds its checkpoint there, writes the code, and proposes
# `built` with notes in the plan file (belay judges that proposal).
p=$(cat)
id=$(printf '%s\n' "$p" | sed -n "s/.*checkpoint '\([^']*\)'.*/\1/p" | head -n1)
case "$id" in
  c1) printf '#!/bin/sh\necho "hello, world"\n' > greet.sh ;;
  c2)
    # The first try forgets the default; belay's gate sends it back.
    if printf '%s' "$p" | grep -q "they failed"; then
      printf '#!/bin/sh\necho "hello, ${1:-world}"\n' > greet.sh
    else
      printf '#!/bin/sh\necho "hello, $1"\n' > greet.sh
    fi ;;
esac
plan=plan_checkpoints.json
sed -i "/\"id\": \"$id\"/,/\"status\"/ s/\"status\": \"[a-z]*\"/\"status\": \"built\"/" "$plan"
sed -i "/\"id\": \"$id\"/,/\"review_notes\"/ s/\"review_notes\": \".*\",/\"review_notes\": \"wrote greet.sh for $id\",/" "$plan"
echo "built $id"
