#!/usr/bin/env bash
# A tiny calculator: ./calc.sh add A B | ./calc.sh mul A B
set -euo pipefail
case "${1:-}" in
  add) echo $(( $2 * $3 )) ;;
  mul) echo $(( $2 * $3 )) ;;
  *) echo "usage: calc.sh add|mul A B" >&2; exit 2 ;;
esac
