#!/usr/bin/env python3
"""The registry checkpoint store (`--registry`) on the bundled example.

Runs its own loopback registry (Debian's docker-registry) on an empty
directory, so that bytes are counted from nothing, and measures in one run:

  - registry bytes per project: the base image pushed alone first, then one
    build; the registry's storage before and after;
  - pushes as a share of the build: the pushes' own time against the build's
    wall time, and how long the build waited for them after its last block
    (the only time a push can cost a build);
  - a build with --registry against the same build without (both --no-cache,
    both with the machine's package caches warm from a first build);
  - a cached rebuild through the registry, with every image of the earlier
    runs removed from the engine (the base kept), against a cached rebuild
    from the engine's own images: with --no-pull-final (the result stays in
    the registry, as a cluster worker leaves it; no layer moves), and with
    the final image pulled onto the engine, which is held against a plain
    `docker pull` of that same image on the same emptied engine.

Cache states are printed with each figure. Needs the Docker engine, the base
image and docker-registry (./scripts/setup-host.sh --tests).

Usage: bench/env/registry.py [--rounds 2] [--belay target/release/belay]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PORT = 5055
REG = f"127.0.0.1:{PORT}"


def sh(cmd, check=True, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if check and p.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{p.stdout}\n{p.stderr}")
    return p


def du(path):
    total = 0
    for d, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(d, f)).st_size
            except FileNotFoundError:
                pass
    return total


def start_registry(root):
    cfg = os.path.join(root, "config.yml")
    with open(cfg, "w") as f:
        f.write(f"version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {root}/data\n"
                f"  delete:\n    enabled: true\nhttp:\n  addr: {REG}\n")
    proc = subprocess.Popen(["docker-registry", "serve", cfg], stdout=subprocess.DEVNULL,
                            stderr=open(os.path.join(root, "registry.log"), "w"))
    for _ in range(100):
        try:
            urllib.request.urlopen(f"http://{REG}/v2/", timeout=1)
            return proc
        except Exception:
            time.sleep(0.1)
    proc.kill()
    sys.exit(f"the bench registry did not come up on {REG}; see {root}/registry.log")


def remove_run_images(run_id):
    out = sh(["docker", "images", "--format", "{{.Repository}}:{{.Tag}}",
              "--filter", f"label=belay.run={run_id}"]).stdout
    refs = [r for r in out.split() if "<none>" not in r]
    if refs:
        sh(["docker", "rmi", "-f", *refs], check=False)


def build(belay, repo, state, run_id, extra, env=None):
    t0 = time.monotonic()
    p = sh([belay, "env", "build", "--repo", repo, "--state-dir", state, "--run-id", run_id, *extra],
           check=False, env=env)
    wall = time.monotonic() - t0
    mpath = os.path.join(state, "runs", run_id, "manifest.json")
    if p.returncode != 0 or not os.path.exists(mpath):
        sys.exit(f"build {run_id} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    with open(mpath) as f:
        return wall, json.load(f)


def remove_named(run_id):
    """Images a run pulled keep the labels of the run that made them: remove them by name."""
    out = sh(["docker", "images", "--format", "{{.Repository}}:{{.Tag}}"]).stdout
    refs = [r for r in out.split() if f":{run_id}-" in r]
    if refs:
        sh(["docker", "rmi", "-f", *refs], check=False)


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--belay", default=os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target")), "release", "belay"))
    ap.add_argument("--example", default=os.path.join(ROOT, "examples", "hello-python"))
    args = ap.parse_args()
    if not shutil.which("docker-registry"):
        sys.exit("docker-registry is missing: ./scripts/setup-host.sh --tests installs it")
    tmp = tempfile.mkdtemp(prefix="belay-bench-registry-")
    proc = start_registry(tmp)
    stamp = time.strftime("%H%M%S")
    runs = []
    try:
        repo = os.path.join(tmp, "repo")
        shutil.copytree(args.example, repo, ignore=shutil.ignore_patterns(".belay"))
        state = os.path.join(tmp, "state")

        # The base alone first: its bytes are paid once per registry.
        base_remote = f"{REG}/belay-base:bookworm"
        sh(["docker", "tag", "belay-base:bookworm", base_remote])
        t0 = time.monotonic()
        sh(["docker", "push", base_remote])
        base_push_s = time.monotonic() - t0
        sh(["docker", "rmi", base_remote], check=False)
        base_bytes = du(os.path.join(tmp, "data"))

        # Warm the machine's package caches, so that both sides below download nothing.
        warm = f"bench-reg-warm-{stamp}"
        runs.append(warm)
        build(args.belay, repo, state, warm, ["--no-cache"])

        plain, shared, push_share, waited, proj_bytes = [], [], [], [], []
        local_hit, reg_hit, reg_nopull, plain_pull = [], [], [], []
        pulls_nopull, reg_fresh = [], []
        blocks = 0
        for r in range(args.rounds):
            a0 = f"bench-reg-plain-{stamp}-{r}"
            a = f"bench-reg-push-{stamp}-{r}"
            b = f"bench-reg-local-{stamp}-{r}"
            c = f"bench-reg-pull-{stamp}-{r}"
            d = f"bench-reg-nopull-{stamp}-{r}"
            runs += [a0, a, b, c, d]
            before = du(os.path.join(tmp, "data"))
            w0, _ = build(args.belay, repo, state, a0, ["--no-cache"])
            w1, m1 = build(args.belay, repo, state, a, ["--no-cache", "--registry", REG])
            proj_bytes.append(du(os.path.join(tmp, "data")) - before)
            reg = m1["registry"]
            bad = [p for p in reg["pushes"] if p.get("error")]
            if bad:
                sys.exit(f"a push failed: {bad}")
            plain.append(w0)
            shared.append(w1)
            push_share.append(reg["push_ms_total"] / 1000.0 / w1)
            waited.append(reg["waited_ms"] / 1000.0)
            blocks = len(m1["blocks"])

            # A cached rebuild from the engine's own images.
            w2, m2 = build(args.belay, repo, state, b, [])
            if m2["cache"]["misses"] != 0:
                sys.exit(f"the local rebuild missed the cache: {m2['cache']}")
            local_hit.append(w2)
            # Every image of the earlier runs gone from the engine: the
            # rebuild finds them through the registry.
            for run in runs:
                remove_run_images(run)
            w3, m3 = build(args.belay, repo, state, c, ["--registry", REG])
            if m3["registry"].get("direct_off"):
                sys.exit(f"the registry was not read directly: {m3['registry']['direct_off']}")
            if m3["cache"]["misses"] != 0 or m3["registry"]["hits"] != blocks + 1:
                sys.exit(f"the registry rebuild missed: {m3['cache']} {m3['registry']['hits']}")
            reg_hit.append(w3)
            for run in runs:
                remove_run_images(run)
            remove_named(c)
            w4, m4 = build(args.belay, repo, state, d, ["--registry", REG, "--no-pull-final"])
            r4 = m4["registry"]
            if m4["cache"]["misses"] != 0 or r4["hits"] != blocks + 1:
                sys.exit(f"the no-pull rebuild missed: {m4['cache']} {r4['hits']}")
            if r4.get("direct_off"):
                sys.exit(f"the registry was not read directly: {r4['direct_off']}")
            if r4["pulls"]:
                sys.exit(f"the no-pull rebuild pulled: {r4['pulls']}")
            pulls_nopull.append(len(r4["pulls"]))
            reg_nopull.append(w4)
            # A fresh node: no machine cache either (so the base's preflight
            # runs once, in a container of the base).
            for run in runs:
                remove_run_images(run)
            remove_named(d)
            e = f"bench-reg-fresh-{stamp}-{r}"
            runs.append(e)
            fresh_env = dict(os.environ, BELAY_CACHE_DIR=tempfile.mkdtemp(prefix="belay-bench-cache-", dir=tmp))
            w5, m5 = build(args.belay, repo, state, e, ["--registry", REG, "--no-pull-final", "--no-package-cache"],
                           env=fresh_env)
            if m5["cache"]["misses"] != 0 or m5["registry"]["pulls"] or m5["registry"].get("direct_off"):
                sys.exit(f"the fresh-node rebuild missed, pulled or went through the engine: {m5['registry']}")
            reg_fresh.append(w5)
            # What a user pays to get the same image onto an emptied engine.
            for run in runs:
                remove_run_images(run)
            remove_named(c)
            remove_named(d)
            t0 = time.monotonic()
            sh(["docker", "pull", "-q", m3["final_image"]])
            plain_pull.append(time.monotonic() - t0)
            sh(["docker", "rmi", m3["final_image"]], check=False)
            print(f"round {r + 1}: build {w0:.1f} s, with --registry {w1:.1f} s "
                  f"(pushes {reg['push_ms_total'] / 1000:.1f} s, waited {reg['waited_ms'] / 1000:.2f} s at the end), "
                  f"{proj_bytes[-1] / 1e6:.1f} MB; cached rebuild local {w2:.2f} s, through the registry "
                  f"{w4:.2f} s with --no-pull-final ({pulls_nopull[-1]} pulls), {w5:.2f} s on a fresh node, {w3:.2f} s with the final "
                  f"image pulled ({len(m3['registry']['pulls'])} pulls), docker pull of it alone {plain_pull[-1]:.2f} s",
                  flush=True)

        print()
        print(f"bundled example ({os.path.relpath(args.example, ROOT)}), {blocks} blocks, {args.rounds} round(s), medians:")
        print(f"  base image pushed once: {base_bytes / 1e6:.1f} MB in {base_push_s:.1f} s")
        print(f"  registry bytes per project (the base excluded): {med(proj_bytes) / 1e6:.1f} MB")
        print(f"  build --no-cache, package caches warm: {med(plain):.1f} s; with --registry {med(shared):.1f} s "
              f"({med(shared) / med(plain):.2f}x)")
        print(f"  pushes, end to end, as a share of the build: {100 * med(push_share):.0f}%; "
              f"waited for after the last block: {med(waited):.2f} s")
        print(f"  cached rebuild, the engine's own images (warm): {med(local_hit):.2f} s")
        print(f"  cached rebuild through the registry, engine without the run images (base kept), "
              f"--no-pull-final: {med(reg_nopull):.2f} s ({med(reg_nopull) / med(local_hit):.2f}x the local one; "
              f"{max(pulls_nopull)} pulls)")
        print(f"  the same on a fresh node (empty machine cache: the base's preflight runs): {med(reg_fresh):.2f} s "
              f"({med(reg_fresh) / med(local_hit):.2f}x the local one; 0 pulls)")
        print(f"  the same with the final image pulled onto the engine: {med(reg_hit):.2f} s "
              f"({med(reg_hit) / med(local_hit):.2f}x the local one; "
              f"{med(reg_hit) / med(plain_pull):.2f}x a plain docker pull of that image, {med(plain_pull):.2f} s)")
    finally:
        for run in runs:
            remove_run_images(run)
        proc.terminate()
        proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
