#!/usr/bin/env bash
# Set up a Debian machine to run belay, and its tests. Idempotent: every step
# checks before it acts, so running it again is cheap.
#
#   scripts/setup-host.sh            what `belay env build` needs
#   scripts/setup-host.sh --agents   also what the agent modes need
#   scripts/setup-host.sh --tests    also what the test suite needs (implies --agents)
#
# Always:
#  - installs the Docker engine (docker.io), debootstrap, git, curl and a C
#    toolchain if missing;
#  - builds belay (release), started at once where a C compiler is already
#    there, while apt and dockerd start;
#  - starts dockerd if it is not answering (systemd when there is one);
#  - builds the default base image offline with `belay image bootstrap` if missing.
# With --agents:
#  - installs Node.js/npm and the pinned agent CLIs (codex, Claude Code,
#    gemini) into /opt/belay-agents, while belay builds;
#  - builds the round agents' image belay-agent:bookworm (the base plus git).
# With --tests:
#  - installs systemd (for `systemd-analyze verify`), prosody (the jobs tests
#    start private instances of it on loopback, with their own accounts),
#    chromium and chromium-driver (the dashboard's tests drive a headless
#    browser), podman and catatonit (the pipeline runs on Podman's
#    Docker-compatible socket too), python3-venv and Debian's docker-registry;
#  - starts Podman's Docker-compatible service on /run/podman/podman.sock
#    (rootful) and gives it the base image;
#  - starts a loopback OCI registry (Debian's docker-registry) on
#    127.0.0.1:5000, with deletes enabled, for the --registry tests;
#  - makes the engine a single-node swarm (`docker swarm init`) for
#    `build-projects --executor swarm`.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[setup] %s\n' "$*" >&2; }
die() { printf '[setup] error: %s\n' "$*" >&2; exit 1; }

agents=0; tests=0
for arg in "$@"; do
  case "$arg" in
    --agents) agents=1 ;;
    --tests) tests=1; agents=1 ;;
    -h|--help) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option $arg (known: --agents, --tests)" ;;
  esac
done

[ "$(id -u)" -eq 0 ] || die "run as root (apt-get, dockerd and debootstrap need it), e.g. sudo $0"
command -v cargo >/dev/null || die "cargo is missing: install a Rust toolchain >= 1.89 (rustup) and rerun"
target_dir="${CARGO_TARGET_DIR:-target}"

# belay's release build is the longest step: it starts before apt when the
# machine has its C toolchain (apt would not touch it then), and runs while
# apt, dockerd and npm do their part.
build_log=$(mktemp /tmp/belay-setup-build.XXXXXX.log)
build_pid=
start_build() {
  log "building belay (log: $build_log)"
  # Its own process group, so that a failed setup stops cargo and its rustc.
  setsid cargo build --release --locked -q -p belay >"$build_log" 2>&1 &
  build_pid=$!
}
stop_build() {
  if [ -n "$build_pid" ] && kill -0 "$build_pid" 2>/dev/null; then
    kill -TERM -- "-$build_pid" 2>/dev/null || true
    rm -f "$build_log"
  fi
}
trap stop_build EXIT

missing=()
command -v dockerd >/dev/null || missing+=(docker.io)
command -v debootstrap >/dev/null || missing+=(debootstrap)
command -v git >/dev/null || missing+=(git)
command -v tar >/dev/null || missing+=(tar)
command -v curl >/dev/null || missing+=(curl)
command -v cc >/dev/null && command -v g++ >/dev/null && [ -e /usr/include/stdio.h ] || missing+=(build-essential)
[[ " ${missing[*]} " == *" build-essential "* ]] || start_build
if [ "$agents" -eq 1 ]; then
  command -v npm >/dev/null || missing+=(nodejs npm)
