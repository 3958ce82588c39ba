#!/usr/bin/env python3
"""belay env build of the bundled example, side by side with `docker build --no-cache`
of the Dockerfile belay wrote for it.

Prints, as medians over --rounds alternating runs:
  - belay's wall time for the example build and its peak RSS;
  - the harness overhead per block: time outside the block's own script and
    validation command (container start, script upload, commit, bookkeeping);
  - the ratio belay / `docker build --no-cache` of the same steps;
  - `belay env plan` time for every fixture.

Cache state: cold on both sides, whatever the machine holds: belay with
--no-cache (no checkpoint of an earlier build is reused, the machine's shared
toolchain checkpoints included) and --no-package-cache (no download cache);
docker with --no-cache, the legacy builder and Dockerfile.legacy (no layer
cache, no cache mounts). Only the base image is present on both sides. Every
line printed says so.

Usage: bench/env/example_vs_docker_build.py [--rounds 3] [--belay target/release/belay]
Needs the Docker engine and the base image (./scripts/setup-host.sh).
"""
import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
# The cache state of every figure this bench prints.
COLD = "cold: no checkpoint, layer or download cache on either side; base image present"


def run(cmd, **kw):
    t0 = time.monotonic()
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if p.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{p.stdout}\n{p.stderr}")
    return wall, max(after, before), p


def cleanup(run_id, tags):
    out = subprocess.run(["docker", "images", "--format", "{{.Repository}}:{{.Tag}}",
                          "--filter", f"label=belay.run={run_id}"], capture_output=True, text=True).stdout
    refs = [r for r in out.split() if "<none>" not in r] + tags
    if refs:
        subprocess.run(["docker", "rmi", "-f", *refs], capture_output=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--belay", default=os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target")), "release", "belay"))
    ap.add_argument("--example", default=os.path.join(ROOT, "examples", "hello-python"))
    args = ap.parse_args()
    if not os.path.exists(args.belay):
        sys.exit(f"{args.belay} not found: cargo build --release -p belay")

    belay_walls, docker_walls, rss, overheads, overheads_incl_val, commits, starts = [], [], [], [], [], [], []
    for r in range(args.rounds):
        work = tempfile.mkdtemp(prefix="belay-bench-")
        repo = os.path.join(work, "repo")
        shutil.copytree(args.example, repo, ignore=shutil.ignore_patterns(".belay", ".venv"))
        run_id = f"bench-{os.getpid()}-{r}"
        tag = f"belay-bench-docker:{run_id}"
        try:
            # Alternate the order so neither side always runs second.
            order = ["belay", "docker"] if r % 2 == 0 else ["docker", "belay"]
            if order[0] == "docker":
                # docker build needs belay's Dockerfile: make it with a throwaway belay run first.
                _, _, _ = run([args.belay, "env", "build", "--repo", repo, "--run-id", run_id + "-df", "--no-cache", "--no-package-cache"])
                dockerfile = os.path.join(repo, ".belay", "runs", run_id + "-df", "Dockerfile.legacy")
                w, _, _ = run(["env", "DOCKER_BUILDKIT=0", "docker", "build", "--no-cache", "-q", "-t", tag, "-f", dockerfile, repo])
                docker_walls.append(w)
                cleanup(run_id + "-df", [])
            w, peak, _ = run([args.belay, "env", "build", "--repo", repo, "--run-id", run_id, "--no-cache", "--no-package-cache"])
            belay_walls.append(w)
            rss.append(peak / 1024.0)
            m = json.load(open(os.path.join(repo, ".belay", "runs", run_id, "manifest.json")))
            assert m["ok"], m["error"]
            for b in m["blocks"]:
                t = b["timing"]
                overheads.append(t["total_s"] - t["script_s"] - t["validation_s"])
                overheads_incl_val.append(t["total_s"] - t["script_s"])
                commits.append(t["checkpoint_s"])
                starts.append(t["total_s"] - t["script_s"] - t["validation_s"] - t["checkpoint_s"])
            if order[0] == "belay":
                dockerfile = os.path.join(repo, ".belay", "runs", run_id, "Dockerfile.legacy")
                w, _, _ = run(["env", "DOCKER_BUILDKIT=0", "docker", "build", "--no-cache", "-q", "-t", tag, "-f", dockerfile, repo])
                docker_walls.append(w)
            print(f"round {r + 1} [{COLD}]: belay {belay_walls[-1]:.1f} s, docker build --no-cache {docker_walls[-1]:.1f} s", flush=True)
        finally:
            cleanup(run_id, [tag])
            shutil.rmtree(work, ignore_errors=True)

    med = statistics.median
    print()
    print(f"example build wall time (belay) [{COLD}]:         {med(belay_walls):.1f} s  (runs: {', '.join(f'{w:.1f}' for w in belay_walls)})")
    print(f"docker build --no-cache, same Dockerfile [{COLD}]: {med(docker_walls):.1f} s  (runs: {', '.join(f'{w:.1f}' for w in docker_walls)})")
    ratios = [b / d for b, d in zip(belay_walls, docker_walls)]
    print(f"ratio belay / docker build [{COLD}]:              {med(ratios):.3f} median of rounds ({', '.join(f'{r:.3f}' for r in ratios)}); ratio of medians {med(belay_walls) / med(docker_walls):.3f}")
    print(f"harness overhead per block (median) [{COLD}]:     {med(overheads):.3f} s  (commit {med(commits):.3f} s; container start + exec + bookkeeping {med(starts):.3f} s)")
    print(f"  without the checkpoint commit [{COLD}]:         {med(starts):.3f} s")
    print(f"  counting validation as overhead too [{COLD}]:   {med(overheads_incl_val):.3f} s")
    print(f"belay peak RSS during a build [{COLD}]:           {max(rss):.1f} MB")

    print()
    out = tempfile.mkdtemp(prefix="belay-plan-")
    fixtures = os.path.join(ROOT, "tests", "fixtures")
    worst = 0.0
    for name in sorted(os.listdir(fixtures)):
        times = []
        for _ in range(20):
            t0 = time.monotonic()
            subprocess.run([args.belay, "env", "plan", "--repo", os.path.join(fixtures, name), "--out", out],
                           capture_output=True, check=True)
            times.append(time.monotonic() - t0)
        worst = max(worst, med(times))
        print(f"env plan {name:<24} {med(times) * 1000:6.1f} ms (median of 20, process start included; a plan uses no cache)")
    shutil.rmtree(out, ignore_errors=True)
    print(f"env plan, slowest fixture: {worst * 1000:.1f} ms")


if __name__ == "__main__":
    main()
