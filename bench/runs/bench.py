#!/usr/bin/env python3
"""Run-layer figures (issue: one run layer).

- `belay runs list` over a registry of 10,000 runs (each started and ended, as
  real runs write them): the median wall time of 20 invocations, process start
  included, warm page cache (the index was just written);
- the latency from an event's append to its appearance in `belay runs events
  --follow` run from another process: a writer appends envelopes to a run's
  events.jsonl at random intervals and records the time of each append; the
  follower's output is read line by line and timestamped; the median and p90 of
  the difference over 200 events.

    cargo build --release -p belay && python3 bench/runs/bench.py
Prints one JSON line.
"""
import json, os, random, statistics, subprocess, sys, tempfile, threading, time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BELAY = os.environ.get("BELAY", os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target")), "release", "belay"))


def now():
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())


def registry_with(d, n, live_owner=None):
    with open(os.path.join(d, "runs.jsonl"), "w") as f:
        for i in range(n):
            rid = f"bench-{i:06d}"
            f.write("\n" + json.dumps({"op": "start", "run_id": rid, "mode": "pipeline", "dir": f"/tmp/nowhere/{rid}", "at": now(),
                                       "owner": None, "title": "bench"}))
            f.write("\n" + json.dumps({"op": "end", "run_id": rid, "at": now(), "ok": i % 3 != 0, "duration_s": 12.5, "tokens": 1000 + i, "cost_usd": 0.01}))


def list_time(n=10000, rounds=20):
    d = tempfile.mkdtemp(prefix="belay-bench-runs.")
    registry_with(d, n)
    env = {**os.environ, "BELAY_STATE_HOME": d}
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        out = subprocess.run([BELAY, "runs", "list"], env=env, capture_output=True, check=True)
        times.append(time.perf_counter() - t0)
        assert out.stdout.count(b"\n") == n + 1, out.stdout[:200]
    return {"runs": n, "median_ms": round(statistics.median(times) * 1000, 1), "max_ms": round(max(times) * 1000, 1)}


def follow_latency(events=200):
    d = tempfile.mkdtemp(prefix="belay-bench-follow.")
    run_dir = os.path.join(d, "run")
    os.makedirs(run_dir)
    rid = "bench-follow"
    # The writer is this process: register the run as started by it (alive).
    with open("/proc/self/stat") as f:
        start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    boot = open("/proc/sys/kernel/random/boot_id").read().strip()
    with open(os.path.join(d, "runs.jsonl"), "w") as f:
        f.write("\n" + json.dumps({"op": "start", "run_id": rid, "mode": "pipeline", "dir": run_dir, "at": now(),
                                   "owner": {"pid": os.getpid(), "start_ticks": start_ticks, "boot_id": boot}}))
    log = open(os.path.join(run_dir, "events.jsonl"), "a", buffering=1)
    env = {**os.environ, "BELAY_STATE_HOME": d}
    p = subprocess.Popen([BELAY, "runs", "events", rid, "--follow", "--json"], env=env, stdout=subprocess.PIPE)
    seen = {}

    def reader():
        for line in p.stdout:
            seen[json.loads(line)["seq"]] = time.perf_counter()

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    time.sleep(0.5)
    sent = {}
    for seq in range(1, events + 1):
        ev = {"v": 1, "seq": seq, "at": now(), "run_id": rid, "mode": "pipeline", "source": "engine", "kind": "step_end", "data": {"n": seq}}
        log.write(json.dumps(ev) + "\n")
        sent[seq] = time.perf_counter()
        time.sleep(random.uniform(0.005, 0.05))
    time.sleep(1.0)
    p.kill()
    lat = sorted((seen[s] - sent[s]) * 1000 for s in sent if s in seen)
    return {"events": events, "received": len(lat), "median_ms": round(statistics.median(lat), 1), "p90_ms": round(lat[int(0.9 * (len(lat) - 1))], 1)}


if __name__ == "__main__":
    if not os.path.exists(BELAY):
        sys.exit(f"{BELAY} is missing: cargo build --release -p belay")
    print(json.dumps({"list": list_time(), "follow": follow_latency(), "cache": "warm page cache; a registry written just before"}))
