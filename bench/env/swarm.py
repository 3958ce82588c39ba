#!/usr/bin/env python3
"""`build-projects --executor swarm` on this machine's single-node swarm
against `--executor local`, on the same batch, in one run.

The batch is --projects copies of the bundled example (each with its own
file, so no two share a workspace checkpoint), built --no-cache with
--jobs 2 and --registry on both sides, so that the executor is the only
difference. The machine's package caches are warm (a first local build
fills them). The worker image is pushed before the timed runs.

Prints the wall time of each batch, the overhead per project of the swarm
(task scheduling, the worker container, claims and results on disk) and a
projection for 10,000 projects on 64 nodes from these figures.

Usage: bench/env/swarm.py [--rounds 2] [--projects 4] [--registry 127.0.0.1:5000]
Needs the Docker engine as a swarm, the base image and the loopback registry
(./scripts/setup-host.sh --tests).
"""
import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def sh(cmd, check=True):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if check and p.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{p.stdout}\n{p.stderr[-3000:]}")
    return p


def remove_runs(prefix):
    out = sh(["docker", "images", "--format", "{{.Repository}}:{{.Tag}} {{.Labels}}"], check=False).stdout
    refs = [l.split()[0] for l in out.splitlines() if f"belay.run={prefix}" in l and "<none>" not in l]
    if refs:
        sh(["docker", "rmi", "-f", *refs], check=False)


def batch(belay, pfile, pdir, prefix, extra):
    t0 = time.monotonic()
    p = sh([belay, "env", "build-projects", "--projects-file", pfile, "--projects-dir", pdir,
            "--jobs", "2", "--run-id-prefix", prefix, "--no-cache", *extra], check=False)
    wall = time.monotonic() - t0
    with open(os.path.join(pdir, "build-projects-summary.json")) as f:
        s = json.load(f)
    if p.returncode != 0 or s["failed"]:
        sys.exit(f"batch {prefix} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return wall, s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--projects", type=int, default=4)
    ap.add_argument("--registry", default="127.0.0.1:5000")
    ap.add_argument("--belay", default=os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target")), "release", "belay"))
    args = ap.parse_args()
    state = sh(["docker", "info", "--format", "{{.Swarm.LocalNodeState}}"]).stdout.strip()
    if state != "active":
        sys.exit("the engine is not a swarm: docker swarm init (./scripts/setup-host.sh --tests)")
    image = sh([args.belay, "image", "worker", "--registry", args.registry]).stdout.split()[0]
    tmp = tempfile.mkdtemp(prefix="belay-bench-swarm-")
    stamp = time.strftime("%H%M%S")
    prefixes = []
    try:
        names = []
        for i in range(args.projects):
            name = f"p{i}"
            dst = os.path.join(tmp, name)
            shutil.copytree(os.path.join(ROOT, "examples", "hello-python"), dst,
                            ignore=shutil.ignore_patterns(".belay"))
            with open(os.path.join(dst, "nonce.txt"), "w") as f:
                f.write(f"{stamp} {i}\n")
            names.append(name)
        pfile = os.path.join(tmp, "projects.txt")
        with open(pfile, "w") as f:
            f.write("".join(f"./{n}\n" for n in names))
        # Warm the package caches (not timed).
        warm = f"bsw-warm-{stamp}"
        prefixes.append(warm)
        batch(args.belay, pfile, os.path.join(tmp, "warm"), warm, ["--registry", args.registry])

        local, swarm = [], []
        for r in range(args.rounds):
            for executor in (["local"], ["swarm"]) if r % 2 == 0 else (["swarm"], ["local"]):
                ex = executor[0]
                prefix = f"bsw-{ex}-{stamp}-{r}"
                prefixes.append(prefix)
                extra = ["--registry", args.registry, "--executor", ex]
                if ex == "swarm":
                    extra += ["--worker-image", image]
                wall, s = batch(args.belay, pfile, os.path.join(tmp, prefix), prefix, extra)
                (local if ex == "local" else swarm).append((wall, s))
                times = ", ".join("%.1f" % p["duration_s"] for p in s["projects"])
                print(f"round {r + 1} {ex}: {wall:.1f} s ({times} s per project)", flush=True)
                remove_runs(prefix)
        lw = statistics.median(w for w, _ in local)
        sw = statistics.median(w for w, _ in swarm)
        n = args.projects
        per_project = (sw - lw) / n
        tp = lw * 2 / n  # one project's time at 2 concurrent builds
        print()
        print(f"{n} copies of the bundled example, --jobs 2, --no-cache, --registry on both sides, "
              f"package caches warm, {args.rounds} round(s), medians:")
        print(f"  local batch {lw:.1f} s; swarm batch {sw:.1f} s ({sw / lw:.2f}x); "
              f"overhead per project {per_project:+.2f} s ({100 * (sw - lw) / lw:+.1f}%)")
        waves = math.ceil(10000 / (64 * 2))
        print(f"  projection, 10,000 such projects on 64 nodes like this one at 2 builds each: "
              f"{waves} waves x {tp * sw / lw:.1f} s = {waves * tp * sw / lw / 3600:.2f} h")
    finally:
        for p in prefixes:
            remove_runs(p)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
