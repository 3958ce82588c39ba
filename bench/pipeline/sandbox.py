#!/usr/bin/env python3
"""Sandbox figures (issue: sandbox escapes), the current belay against a
baseline build (e.g. the commit before the hardening), measured in one run.

- engine overhead per step (bench.py's measure: a chain of `true` steps, the
  time between step starts minus the command's own exec time), which now
  includes the end-of-step kill by pid namespace, the /tmp wipe and the set-id
  strip; medians of ROUNDS runs of 60 steps, the two binaries alternating;
- belay's peak RSS while committing SIZE of staged text (one step writes it,
  then the commit point stages, checks and commits it), read by /usr/bin/time
  for both binaries (the current one also reports it in summary.json);
- the same for a commit of 200,000 files with 230-character names.

Cache state: the base image is on the engine (both runs use it alike); every
round uses a fresh repository and state dir, so no run reuses another's work.

    cargo build --release -p belay
    git worktree add /tmp/belay-base <rev> && (cd /tmp/belay-base && cargo build --release -p belay)
    BASELINE=/tmp/belay-base/target/release/belay python3 bench/pipeline/sandbox.py [--size-gb 1.5] [--rounds 3]
Prints one JSON line.
"""
import argparse, json, os, re, shutil, statistics, subprocess, sys, tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402


def peak_rss(belay, pipeline, env=None):
    d, ws = bench.repo_with(pipeline)
    state = os.path.join(d, "state")
    r = subprocess.run(["/usr/bin/time", "-f", "maxrss_kb=%M", belay, "run", os.path.join(ws, "pipeline.yaml"), "--state-dir", state],
                       capture_output=True, text=True, env={**os.environ, **(env or {})})
    m = re.search(r"maxrss_kb=(\d+)", r.stderr)
    committed = subprocess.run(["git", "log", "--oneline"], cwd=ws, capture_output=True, text=True).stdout.count("\n") > 1
    shutil.rmtree(d)
    return {"exit": r.returncode, "committed": committed, "peak_rss_mib": round(int(m.group(1)) / 1024, 1) if m else None}


def big_text(size_bytes):
    raw = int(size_bytes * 3 / 4)
    return "\n".join(["name: bench-commit", "deps_policy: open", "isolation: {log_limit: 1m}", "steps:",
                      "  - name: write", f"    command: head -c {raw} /dev/urandom | base64 -w 76 > big.txt",
                      "    timeout: 1200",
                      "  - name: commit", "    action: commit"]) + "\n"


MANY = "\n".join(["name: bench-many", "deps_policy: open", "steps:", "  - name: gen", "    command: |",
                  "      perl -e 'mkdir \"m\"; for my $d (0..199) { mkdir \"m/$d\"; for my $i (0..999) { open F, \">\", sprintf(\"m/%d/%s-%06d\", $d, \"n\" x 230, $i); close F } }'",
                  "  - name: commit", "    action: commit"]) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-gb", type=float, default=1.5)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    binaries = {"current": bench.BELAY, "baseline": os.environ.get("BASELINE")}
    binaries = {k: v for k, v in binaries.items() if v and os.path.exists(v)}
    if "current" not in binaries:
        sys.exit(f"{bench.BELAY} is missing: cargo build --release -p belay")
    out = {"cache": "base image present; fresh repository and state per round"}
    per = {k: [] for k in binaries}
    for _ in range(a.rounds):
        for k, b in binaries.items():
            per[k].append(bench.overhead(60, b))
    out["engine_overhead_ms_median"] = {k: statistics.median(r["engine_overhead_ms_median"] for r in v) for k, v in per.items()}
    out["engine_overhead_ms_p90"] = {k: statistics.median(r["engine_overhead_ms_p90"] for r in v) for k, v in per.items()}
    out["exec_round_trip_ms_median"] = {k: statistics.median(r["exec_round_trip_ms_median"] for r in v) for k, v in per.items()}
    size = int(a.size_gb * (1 << 30))
    out[f"commit_{a.size_gb}gb_text"] = {k: peak_rss(b, big_text(size)) for k, b in binaries.items()}
    out["commit_200k_files"] = {k: peak_rss(b, MANY) for k, b in binaries.items()}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
