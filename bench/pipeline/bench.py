#!/usr/bin/env python3
"""Pipeline engine figures (issue: pipeline loop).

- engine overhead per step, excluding the command's own time: a pipeline of N
  `true` command steps; per step, the time from one step_start to the next minus
  the command's own recorded duration (which includes the docker exec round
  trip, reported separately);
- resume latency: kill -9 during a long step, then `belay run --resume`: time
  from the resume's start to the interrupted step starting again;
- state size: state.json and events.jsonl after 10, 50 and 200 steps
  (state.json must stay flat; events grow linearly, appended, never rewritten).

    cargo build --release -p belay && python3 bench/pipeline/bench.py
Prints one JSON line.
"""
import json, os, shutil, signal, statistics, subprocess, sys, tempfile, time
from datetime import datetime

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BELAY = os.environ.get("BELAY", os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target")), "release", "belay"))


def ts(s):
    return datetime.strptime(s.replace("Z", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z").timestamp()


def repo_with(pipeline_text):
    d = tempfile.mkdtemp(prefix="belay-bench-pipe.")
    ws = os.path.join(d, "ws")
    os.makedirs(ws)
    with open(os.path.join(ws, "pipeline.yaml"), "w") as f:
        f.write(pipeline_text)
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["-c", "user.name=b", "-c", "user.email=b@b", "commit", "-q", "-m", "init"]):
        subprocess.run(["git", *args], cwd=ws, check=True)
    return d, ws


def chain(n, command="true"):
    lines = ["name: bench", "deps_policy: open", "max_attempts: 1", "steps:"]
    for i in range(n):
        lines += [f"  - name: s{i}", f"    command: {json.dumps(command)}"]
    return "\n".join(lines) + "\n"


def binaries():
    """The current build and, when BASELINE names one, a baseline build."""
    found = {"current": BELAY, "baseline": os.environ.get("BASELINE")}
    found = {k: v for k, v in found.items() if v and os.path.exists(v)}
    if "current" not in found:
        sys.exit(f"{BELAY} is missing: cargo build --release -p belay")
    return found


def events(state):
    runs = os.path.join(state, "runs")
    run = sorted(os.listdir(runs))[-1]
    with open(os.path.join(runs, run, "events.jsonl")) as f:
        return [json.loads(l) for l in f], os.path.join(runs, run)


def overhead(n=60, belay=None):
    belay = belay or BELAY
    d, ws = repo_with(chain(n))
    state = os.path.join(d, "state")
    t0 = time.time()
    subprocess.run([belay, "run", os.path.join(ws, "pipeline.yaml"), "--state-dir", state], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.time() - t0
    ev, run_dir = events(state)
    starts = [ts(e["at"]) for e in ev if e["kind"] == "step_start"]
    # The envelope has the payload under `data` (older builds flattened it).
    cmds = [(e.get("data") or e)["duration_s"] for e in ev if e["kind"] == "command"]
    ends = [ts(e["at"]) for e in ev if e["kind"] == "run_end"]
    per_step = [(starts[i + 1] - starts[i]) - cmds[i] for i in range(len(starts) - 1)]
    per_step.append(ends[0] - starts[-1] - cmds[-1])
    # Skip the first step (it creates the container).
    shutil.rmtree(d)
    return {
        "steps": n,
        "engine_overhead_ms_median": round(statistics.median(per_step[1:]) * 1000, 1),
        "engine_overhead_ms_p90": round(sorted(per_step[1:])[int(0.9 * (len(per_step) - 1))] * 1000, 1),
        "exec_round_trip_ms_median": round(statistics.median(cmds[1:]) * 1000, 1),
        "first_step_ms_including_container_start": round((per_step[0] + cmds[0]) * 1000, 1),
        "run_wall_s": round(wall, 2),
    }


def resume_latency(rounds=3):
    out = []
    for _ in range(rounds):
        d, ws = repo_with(chain(3, "sleep 30"))
        state = os.path.join(d, "state")
        p = subprocess.Popen([BELAY, "run", os.path.join(ws, "pipeline.yaml"), "--state-dir", state], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                ev, run_dir = events(state)
                if any(e["kind"] == "sandbox" for e in ev):
                    break
            except (FileNotFoundError, IndexError, ValueError):
                pass
            time.sleep(0.05)
        time.sleep(0.5)
        p.send_signal(signal.SIGKILL)
        p.wait()
        run_id = os.path.basename(run_dir)
        before = len(events(state)[0])
        t0 = time.time()
        r = subprocess.Popen([BELAY, "run", os.path.join(ws, "pipeline.yaml"), "--state-dir", state, "--resume", run_id], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        latency = None
        while time.time() < t0 + 60:
            ev, _ = events(state)
            if any(e["kind"] == "step_start" for e in ev[before:]):
                latency = time.time() - t0
                break
            time.sleep(0.005)
        r.send_signal(signal.SIGKILL)
        r.wait()
        subprocess.run(["docker", "rm", "-f", *subprocess.run(["docker", "ps", "-aq", "--filter", f"label=belay.run={run_id}"], capture_output=True, text=True).stdout.split()], capture_output=True)
        shutil.rmtree(d)
        out.append(latency)
    return {"resume_to_step_start_s_median": round(statistics.median(out), 3), "rounds": [round(x, 3) for x in out]}


def loop(attempts):
    return "\n".join([
        "name: bench-loop", "deps_policy: open", f"max_attempts: {attempts}", "steps:",
        "  - name: work", "    command: \"true\"", "    on_pass: gate",
        "  - name: gate", "    command: \"false\"", "    on_fail: {goto: work, retry: true}",
    ]) + "\n"


def state_size():
    """A long run: a two-step loop retried until its attempts run out."""
    sizes = {}
    for attempts in (10, 50, 100):
        d, ws = repo_with(loop(attempts))
        state = os.path.join(d, "state")
        subprocess.run([BELAY, "run", os.path.join(ws, "pipeline.yaml"), "--state-dir", state], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _, run_dir = events(state)
        sizes[2 * attempts] = {"state_json_bytes": os.path.getsize(os.path.join(run_dir, "state.json")), "events_bytes": os.path.getsize(os.path.join(run_dir, "events.jsonl"))}
        shutil.rmtree(d)
    per_step = (sizes[200]["events_bytes"] - sizes[20]["events_bytes"]) / 180
    return {"by_step_runs": sizes, "events_bytes_per_step_run": round(per_step)}


if __name__ == "__main__":
    if not os.path.exists(BELAY):
        sys.exit(f"{BELAY} is missing: cargo build --release -p belay")
    print(json.dumps({"overhead": overhead(), "resume": resume_latency(), "state": state_size()}))
