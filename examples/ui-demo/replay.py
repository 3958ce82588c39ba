#!/usr/bin/env python3
"""Replay recorded belay runs into a state directory, with their timing.

    replay.py STATE_HOME RECORDING... [--speed N]

Each RECORDING is a directory holding a run's records as belay wrote them
(events.jsonl, state.json, logs/, commits/, manifest.json, Dockerfile...) and
run.json (its id, mode, title and how it ended). The run appears in the
registry of STATE_HOME as running (owned by this process), its events are
appended one by one as the original run wrote them, and its end is recorded
last: a `belay ui` on STATE_HOME shows it live, as it showed the real run.

The recorded timing is kept: each wait is the recorded gap between two events
(none is cut short), divided by --speed (1: as recorded); the durations the
events carry (`duration_s`) are divided by the same factor, so that a
waterfall drawn from them matches the replayed clock.
"""
import json
import os
import shutil
import sys
import time
from datetime import datetime, timezone


def now():
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def identity():
    with open("/proc/self/stat") as f:
        stat = f.read()
    ticks = int(stat[stat.rfind(")") + 1:].split()[19])
    with open("/proc/sys/kernel/random/boot_id") as f:
        boot = f.read().strip()
    return {"pid": os.getpid(), "start_ticks": ticks, "boot_id": boot}


def registry(home, record):
    os.makedirs(home, exist_ok=True)
    with open(os.path.join(home, "runs.jsonl"), "a") as f:
        f.write("\n" + json.dumps(record))


def scaled(value, speed):
    """`value` with every `duration_s` in it divided by `speed`."""
    if isinstance(value, dict):
        return {k: (v / speed if k == "duration_s" and isinstance(v, (int, float)) else scaled(v, speed))
                for k, v in value.items()}
    if isinstance(value, list):
        return [scaled(v, speed) for v in value]
    return value


def parse_at(at):
    return datetime.strptime(at, "%Y-%m-%dT%H:%M:%S.%fZ").timestamp()


def replay(home, rec, speed):
    with open(os.path.join(rec, "run.json")) as f:
        run = json.load(f)
    dest = os.path.join(home, "runs", run["run_id"])
    if os.path.exists(dest):
        shutil.rmtree(dest)
    os.makedirs(dest)
    # The logs are there from the start (the steps' consoles read them); the
    # final records come with the end.
    if os.path.isdir(os.path.join(rec, "logs")):
        shutil.copytree(os.path.join(rec, "logs"), os.path.join(dest, "logs"))
    registry(home, {"op": "start", "run_id": run["run_id"], "mode": run["mode"],
                    "dir": dest, "at": now(), "owner": identity(), "title": run.get("title")})
    with open(os.path.join(rec, "events.jsonl")) as f:
        events = [json.loads(line) for line in f if line.strip()]
    print(f"replaying {run['mode']} run {run['run_id']}: {len(events)} events", flush=True)
    last = None
    with open(os.path.join(dest, "events.jsonl"), "a") as out:
        for ev in events:
            t = parse_at(ev["at"])
            if last is not None:
                time.sleep(max(0.0, t - last) / speed)
            last = t
            ev["at"] = now()
            if speed != 1.0 and "data" in ev:
                ev["data"] = scaled(ev["data"], speed)
            if ev.get("kind") in ("commit", "run_end") and os.path.isdir(os.path.join(rec, "commits")):
                shutil.copytree(os.path.join(rec, "commits"), os.path.join(dest, "commits"), dirs_exist_ok=True)
            out.write(json.dumps(ev, separators=(",", ":")) + "\n")
            out.flush()
    for name in os.listdir(rec):
        if name in ("run.json", "events.jsonl", "logs", "commits"):
            continue
        src = os.path.join(rec, name)
        if os.path.isfile(src):
            shutil.copy(src, os.path.join(dest, name))
    end = run["end"]
    registry(home, dict({"op": "end", "run_id": run["run_id"], "at": now()}, **end))


def main():
    args = sys.argv[1:]
    speed = 1.0
    if "--speed" in args:
        i = args.index("--speed")
        speed = float(args[i + 1])
        del args[i:i + 2]
    if len(args) < 2:
        sys.exit(__doc__)
    home = os.path.abspath(args[0])
    for rec in args[1:]:
        replay(home, rec, speed)


if __name__ == "__main__":
    main()
