#!/bin/bash
# Shared by the per-project scripts. run_project SPEC NODE_LINE NPM_FOR_LINE PINS_JSON
#   SPEC: npm spec (name@version); NODE_LINE: the node major belay's plan picked;
#   PINS_JSON: {"dep":"x.y.z", ...} exact versions written into (dev)dependencies,
#              keys "o:dep" go to an npm `overrides` block; "" = no pins (belay's fresh install).
# Phase 1 (network: host): npm pack, toolchain (node@LINE from the npm registry's `node` package), npm install.
# Phase 2 (--network none): CI=true npm test, as the oracle runs it.
# Needs: docker, image belay-base:bookworm, npm + python3 on the host. Uses $WORK (default /tmp/regdates-run).
# CA bundle of the host is mounted in (this machine's registry access goes through a TLS proxy).
set -uo pipefail
run_project() {
  local spec=$1 line=$2 npmv=$3 pins=$4
  local WORK=${WORK:-/tmp/regdates-run} CA=${CA:-/etc/ssl/certs/ca-certificates.crt}
  local name=$(echo "$spec" | sed 's/^@//; s#/#-#; s/@/-/')
  local w=$WORK/$name; rm -rf "$w"; mkdir -p "$w/repo" "$w/tc"
  (cd "$w" && npm pack "$spec" --silent >/dev/null && tar xzf *.tgz -C repo --strip-components=1) || return 1
  if [ -n "$pins" ]; then python3 - "$w/repo/package.json" "$pins" <<'PY'
import json, sys
f, pins = sys.argv[1], json.loads(sys.argv[2]); p = json.load(open(f))
for k, v in pins.items():
    if k.startswith("o:"): p.setdefault("overrides", {})[k[2:]] = v; continue
    for s in ("dependencies", "devDependencies"):
        if k in p.get(s, {}): p[s][k] = v; break
    else: p.setdefault("devDependencies", {})[k] = v
json.dump(p, open(f, "w"), indent=2)
PY
  fi
  D() { local net=$1; shift; docker run --rm --cpu-shares 2 --network "$net" -v "$w:/w" -v "$CA:/hostca.crt:ro" -e NODE_EXTRA_CA_CERTS=/hostca.crt \
      -e npm_config_cafile=/hostca.crt -e npm_config_cache=/w/.npmcache belay-base:bookworm bash -c "$1"; }
  D host "set -e; apt-get update -qq && apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
     npm install -g --prefix /w/tc --no-audit --no-fund --force node@$line npm@$npmv >/dev/null 2>&1
     export PATH=/w/tc/bin:\$PATH; hash -r; echo node \$(node -v) npm \$(npm -v)
     cd /w/repo && npm install --no-audit --no-fund" > "$w/install.log" 2>&1
  echo "install rc=$?" | tee -a "$w/install.log"
  D none "export PATH=/w/tc/bin:\$PATH; cd /w/repo && CI=true npm test" > "$w/test.log" 2>&1
  local rc=$?; echo "test rc=$rc (log: $w/test.log)"; return $rc
}