fi
if [ "$tests" -eq 1 ]; then
  python3 -c 'import venv, ensurepip' 2>/dev/null || missing+=(python3-venv)
  command -v systemd-analyze >/dev/null || missing+=(systemd)  # `systemd-analyze verify` of the rounds units
  command -v prosody >/dev/null || missing+=(prosody)  # the XMPP server of the jobs tests (each test runs its own instance)
  command -v chromium >/dev/null || missing+=(chromium)  # the dashboard's browser tests (headless)
  command -v chromedriver >/dev/null || missing+=(chromium-driver)
  command -v podman >/dev/null || missing+=(podman)  # the pipeline's Podman test (its Docker-compatible socket)
  command -v docker-registry >/dev/null || missing+=(docker-registry)  # the loopback OCI registry of the --registry tests
  [ -x /usr/libexec/podman/catatonit ] || [ -x /usr/bin/catatonit ] || missing+=(catatonit)  # Podman's container init
fi
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
[ -n "$build_pid" ] || start_build

if ! docker info >/dev/null 2>&1; then
  if [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
    log "starting docker with systemd"
    systemctl start docker
  else
    log "starting dockerd (log: /var/log/dockerd.log)"
    nohup dockerd >/var/log/dockerd.log 2>&1 &
  fi
  for _ in $(seq 1 60); do
    docker info >/dev/null 2>&1 && break
    sleep 1
  done
  docker info >/dev/null 2>&1 || die "dockerd did not come up within 60 s; see /var/log/dockerd.log"
fi
log "docker $(docker version --format '{{.Server.Version}} (API {{.Server.APIVersion}})')"

# The agent CLIs, pinned (the versions the adapters are tested against):
# npm downloads them while belay builds.
AGENTS_DIR=${BELAY_AGENTS_DIR:-/opt/belay-agents}
AGENT_PKGS=(@openai/codex@0.171.0 @anthropic-ai/claude-code@2.1.332 @google/gemini-cli@0.61.0)
if [ "$agents" -eq 1 ]; then
  agents_ok=1
  for p in "${AGENT_PKGS[@]}"; do
    name=${p%@*}; want=${p##*@}
    have=$(node -e "try{console.log(require('$AGENTS_DIR/node_modules/$name/package.json').version)}catch(e){}" 2>/dev/null || true)
    [ "$have" = "$want" ] || agents_ok=0
  done
  if [ "$agents_ok" -eq 0 ]; then
    log "installing agent CLIs into $AGENTS_DIR: ${AGENT_PKGS[*]}"
    mkdir -p "$AGENTS_DIR"
    npm install --prefix "$AGENTS_DIR" --no-audit --no-fund --loglevel=error "${AGENT_PKGS[@]}" >/dev/null
  fi
  for b in codex claude gemini; do
    "$AGENTS_DIR/node_modules/.bin/$b" --version >/dev/null 2>&1 || die "$AGENTS_DIR/node_modules/.bin/$b does not run"
  done
  log "agent CLIs: $("$AGENTS_DIR/node_modules/.bin/codex" --version), claude $("$AGENTS_DIR/node_modules/.bin/claude" --version | cut -d' ' -f1), gemini $("$AGENTS_DIR/node_modules/.bin/gemini" --version)"
fi

build_ok=1
wait "$build_pid" || build_ok=0
build_pid=
if [ "$build_ok" -eq 0 ]; then
  tail -n 40 "$build_log" >&2
  die "belay did not build (the whole log: $build_log)"
fi
rm -f "$build_log"
"$target_dir/release/belay" image bootstrap
if [ "$agents" -eq 1 ]; then
  # The image round agents work in: the base plus git, so that they can commit.
  "$target_dir/release/belay" image bootstrap --tag belay-agent:bookworm --include git,ca-certificates
fi
log "ready: $("$target_dir/release/belay" --version)"
[ "$tests" -eq 1 ] || exit 0
# Podman's Docker-compatible socket, for the pipeline's Podman test. On a
# host whose own limits are below Podman's defaults (a container or a small
# VM), containers would fail to start ("error setting rlimits"): Podman is
# told the host's limits.
nofile=$(ulimit -Hn); nproc=$(ulimit -Hu); pid_max=$(cat /proc/sys/kernel/pid_max)
[ "$nproc" = unlimited ] && nproc=$pid_max
[ "$nproc" -gt "$pid_max" ] && nproc=$pid_max
if [ "$nofile" != unlimited ] && [ "$nofile" -lt 1048576 ]; then
  conf=/etc/containers/containers.conf.d/belay-limits.conf
  want=$(printf '[containers]\ndefault_ulimits = ["nofile=%s:%s", "nproc=%s:%s"]\n' "$nofile" "$nofile" "$nproc" "$nproc")
  if [ "$(cat "$conf" 2>/dev/null)" != "$want" ]; then
    mkdir -p "$(dirname "$conf")"
    printf '%s\n' "$want" > "$conf"
    pkill -f "podman system service" 2>/dev/null || true
  fi
fi
podman_sock=/run/podman/podman.sock
if ! curl -sf --unix-socket "$podman_sock" http://d/_ping >/dev/null 2>&1; then
  log "starting podman's Docker-compatible service on $podman_sock (log: /var/log/podman-service.log)"
  mkdir -p /run/podman
  nohup podman system service --time=0 "unix://$podman_sock" >/var/log/podman-service.log 2>&1 &
  for _ in $(seq 1 30); do
    curl -sf --unix-socket "$podman_sock" http://d/_ping >/dev/null 2>&1 && break
    sleep 1
  done
  curl -sf --unix-socket "$podman_sock" http://d/_ping >/dev/null 2>&1 || die "podman's service did not come up within 30 s; see /var/log/podman-service.log"
fi
if ! podman image exists belay-base:bookworm; then
  log "giving podman the base image"
  docker save belay-base:bookworm | podman load -q >/dev/null
fi
log "podman $(podman version --format '{{.Server.Version}}' 2>/dev/null || podman --version)"

# A loopback OCI registry for `--registry` (the env tests push checkpoints to
# it). Loopback needs no TLS: the engine allows plain HTTP to 127.0.0.0/8.
# Its own config (not the package's, which listens on every address), with
# deletes enabled so that `belay env gc --registry` can be tested.
REGISTRY_ADDR=${BELAY_TEST_REGISTRY:-127.0.0.1:5000}
# The package's own service listens on every address with deletes off: it is
# not the one the tests use.
if [ -d /run/systemd/system ] && systemctl is-enabled docker-registry >/dev/null 2>&1; then
  systemctl disable --now docker-registry >/dev/null 2>&1 || true
fi
if ! curl -sf "http://$REGISTRY_ADDR/v2/" >/dev/null 2>&1; then
  conf=/etc/belay/registry.yml
  mkdir -p /etc/belay /var/lib/belay-registry
  cat > "$conf" <<YAML
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: /var/lib/belay-registry
  delete:
    enabled: true
http:
  addr: $REGISTRY_ADDR
YAML
  log "starting a loopback registry on $REGISTRY_ADDR (log: /var/log/belay-registry.log)"
  setsid nohup docker-registry serve "$conf" >/var/log/belay-registry.log 2>&1 < /dev/null &
  for _ in $(seq 1 30); do
    curl -sf "http://$REGISTRY_ADDR/v2/" >/dev/null 2>&1 && break
    sleep 1
  done
  curl -sf "http://$REGISTRY_ADDR/v2/" >/dev/null 2>&1 || die "the registry did not come up on $REGISTRY_ADDR within 30 s; see /var/log/belay-registry.log"
fi
log "registry $REGISTRY_ADDR"

# A single-node swarm for `build-projects --executor swarm` (its tests run the
# batch as a replicated-job on this engine).
if [ "$(docker info --format '{{.Swarm.LocalNodeState}}' 2>/dev/null)" != active ]; then
  log "docker swarm init (single node, on loopback)"
  docker swarm init --advertise-addr 127.0.0.1 >/dev/null
fi
log "swarm $(docker info --format '{{.Swarm.LocalNodeState}}')"
