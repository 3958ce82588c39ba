#!/usr/bin/env bash
# Set up a Debian machine to run belay and its tests. Idempotent: every step
# checks before it acts, so running it again is cheap.
#
#  - installs the Docker engine (docker.io), debootstrap and git if missing;
#  - starts dockerd if it is not answering (systemd when there is one);
#  - builds belay (release);
#  - builds the default base image offline with `belay image bootstrap` if missing.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[setup] %s\n' "$*" >&2; }
die() { printf '[setup] error: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "run as root (apt-get, dockerd and debootstrap need it), e.g. sudo $0"
command -v cargo >/dev/null || die "cargo is missing: install a Rust toolchain >= 1.89 (rustup) and rerun"

missing=()
command -v dockerd >/dev/null || missing+=(docker.io)
command -v debootstrap >/dev/null || missing+=(debootstrap)
command -v git >/dev/null || missing+=(git)
command -v tar >/dev/null || missing+=(tar)
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

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

log "building belay"
cargo build --release --locked -q -p belay
target_dir="${CARGO_TARGET_DIR:-target}"
"$target_dir/release/belay" image bootstrap
log "ready: $("$target_dir/release/belay" --version)"
