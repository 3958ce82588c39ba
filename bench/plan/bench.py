#!/usr/bin/env python3
"""Plan loop figures (issue: belay plan), against agent-loop-tool 0.2.0.

Both tools run the same two-checkpoint plan with the same scripted agents
(a Python program that sleeps 0.3 s, then edits the plan file as a CLI
would: the developer writes a file and marks its checkpoint built, the
reviewer approves). The peer calls them as `claude` and `codex` (fake CLIs
on PATH, the prompt in argv); belay as `cmd:` agents (the prompt on stdin),
on the host (`--on-host`, the peer's placement) and in containers (belay's
default). Rounds alternate which tool goes first; medians are reported.

- wall time of the run, and the overhead: wall minus the agents' own time
  (4 calls x 0.3 s), per agent call and per commit;
- peak resident memory of the loop's own process (VmHWM of belay; of the
  peer's Python process), sampled from /proc;
- resume after kill -9: the reviewer is killed mid-call with belay, and the
  same command rerun: the time from the rerun's start to the reviewer's call
  starting again (and to the run's end).

    cargo build --release -p belay
    python3 -m venv /tmp/alt && /tmp/alt/bin/pip install agent-loop-tool==0.2.0
    python3 bench/plan/bench.py --peer /tmp/alt/bin/agent-loop [--rounds 5]

Cache state: the base image is present and warm (both tools' agents run no
network installs); every round starts from a fresh repository and state home.
Prints one JSON object.
"""
import argparse, json, os, shutil, signal, statistics, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BELAY = os.environ.get("BELAY", os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target")), "release", "belay"))
AGENT_SLEEP = 0.3

AGENT = r'''#!/usr/bin/env python3
import json, os, re, sys, time
argv = sys.argv[1:]
# The peer passes the prompt after -p (claude) or last (codex); belay on stdin.
if os.environ.get("BENCH_STDIN") == "1" or not argv or argv[0] == "cmd":
    prompt = sys.stdin.read()
elif "-p" in argv:
    prompt = argv[argv.index("-p") + 1]
else:
    prompt = argv[-1]
time.sleep(float(os.environ.get("BENCH_SLEEP", "0.3")))
m = re.search(r"checkpoint '([^']+)'", prompt)
cid = m.group(1)
path = "plan_checkpoints.json"
plan = json.load(open(path))
review = "Review ONLY" in prompt
for cp in plan["checkpoints"]:
    if cp["id"] == cid:
        if review:
            cp["status"] = "approved"
            cp["review_notes"] = "ok"
        else:
            open(cid + ".txt", "w").write(cid + "\n")
            cp["status"] = "built"
            cp["review_notes"] = "built " + cid
json.dump(plan, open(path, "w"), indent=2)
print("done " + cid)
'''

# belay's agents: the same behaviour in sh (the base image has no Python),
# the prompt on stdin; `slow` makes the reviewer hang (for the kill -9).
AGENT_SH = r'''#!/bin/sh
p=$(cat)
sleep 0.3
id=$(printf '%s\n' "$p" | sed -n "s/.*checkpoint '\([^']*\)'.*/\1/p" | head -n1)
case "$p" in
  *"Review ONLY"*)
    [ "$1" = slow ] && sleep 3600
    sed -i "/\"id\": \"$id\"/,/\"status\"/ s/\"status\": \"[a-z]*\"/\"status\": \"approved\"/" plan_checkpoints.json
    # belay takes the verdict from the reviewer's final message only.
    echo "looks good"; echo "VERDICT: approved"; exit 0 ;;
  *)
    echo "$id" > "$id.txt"
    sed -i "/\"id\": \"$id\"/,/\"status\"/ s/\"status\": \"[a-z]*\"/\"status\": \"built\"/" plan_checkpoints.json ;;
esac
echo "done $id"
'''

PLAN = {
    "plan_file": "docs/plan.md",
    "branch": "feature/bench",
    "checkpoints": [
        {"id": f"c{i}", "name": f"c{i}", "status": "pending", "scope": f"write c{i}.txt",
         "exit_criteria": [f"c{i}.txt exists"], "attempts": 0, "review_notes": ""}
        for i in (1, 2)
    ],
}


def setup():
    d = tempfile.mkdtemp(prefix="belay-bench-plan.")
    repo = os.path.join(d, "repo")
    os.makedirs(repo)
    with open(os.path.join(repo, "plan_checkpoints.json"), "w") as f:
        json.dump(PLAN, f, indent=2)
    open(os.path.join(repo, ".gitignore"), "w").write("logs/\n")
    for args in (["init", "-q", "-b", "main"], ["add", "-A"],
                 ["-c", "user.name=b", "-c", "user.email=b@b", "commit", "-q", "-m", "init"]):
        subprocess.run(["git", *args], cwd=repo, check=True)
    subprocess.run(["git", "config", "user.name", "b"], cwd=repo, check=True)
    subprocess.run(["git", "config", "user.email", "b@b"], cwd=repo, check=True)
    bin_dir = os.path.join(d, "bin")
    os.makedirs(bin_dir)
    agent = os.path.join(bin_dir, "agent.py")
    open(agent, "w").write(AGENT)
    os.chmod(agent, 0o755)
    for name in ("claude", "codex"):
        os.symlink(agent, os.path.join(bin_dir, name))
    sh = os.path.join(bin_dir, "agent.sh")
    open(sh, "w").write(AGENT_SH)
    os.chmod(sh, 0o755)
    return d, repo, bin_dir, agent, sh


def peak_rss_kib(proc):
    """Poll the process's VmHWM until it exits; its peak RSS in KiB."""
    peak = 0
    while proc.poll() is None:
        try:
            for line in open(f"/proc/{proc.pid}/status"):
                if line.startswith("VmHWM:"):
                    peak = max(peak, int(line.split()[1]))
        except OSError:
            pass
        time.sleep(0.01)
    return peak


def run_belay(on_host):
    d, repo, bin_dir, _, agent = setup()
    env = dict(os.environ, BELAY_STATE_HOME=os.path.join(d, "state"))
    cmd = [BELAY, "-q", "plan", "run", "--developer", f"cmd:{agent}", "--reviewer", f"cmd:{agent}"]
    if on_host:
        cmd.append("--on-host")
    t0 = time.time()
    p = subprocess.Popen(cmd, cwd=repo, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    rss = peak_rss_kib(p)
    wall = time.time() - t0
    err = p.stderr.read().decode()
    if p.returncode != 0:
        sys.exit(f"belay failed: {err}")
    commits = int(subprocess.run(["git", "rev-list", "--count", "main..feature/bench"], cwd=repo,
                                 capture_output=True, text=True).stdout)
    shutil.rmtree(d, ignore_errors=True)
    return wall, rss, commits


def run_peer(peer):
    d, repo, bin_dir, agent, _ = setup()
    env = dict(os.environ, ALLOW_AUTO_MODE_CLAUDE="1", ALLOW_AUTO_MODE_CODEX="1",
               LOCK_DIR=os.path.join(d, "lock"))
    env["PATH"] = bin_dir + ":" + env["PATH"]
    t0 = time.time()
    p = subprocess.Popen([peer, "run", "--log-dir", os.path.join(d, "logs")], cwd=repo, env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    rss = peak_rss_kib(p)
    wall = time.time() - t0
    err = p.stderr.read().decode()
    if p.returncode != 0:
        sys.exit(f"agent-loop failed: {err}")
    commits = int(subprocess.run(["git", "rev-list", "--count", "main..feature/bench"], cwd=repo,
                                 capture_output=True, text=True).stdout)
    shutil.rmtree(d, ignore_errors=True)
    return wall, rss, commits


def resume(on_host):
    """kill -9 during the review of c1, rerun: seconds to the reviewer's call, and to the end."""
    d, repo, bin_dir, _, agent = setup()
    env = dict(os.environ, BELAY_STATE_HOME=os.path.join(d, "state"))
    cmd = [BELAY, "-q", "plan", "run", "--developer", f"cmd:{agent}", "--reviewer", f"cmd:{agent}"]
    if on_host:
        cmd.append("--on-host")
    slow = [c if c != f"cmd:{agent}" or i < 6 else f"cmd:{agent} slow" for i, c in enumerate(cmd)]
    p = subprocess.Popen(slow, cwd=repo, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    runs = os.path.join(d, "state", "plan", "runs")

    def events():
        try:
            run = sorted(os.listdir(runs))[-1]
            with open(os.path.join(runs, run, "events.jsonl")) as f:
                return [json.loads(l) for l in f]
        except (OSError, IndexError, ValueError):
            return []

    deadline = time.time() + 120
    while not any(e["kind"] == "agent_trace" and e["data"].get("role") == "reviewer" and e["data"]["action"] == "start" for e in events()):
        if time.time() > deadline:
            sys.exit("the reviewer never started")
        time.sleep(0.02)
    time.sleep(0.5 + AGENT_SLEEP)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    seen = len(events())
    t0 = time.time()
    q = subprocess.Popen(cmd, cwd=repo, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    to_review = None
    while q.poll() is None or to_review is None:
        ev = events()[seen:]
        if to_review is None and any(e["kind"] == "agent_trace" and e["data"].get("role") == "reviewer" and e["data"]["action"] == "start" for e in ev):
            to_review = time.time() - t0
        if q.poll() is not None and to_review is None:
            sys.exit("the rerun never reached the review")
        time.sleep(0.005)
    total = time.time() - t0
    shutil.rmtree(d, ignore_errors=True)
    return to_review, total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--peer", required=True, help="the agent-loop executable")
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    agents_time = 4 * AGENT_SLEEP
    rows = {"belay_host": [], "belay_container": [], "peer": []}
    for r in range(a.rounds):
        order = ["peer", "belay_host", "belay_container"]
        if r % 2:
            order.reverse()
        for name in order:
            if name == "peer":
                rows[name].append(run_peer(a.peer))
            else:
                rows[name].append(run_belay(name == "belay_host"))
    out = {"rounds": a.rounds, "agent_sleep_s": AGENT_SLEEP, "cache": "warm base image; fresh repository and state per round"}
    for name, vals in rows.items():
        wall = statistics.median(v[0] for v in vals)
        commits = vals[0][2]
        over = wall - agents_time
        out[name] = {
            "wall_s": round(wall, 3),
            "overhead_s": round(over, 3),
            "overhead_per_agent_call_ms": round(over / 4 * 1000, 1),
            "overhead_per_commit_ms": round(over / commits * 1000, 1),
            "commits": commits,
            "peak_rss_mib": round(statistics.median(v[1] for v in vals) / 1024, 1),
        }
    out["ratio_wall_belay_host_to_peer"] = round(out["belay_host"]["wall_s"] / out["peer"]["wall_s"], 2)
    out["ratio_wall_belay_container_to_peer"] = round(out["belay_container"]["wall_s"] / out["peer"]["wall_s"], 2)
    out["ratio_overhead_belay_host_to_peer"] = round(out["belay_host"]["overhead_s"] / out["peer"]["overhead_s"], 2)
    out["ratio_rss_belay_to_peer"] = round(out["belay_host"]["peak_rss_mib"] / out["peer"]["peak_rss_mib"], 2)
    res = [resume(True) for _ in range(3)]
    res_c = [resume(False) for _ in range(3)]
    out["resume_host"] = {"to_review_s": round(statistics.median(x[0] for x in res), 3), "to_end_s": round(statistics.median(x[1] for x in res), 3)}
    out["resume_container"] = {"to_review_s": round(statistics.median(x[0] for x in res_c), 3), "to_end_s": round(statistics.median(x[1] for x in res_c), 3)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
