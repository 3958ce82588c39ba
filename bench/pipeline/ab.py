#!/usr/bin/env python3
"""The pipeline engine's overhead per step, two binaries in one run: a chain
of 60 `true` steps, the binaries alternating round by round.

    python3 bench/pipeline/ab.py BEFORE_BELAY AFTER_BELAY [ROUNDS]

Cache state: the base image present, a fresh repository per run. Prints one
JSON line (medians over the rounds of each run's median and p90).
"""
import json, os, statistics, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench
if len(sys.argv) < 3:
    sys.exit("usage: ab.py BEFORE_BELAY AFTER_BELAY [ROUNDS]")
before, after = sys.argv[1], sys.argv[2]
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
res = {"before": [], "after": []}
for _ in range(rounds):
    for name, b in (("before", before), ("after", after)):
        res[name].append(bench.overhead(60, belay=b))
out = {"cache": "base image present; a fresh repository per run", "rounds": rounds}
for name in res:
    out[name] = {
        "engine_overhead_ms_median": statistics.median(r["engine_overhead_ms_median"] for r in res[name]),
        "engine_overhead_ms_p90_median": statistics.median(r["engine_overhead_ms_p90"] for r in res[name]),
        "exec_round_trip_ms_median": statistics.median(r["exec_round_trip_ms_median"] for r in res[name]),
        "run_wall_s_median": statistics.median(r["run_wall_s"] for r in res[name]),
    }
print(json.dumps(out))
