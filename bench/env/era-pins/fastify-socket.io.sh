#!/bin/bash
# fastify-socket.io: belay's oracle (CI=true npm test) with the dependencies of the project's era pinned.
# Usage: bash fastify-socket.io.sh [base]   ("base" = no pins: belay's fresh install, newest in range)
. "$(dirname "$0")/common.sh"
PINS='{"fastify":"4.0.3","socket.io":"4.5.1","tap":"15.2.3","tsd":"0.19.1","typescript":"4.7.3","@types/node":"16.11.39","fastify-plugin":"3.0.1","standard":"16.0.4","fastify-tsconfig":"1.0.1"}'
[ "${1:-}" = base ] && PINS=""
run_project fastify-socket.io@4.0.0 18 9.2.0 "$PINS"
