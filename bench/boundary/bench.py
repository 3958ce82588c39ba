#!/usr/bin/env python3
"""What the trust boundary costs: rounds per round and the plan loop per
agent call, on the host, before and after (two belay binaries), in one run.

- rounds: `rounds serve --max-rounds N` with the config inside the work tree
  (the layout `rounds init` makes, so the trusted copies of the config and
  the prompt are checked every round), `placement = "host"`, a fake agent
  that commits a line; per round: the span from the first round_start to the
  last round_end by serve's own events, less the agent's own time (run
  alone), divided by N;
- plan: a two-checkpoint plan, `plan run --on-host` with scripted `cmd:`
  agents that sleep 0.3 s (4 calls); per call: (wall - 4 x 0.3 s) / 4. The
  reviewer answers `VERDICT: approved` (the new binary's channel) and, for
  the old binary only (`cmd:agent.py edits`), also marks the plan file
  approved, the old channel: each binary takes its own verdict path.

    BASELINE=/path/to/belay-before BELAY=/path/to/belay-after \
      python3 bench/boundary/bench.py [--rounds 5] [--n 10]

Cache state: warm (no container starts; fresh repository, log dir and state
home per measurement). Rounds alternate which binary goes first; medians.
Prints one JSON object.
"""
import argparse, datetime, glob, json, os, shutil, statistics, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TARGET = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
AFTER = os.environ.get("BELAY", os.path.join(TARGET, "release", "belay"))
BEFORE = os.environ.get("BASELINE")
SLEEP = 0.3

ROUND_AGENT = r'''#!/bin/sh
echo "round ${AGENT_RUNNER_ROUND_NUM:-?}" >> rounds.txt
git add rounds.txt
git -c user.name=bench -c user.email=bench@example.invalid commit -qm "round ${AGENT_RUNNER_ROUND_NUM:-?}"
echo '{"type":"result","subtype":"success"}'
'''

PLAN_AGENT = r'''#!/usr/bin/env python3
import json, os, re, sys, time
prompt = sys.stdin.read()
time.sleep(float(os.environ.get("BENCH_SLEEP", "0.3")))
cid = re.search(r"checkpoint '([^']+)'", prompt).group(1)
path = "plan_checkpoints.json"
review = "Review ONLY" in prompt
if review:
    if "edits" in sys.argv[1:]:
        plan = json.load(open(path))
        for cp in plan["checkpoints"]:
            if cp["id"] == cid:
                cp["status"] = "approved"
                cp["review_notes"] = "ok"
        json.dump(plan, open(path, "w"), indent=2)
    print("looks right for " + cid)
    print("VERDICT: approved")
else:
    plan = json.load(open(path))
    for cp in plan["checkpoints"]:
        if cp["id"] == cid:
            open(cid + ".txt", "w").write(cid + "\n")
            cp["status"] = "built"
            cp["review_notes"] = "built " + cid
    json.dump(plan, open(path, "w"), indent=2)
    print("done " + cid)
'''

PLAN = {
    "plan_file": "docs/plan.md",
    "branch": "feature/bench",
    "checkpoints": [
        {"id": f"c{i}", "name": f"step {i}", "scope": f"write c{i}.txt", "exit_criteria": [f"c{i}.txt exists"],
         "status": "pending", "attempts": 0, "review_notes": ""}
        for i in (1, 2)
    ],
}


def git(repo, *args):
    subprocess.run(["git", *args], cwd=repo, check=True, stdout=subprocess.DEVNULL)


def new_repo(d):
    repo = os.path.join(d, "repo")
    os.makedirs(repo)
    git(repo, "init", "-q", "-b", "main")
    return repo


def commit_all(repo):
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=b", "-c", "user.email=b@example.invalid", "commit", "-qm", "init")


def env_for(d):
    e = dict(os.environ, HOME=d, BELAY_STATE_HOME=os.path.join(d, "state"))
    e.pop("OPENAI_API_KEY", None)
    return e


def rounds_setup():
    d = tempfile.mkdtemp(prefix="bench-boundary-rounds-")
    repo = new_repo(d)
    os.makedirs(os.path.join(repo, "prompts"))
    open(os.path.join(repo, "prompts", "main.md"), "w").write("Work on the project.\n" + "Keep going. " * 60 + "\n")
    agent = os.path.join(d, "agent.sh")
    open(agent, "w").write(ROUND_AGENT)
    os.chmod(agent, 0o755)
    cfg = os.path.join(repo, "agent-runner.toml")
    open(cfg, "w").write("\n".join([
        "schema_version = 1",
        "[agent]",
        f'command = ["{agent}"]',
        'prompt_arg_template = ["{prompt}"]',
        'placement = "host"',
        "[runtime]",
        'work_dir = "."',
        f'log_dir = "{os.path.join(d, "logs")}"',
        "round_budget_s = 60",
        "restart_delay_s = 0.01",
        "[prompt]",
        'file = "./prompts/main.md"',
    ]) + "\n")
    open(os.path.join(repo, ".gitignore"), "w").write("rounds.txt.lock\n")
    commit_all(repo)
    return d, repo, cfg, agent


