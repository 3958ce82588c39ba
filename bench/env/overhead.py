#!/usr/bin/env python3
"""Env builder cost per block, against a baseline binary, in one run.

A build of N hand-written blocks (`true`, validated by `true`) on a tiny
unique repository, so every block is a real Docker exec and a real image
commit and nothing is cached (`--no-cache`, a fresh nonce per build). For
N = 5 and N = 50, for each binary:

- wall time of the build, and per block ((wall(50) - wall(5)) / 45: the cost
  of one more block, with the fixed start-up cost cancelled out);
- bytes belay wrote (`wchar` of /proc/<pid>/io: every write(2), files and
  pipes), and the final size of manifest.json.

    cargo build --release -p belay
    BASELINE=/path/to/old/belay python3 bench/env/overhead.py [--rounds 2]

Cache state: cold for belay's checkpoint cache (--no-cache, unique repo);
the base image is present (it is not rebuilt). Prints one JSON line.
"""
import json, os, shutil, statistics, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TARGET = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
BELAY = os.environ.get("BELAY", os.path.join(TARGET, "release", "belay"))
BASELINE = os.environ.get("BASELINE")


def blocks(run_dir, n):
    d = os.path.join(run_dir, "blocks")
    os.makedirs(d)
    for i in range(n):
        bid = f"b{i:03d}"
        script = f"#!/usr/bin/env bash\n# belay block {bid}: bench\n# Goal: bench\nset -euo pipefail\ncd /workspace/repo\n\ntrue\n"
        with open(os.path.join(d, f"{bid}.json"), "w") as f:
            json.dump({"id": bid, "title": bid, "goal": "bench", "script": script, "order": i,
                       "validation_command": "true", "status": "planned", "last_error": None,
                       "baseline_checkpoint": None, "success_checkpoint": None, "repair_attempts": 0}, f)


def build(belay, n):
    d = tempfile.mkdtemp(prefix="belay-bench-env.")
    repo, state = os.path.join(d, "repo"), os.path.join(d, "state")
    os.makedirs(repo)
    with open(os.path.join(repo, "nonce.txt"), "w") as f:
        f.write(f"{time.time_ns()} {os.getpid()} {n}")
    run = f"bench-{n}-{time.time_ns() % 10**9}"
    blocks(os.path.join(state, "runs", run), n)
    # A shell that reports its reaped child's IO counters.
    cmd = f'"$0" env build --repo "$1" --state-dir "$2" --run-id "$3" --no-cache >/dev/null 2>&1; rc=$?; cat /proc/$$/io; exit $rc'
    t0 = time.time()
    p = subprocess.run(["bash", "-c", cmd, belay, repo, state, run], capture_output=True, text=True)
    wall = time.time() - t0
    io = dict(l.split(": ") for l in p.stdout.split("\n") if ": " in l)
    manifest = os.path.join(state, "runs", run, "manifest.json")
    ok = json.load(open(manifest)).get("ok") if os.path.exists(manifest) else None
    out = {"wall_s": round(wall, 2), "wchar_bytes": int(io.get("wchar", 0)),
           "manifest_bytes": os.path.getsize(manifest) if os.path.exists(manifest) else None, "ok": ok}
    subprocess.run(["docker", "image", "prune", "-f", "--filter", f"label=belay.run={run}"], capture_output=True)
    for line in subprocess.run(["docker", "images", "-q", "--filter", f"label=belay.run={run}"], capture_output=True, text=True).stdout.split():
        subprocess.run(["docker", "rmi", "-f", line], capture_output=True)
    shutil.rmtree(d, ignore_errors=True)
    return out


def summary(r):
    med = lambda n, k: statistics.median(x[k] for x in r[n])
    return {
        "builds": r,
        "wall_s_5": med(5, "wall_s"), "wall_s_50": med(50, "wall_s"),
        "per_block_ms": round((med(50, "wall_s") - med(5, "wall_s")) / 45 * 1000, 1),
        "wchar_bytes_5": med(5, "wchar_bytes"), "wchar_bytes_50": med(50, "wchar_bytes"),
        "manifest_bytes_50": med(50, "manifest_bytes"),
    }


def measure(binaries, rounds):
    """Each build of each size alternates between the binaries."""
    r = {name: {5: [], 50: []} for name in binaries}
    for _ in range(rounds):
        for n in (5, 50):
            for name, path in binaries.items():
                r[name][n].append(build(path, n))
    return {name: summary(v) for name, v in r.items()}


if __name__ == "__main__":
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 1
    if not os.path.exists(BELAY):
        sys.exit(f"{BELAY} is missing: cargo build --release -p belay")
    out = {"cache": "cold (--no-cache, unique repository), base image present", "rounds": rounds}
    # Alternating in one run, so both see the same machine.
    binaries = {"baseline": BASELINE, "belay": BELAY} if BASELINE else {"belay": BELAY}
    out.update(measure(binaries, rounds))
    if BASELINE:
        b, n = out["baseline"], out["belay"]
        out["ratio_per_block_new_over_old"] = round(n["per_block_ms"] / b["per_block_ms"], 3) if b["per_block_ms"] else None
        out["ratio_wchar_50_new_over_old"] = round(n["wchar_bytes_50"] / b["wchar_bytes_50"], 3)
    print(json.dumps(out))
