#!/usr/bin/env bash
# README command 1 as on a fresh machine, as far as this machine can be made
# fresh without reinstalling it: a clean clone (no target directory), an empty
# CARGO_HOME (every crate downloaded again), no belay image at all (the base
# image is bootstrapped again), empty package caches. What it cannot undo:
# the apt packages already installed (docker.io, debootstrap, git, a C
# toolchain), so apt's share is measured apart, in a container of the base
# image, after the run (`apt_seconds`).
#
# Destructive for this machine's belay images (belay-agent:bookworm too) and
# package caches: run `scripts/setup-host.sh --tests` before the tests again.
# Usage: bench/setup/command1.sh (as root; prints one figure a line).
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d /tmp/belay-command1.XXXXXX)
git clone -q "$repo" "$work/belay"
export CARGO_HOME="$work/cargo-home" RUSTUP_HOME="${RUSTUP_HOME:-$HOME/.rustup}"
unset CARGO_TARGET_DIR
cargo=$(command -v cargo)

# No belay image and no package cache (containers of belay first).
docker ps -aq --filter label=belay=true | xargs -r docker rm -f >/dev/null
docker images --format '{{.Repository}}:{{.Tag}}' | grep -E '^belay' | xargs -r docker rmi -f >/dev/null 2>&1 || true
docker image prune -af --filter label=belay=true >/dev/null
"$repo/target/release/belay" env gc --package-caches >/dev/null 2>&1 || true

cd "$work/belay"
start=$(date +%s.%N)
PATH="$(dirname "$cargo"):$PATH" ./scripts/setup-host.sh
built=$(date +%s.%N)
cargo run --release -q -p belay -- env build --repo examples/hello-python
done_=$(date +%s.%N)

apt_start=$(date +%s.%N)
docker run --rm belay-base:bookworm sh -c 'apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends docker.io debootstrap git curl build-essential >/dev/null'
apt_end=$(date +%s.%N)
python3 - "$start" "$built" "$done_" "$apt_start" "$apt_end" <<'PY'
import sys
s, b, d, a0, a1 = map(float, sys.argv[1:])
print(f"cache_state: cold (clean clone, empty CARGO_HOME, no belay images, empty package caches; apt packages installed)")
print(f"setup_seconds: {b - s:.0f}")
print(f"env_build_seconds: {d - b:.0f}")
print(f"command1_seconds: {d - s:.0f}")
print(f"apt_seconds: {a1 - a0:.0f}  (docker.io debootstrap git curl build-essential in a fresh Debian container)")
PY
rm -rf "$work"
