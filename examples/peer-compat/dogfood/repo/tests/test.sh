#!/usr/bin/env bash
# The project's tests: exit 0 when every case passes.
set -u
fail=0
check() {
  got=$(./calc.sh "$1" "$2" "$3")
  if [ "$got" = "$4" ]; then echo "ok: $1 $2 $3 = $4"; else echo "FAIL: $1 $2 $3 gave $got, expected $4"; fail=1; fi
}
check add 2 3 5
check add 10 -4 6
check mul 3 4 12
exit $fail
