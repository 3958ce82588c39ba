#!/bin/bash
# fastify-multipart: belay's oracle (CI=true npm test) with the dependencies of the project's era pinned.
# Usage: bash fastify-multipart.sh [base]   ("base" = no pins: belay's fresh install, newest in range)
. "$(dirname "$0")/common.sh"
PINS='{"fastify":"3.27.1","tap":"15.1.6","tsd":"0.19.1","typescript":"4.5.5","@types/node":"17.0.17","@fastify/busboy":"1.0.0","fastify-plugin":"3.0.1","fastify-error":"0.3.1","standard":"16.0.4"}'
[ "${1:-}" = base ] && PINS=""
run_project fastify-multipart@5.3.1 16 9 "$PINS"
