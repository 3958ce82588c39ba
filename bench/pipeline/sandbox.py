#!/usr/bin/env python3
"""Sandbox figures (issue: sandbox escapes), the current belay against a
baseline build (e.g. the commit before the hardening), measured in one run.

- engine overhead per step (bench.py's measure: a chain of `true` steps, the
  time between step starts minus the command's own exec time), which now
  includes the end-of-step kill by pid namespace, the /tmp wipe and the set-id
  strip; medians of ROUNDS runs of 60 steps, the two binaries alternating;
- belay's own peak RSS while committing SIZE of staged text (one step writes
  it, then the commit point stages, checks and commits it): the VmHWM of the
  belay process, read until it exits, for both binaries; and, apart, the
  largest RSS in its process tree (/usr/bin/time), which is git's (`git add`
  holds a file whole);
- the same for a commit of 200,000 files with 230-character names.

Cache state: the base image is on the engine (both runs use it alike); every
round uses a fresh repository and state dir, so no run reuses another's work.

    cargo build --release -p belay
    git worktree add /tmp/belay-base <rev> && (cd /tmp/belay-base && cargo build --release -p belay)
    BASELINE=/tmp/belay-base/target/release/belay python3 bench/pipeline/sandbox.py [--size-gb 1.5] [--rounds 3]
Prints one JSON line.
"""
import argparse, json, os, re, shutil, statistics, subprocess, sys, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402


def vm_hwm_kb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        return None


def peak_rss(belay, pipeline, env=None):
    """belay's own peak RSS (its VmHWM, read until it exits), and the largest
    RSS of the whole process tree (/usr/bin/time: git included)."""
    d, ws = bench.repo_with(pipeline)
    state = os.path.join(d, "state")
    p = subprocess.Popen(["/usr/bin/time", "-f", "maxrss_kb=%M", belay, "run", os.path.join(ws, "pipeline.yaml"), "--state-dir", state],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})
    child = None
    own = 0
    while p.poll() is None:
        if child is None:
            try:
                with open(f"/proc/{p.pid}/task/{p.pid}/children") as f:
                    kids = f.read().split()
                child = int(kids[0]) if kids else None
            except OSError:
                pass
        if child is not None:
            own = max(own, vm_hwm_kb(child) or 0)
        time.sleep(0.05)
    err = p.stderr.read()
    m = re.search(r"maxrss_kb=(\d+)", err)
    committed = subprocess.run(["git", "log", "--oneline"], cwd=ws, capture_output=True, text=True).stdout.count("\n") > 1
    shutil.rmtree(d)
    return {"exit": p.returncode, "committed": committed, "belay_peak_rss_mib": round(own / 1024, 1),
            "tree_peak_rss_mib_git_included": round(int(m.group(1)) / 1024, 1) if m else None}


def big_text(size_bytes):
    """SIZE of base64 text in 100 MB files (git cannot diff one file of more
    than about 1 GB, which the baseline's patch check needs)."""
    files = max(1, round(size_bytes / 100e6))
    raw = int(size_bytes / files * 3 / 4)
    cmd = f"for i in $(seq 1 {files}); do head -c {raw} /dev/urandom | base64 -w 76 > big-$i.txt; done"
    return "\n".join(["name: bench-commit", "deps_policy: open", "steps:",
                      "  - name: write", f"    command: {json.dumps(cmd)}",
                      "    timeout: 1200",
                      "  - name: commit", "    action: commit"]) + "\n"


MANY = "\n".join(["name: bench-many", "deps_policy: open", "steps:", "  - name: gen", "    command: |",
                  "      perl -e 'mkdir \"m\"; for my $d (0..199) { mkdir \"m/$d\"; for my $i (0..999) { open F, \">\", sprintf(\"m/%d/%s-%06d\", $d, \"n\" x 230, $i); close F } }'",
                  "  - name: commit", "    action: commit"]) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-gb", type=float, default=1.5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only-commit", action="store_true", help="skip the overhead rounds")
    a = ap.parse_args()
    binaries = bench.binaries()
    out = {"cache": "base image present; fresh repository and state per round"}
    per = {k: [] for k in binaries}
    for _ in range(0 if a.only_commit else a.rounds):
        for k, b in binaries.items():
            per[k].append(bench.overhead(60, b))
    if not a.only_commit:
        for fig in ("engine_overhead_ms_median", "engine_overhead_ms_p90", "exec_round_trip_ms_median"):
            out[fig] = {k: statistics.median(r[fig] for r in v) for k, v in per.items()}
    size = int(a.size_gb * (1 << 30))
    out[f"commit_{a.size_gb}gb_text"] = {k: peak_rss(b, big_text(size)) for k, b in binaries.items()}
    out["commit_200k_files"] = {k: peak_rss(b, MANY) for k, b in binaries.items()}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
