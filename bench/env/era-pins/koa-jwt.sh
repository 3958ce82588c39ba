#!/bin/bash
# koa-jwt: belay's oracle (CI=true npm test) with the dependencies of the project's era pinned.
# Usage: bash koa-jwt.sh [base]   ("base" = no pins: belay's fresh install, newest in range)
. "$(dirname "$0")/common.sh"
PINS='{"chai":"4.3.7","koa":"2.14.1","jsonwebtoken":"9.0.0","mocha":"7.2.0","supertest":"4.0.2","nyc":"15.1.0","koa-unless":"1.0.7","p-any":"2.1.0"}'
[ "${1:-}" = base ] && PINS=""
run_project koa-jwt@4.0.4 18 9.2.0 "$PINS"