def agent_alone(n):
    d, repo, _, agent = rounds_setup()
    t0 = time.monotonic()
    for _ in range(n):
        subprocess.run([agent, "x"], cwd=repo, stdout=subprocess.DEVNULL, check=True)
    wall = (time.monotonic() - t0) / n
    shutil.rmtree(d, ignore_errors=True)
    return wall


def span(log_dir):
    starts, ends = [], []
    for f in glob.glob(os.path.join(log_dir, "**", "events*.jsonl"), recursive=True):
        for line in open(f):
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if e.get("kind") not in ("round_start", "round_end"):
                continue
            t = datetime.datetime.fromisoformat(e["at"].replace("Z", "+00:00")).timestamp()
            (starts if e["kind"] == "round_start" else ends).append(t)
    return max(ends) - min(starts) if starts and ends else None


def rounds_once(belay, n, agent_wall):
    d, repo, cfg, _ = rounds_setup()
    env = env_for(d)
    if belay == AFTER:
        # The first run of an in-tree config trusts it as it is.
        subprocess.run([belay, "-q", "rounds", "--config", cfg, "trust"], env=env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t0 = time.monotonic()
    p = subprocess.run([belay, "-q", "rounds", "--config", cfg, "serve", "--max-rounds", str(n)],
                       env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.monotonic() - t0
    made = int(subprocess.run(["git", "rev-list", "--count", "HEAD"], cwd=repo, capture_output=True, text=True).stdout) - 1
    if p.returncode != 0 or made != n:
        sys.exit(f"{belay}: serve exited {p.returncode} after {made} rounds: {p.stderr[-2000:]}")
    s = span(os.path.join(d, "logs"))
    shutil.rmtree(d, ignore_errors=True)
    return (s - n * agent_wall) / n, (wall - n * agent_wall) / n


def plan_once(belay):
    d = tempfile.mkdtemp(prefix="bench-boundary-plan-")
    repo = new_repo(d)
    json.dump(PLAN, open(os.path.join(repo, "plan_checkpoints.json"), "w"), indent=2)
    open(os.path.join(repo, "README"), "w").write("bench\n")
    os.makedirs(os.path.join(repo, "docs"))
    open(os.path.join(repo, "docs", "plan.md"), "w").write("# plan\n")
    commit_all(repo)
    agent = os.path.join(d, "agent.py")
    open(agent, "w").write(PLAN_AGENT)
    os.chmod(agent, 0o755)
    env = env_for(d)
    # The old binary takes the verdict from the plan file: its reviewer
    # edits it too (agents get an explicit environment, so this goes in argv).
    spec = f"cmd:{agent} edits" if belay == BEFORE else f"cmd:{agent}"
    t0 = time.monotonic()
    p = subprocess.run([belay, "-q", "plan", "run", "--developer", spec, "--reviewer", spec,
                        "--on-host", "--auto-approve"], cwd=repo, env=env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.monotonic() - t0
    if p.returncode != 0:
        sys.exit(f"{belay}: plan run exited {p.returncode}: {p.stderr[-2000:]}")
    shutil.rmtree(d, ignore_errors=True)
    return (wall - 4 * SLEEP) / 4


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--n", type=int, default=10, help="rounds per serve")
    a = ap.parse_args()
    if not BEFORE:
        sys.exit("set BASELINE to the belay binary to compare against")
    agent_wall = agent_alone(a.n)
    res = {"before": {"round": [], "round_wall": [], "call": []}, "after": {"round": [], "round_wall": [], "call": []}}
    for r in range(a.rounds):
        order = [("before", BEFORE), ("after", AFTER)]
        if r % 2:
            order.reverse()
        for name, b in order:
            loop, whole = rounds_once(b, a.n, agent_wall)
            res[name]["round"].append(loop)
            res[name]["round_wall"].append(whole)
            res[name]["call"].append(plan_once(b))
    out = {"rounds": a.rounds, "serve_rounds": a.n, "agent_round_s": round(agent_wall, 4), "plan_agent_sleep_s": SLEEP,
           "cache": "warm; host placement, no containers; fresh repository and state per measurement"}
    for name in ("before", "after"):
        out[name] = {
            "rounds_overhead_per_round_ms": round(statistics.median(res[name]["round"]) * 1000, 1),
            "rounds_wall_overhead_per_round_ms": round(statistics.median(res[name]["round_wall"]) * 1000, 1),
            "plan_overhead_per_call_ms": round(statistics.median(res[name]["call"]) * 1000, 1),
        }
    out["boundary_cost_per_round_ms"] = round(out["after"]["rounds_overhead_per_round_ms"] - out["before"]["rounds_overhead_per_round_ms"], 1)
    out["boundary_cost_per_call_ms"] = round(out["after"]["plan_overhead_per_call_ms"] - out["before"]["plan_overhead_per_call_ms"], 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
