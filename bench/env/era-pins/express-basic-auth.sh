#!/bin/bash
# express-basic-auth: belay's oracle (CI=true npm test) with the dependencies of the project's era pinned.
# Usage: bash express-basic-auth.sh [base]   ("base" = no pins: belay's fresh install, newest in range)
. "$(dirname "$0")/common.sh"
# belay picks node 7 (.circleci/config.yml: circleci/node:7.10); mocha ^9.1.3 needs node >= 12.
# Usage: bash express-basic-auth.sh [base|node7]; default: era pins on node 16 (npm overrides need npm >= 8.3).
TOP='"mocha":"9.1.3","express":"4.17.1","@types/express":"4.17.13","supertest":"3.4.2","should":"11.2.1","typescript":"2.9.2","basic-auth":"2.0.1"'
OVR='"o:@types/express-serve-static-core":"4.17.26","o:@types/node":"16.11.12","o:@types/serve-static":"1.13.10","o:@types/qs":"6.9.7","o:@types/body-parser":"1.19.2","o:@types/range-parser":"1.2.4","o:@types/mime":"1.3.2","o:@types/connect":"3.4.35"'
case "${1:-}" in
  base)  run_project express-basic-auth@1.2.1 7 6 "" ;;
  node7) run_project express-basic-auth@1.2.1 7 6 "{$TOP}" ;;   # npm 6: no overrides
  *)     run_project express-basic-auth@1.2.1 16 9 "{$TOP,$OVR}" ;;
esac
