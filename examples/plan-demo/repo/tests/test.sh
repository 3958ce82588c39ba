#!/bin/sh
# The project's tests: what exists of greet.sh must behave.
set -e
[ -f greet.sh ] || { echo "greet.sh is missing"; exit 1; }
out=$(sh greet.sh)
[ "$out" = "hello, world" ] || { echo "greet.sh printed '$out', not 'hello, world'"; exit 1; }
if grep -q '\$1' greet.sh; then
  out=$(sh greet.sh belay)
  [ "$out" = "hello, belay" ] || { echo "greet.sh belay printed '$out'"; exit 1; }
fi
echo "tests pass"
