#!/bin/bash
# fastify-websocket: belay's oracle (CI=true npm test) with the dependencies of the project's era pinned.
# Usage: bash fastify-websocket.sh [base]   ("base" = no pins: belay's fresh install, newest in range)
. "$(dirname "$0")/common.sh"
PINS='{"fastify":"3.28.0","ws":"8.5.0","@types/ws":"8.5.3","tap":"16.0.1","tsd":"0.20.0","split2":"4.1.0","fastify-plugin":"3.0.1","standard":"16.0.4","snazzy":"9.0.0","o:@types/node":"17.0.23"}'
[ "${1:-}" = base ] && PINS=""
run_project fastify-websocket@4.2.2 16 9 "$PINS"
