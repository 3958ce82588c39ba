#!/bin/bash
# fastify-early-hints: belay's oracle (CI=true npm test) with the dependencies of the project's era pinned.
# Usage: bash fastify-early-hints.sh [base]   ("base" = no pins: belay's fresh install, newest in range)
. "$(dirname "$0")/common.sh"
PINS='{"fastify":"4.10.2","tsd":"0.25.0","tap":"16.3.2","@types/node":"18.11.17","undici":"5.14.0","fastify-plugin":"4.4.0","process-warning":"2.1.0","standard":"17.0.0","@fastify/pre-commit":"2.0.2"}'
[ "${1:-}" = base ] && PINS=""
run_project @fastify/early-hints@1.0.1 18 9.2.0 "$PINS"
