#!/bin/bash
# fastify-express: belay's oracle (CI=true npm test) with the dependencies of the project's era pinned.
# Usage: bash fastify-express.sh [base]   ("base" = no pins: belay's fresh install, newest in range)
. "$(dirname "$0")/common.sh"
PINS='{"fastify":"3.18.1","tap":"15.0.9","tsd":"0.17.0","@types/express":"4.17.12","@types/node":"15.12.5","express":"4.17.1","fastify-plugin":"3.0.0","helmet":"4.6.0","simple-get":"4.0.0","standard":"16.0.3","serve-static":"1.14.1","cors":"2.8.5","passport":"0.4.1","passport-http-bearer":"1.0.1"}'
[ "${1:-}" = base ] && PINS=""
run_project fastify-express@0.3.3 16 9 "$PINS"
