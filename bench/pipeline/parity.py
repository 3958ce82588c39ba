#!/usr/bin/env python3
"""Pipeline parity figures (issue: what a user switching from
agentic-dev-loop hits first), the current belay against a baseline build,
measured in one run:

- engine overhead per step (bench.py's measure: 60 `true` steps; the time
  between step starts minus the command's own exec time), now with the
  artifacts directory, the collection of declared outputs, the console
  observer and the Ctrl-C watch; medians of ROUNDS runs, alternating;
- Ctrl-C to a clean exit: SIGINT during a `sleep 60` step; the time until
  belay has exited (the step recorded as interrupted, its containers and
  networks removed), and a check that no container of the run is left;
- an engine failure under a running command to belay's exit: the step's
  container removed from outside (`docker rm -f`) during a `sleep 60` step.

Cache state: the base image is on the engine; every round uses a fresh
repository and state directory.

    cargo build --release -p belay
    BASELINE=/path/to/old/belay python3 bench/pipeline/parity.py [--rounds 3]
Prints one JSON line.
"""
import argparse, json, os, signal, statistics, subprocess, sys, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402


def containers(run_id):
    out = subprocess.run(["docker", "ps", "-aq", "--filter", f"label=belay.run={run_id}"], capture_output=True, text=True).stdout
    return out.split()


def stop_during_sleep(how, rounds):
    times, left, codes = [], 0, []
    for _ in range(rounds):
        d, ws = bench.repo_with(bench.chain(2, "sleep 60"))
        state = os.path.join(d, "state")
        p = subprocess.Popen([bench.BELAY, "run", os.path.join(ws, "pipeline.yaml"), "--state-dir", state], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 60
        run_dir = None
        while time.time() < deadline:
            try:
                ev, run_dir = bench.events(state)
                if any(e["kind"] == "command" or e["kind"] == "sandbox" for e in ev):
                    break
            except (FileNotFoundError, IndexError, ValueError):
                pass
            time.sleep(0.05)
        time.sleep(1.0)
        run_id = os.path.basename(run_dir)
        t0 = time.time()
        if how == "sigint":
            p.send_signal(signal.SIGINT)
        else:
            subprocess.run(["docker", "rm", "-f", *containers(run_id)], capture_output=True)
        p.wait(timeout=60)
        times.append(time.time() - t0)
        codes.append(p.returncode)
        left += len(containers(run_id))
        subprocess.run(["docker", "rm", "-f", *containers(run_id)], capture_output=True)
        subprocess.run(["rm", "-rf", d])
    return {"s_median": round(statistics.median(times), 3), "rounds_s": [round(t, 3) for t in times], "exit_codes": codes, "containers_left": left}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    binaries = bench.binaries()
    out = {"cache": "base image present; fresh repository and state per round"}
    per = {k: [] for k in binaries}
    for _ in range(a.rounds):
        for k, b in binaries.items():
            per[k].append(bench.overhead(60, b))
    for fig in ("engine_overhead_ms_median", "engine_overhead_ms_p90", "exec_round_trip_ms_median"):
        out[fig] = {k: statistics.median(r[fig] for r in v) for k, v in per.items()}
    out["ctrl_c_to_exit"] = stop_during_sleep("sigint", a.rounds)
    out["engine_failure_to_exit"] = stop_during_sleep("rm", a.rounds)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
