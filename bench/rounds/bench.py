#!/usr/bin/env python3
"""Round supervisor figures (issue: belay rounds), against cli-agent-runner 0.3.14.

Both tools read the same agent-runner.toml and run the same fake agent: a
shell script that sleeps AGENT_SLEEP seconds, then appends a line to a file
and commits it (so no round leaves a dirty tree), and prints a result line.
belay runs it on the host (`placement = "host"`, the peer's placement) and in
a container (belay's default; the file is otherwise the same).

- overhead per round: `serve --max-rounds N`, wall time minus the agent's own
  time (its sleep and its commit, measured by running it alone) and the
  restart delays, divided by N; the same from the first round's start to the
  last one's end by each tool's own events (serve's start and exit left
  out); and one `round` command, wall minus the agent's time (a process start
  included);
- CPU per round: the supervisor's own user+system time (its process tree,
  less the agents' own CPU, measured by running the agent alone), per round;
- resident memory, the monitor included: sampled from /proc every 20 ms while
  serve runs rounds of 2 s with 2 s delays; idle is between rounds, mid-round
  is while the agent sleeps. The peer's figure is serve + its per-round
  Python process + its monitor process (`agent-runner monitor`, its default
  layout); belay's is the one serve process (its monitor is inside). The
  `docker exec` client of the container placement is reported apart.

    cargo build --release -p belay
    python3 -m venv /tmp/car && /tmp/car/bin/pip install cli-agent-runner==0.3.14
    python3 bench/rounds/bench.py --peer /tmp/car/bin/agent-runner [--rounds 10]

Cache state: warm. The agent image (belay-agent:bookworm) is present; every
measurement starts from a fresh repository and log dir. Prints one JSON object.
"""
import argparse, json, os, shutil, statistics, subprocess, sys, tempfile, threading, time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BELAY = os.environ.get("BELAY", os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target")), "release", "belay"))

AGENT = r'''#!/bin/sh
# The fake agent: the prompt in argv (the peer's default delivery).
sleep "${BENCH_SLEEP:-0.3}"
echo "round ${AGENT_RUNNER_ROUND_NUM:-?}" >> rounds.txt
git add rounds.txt
git -c user.name=bench -c user.email=bench@example.invalid commit -qm "round ${AGENT_RUNNER_ROUND_NUM:-?}"
echo '{"type":"result","subtype":"success"}'
'''

PROMPT = "Work on the project, one round at a time.\n" + "Keep going. " * 60 + "\n"


def setup(sleep, delay, placement=None, budget=60):
    d = tempfile.mkdtemp(prefix="bench-rounds-")
    repo = os.path.join(d, "repo")
    os.makedirs(os.path.join(repo, "prompts"))
    open(os.path.join(repo, "prompts", "main.md"), "w").write(PROMPT)
    open(os.path.join(repo, "README"), "w").write("bench\n")
    for args in (["init", "-q", "-b", "main"], ["add", "-A"],
                 ["-c", "user.name=b", "-c", "user.email=b@example.invalid", "commit", "-qm", "init"]):
        subprocess.run(["git"] + args, cwd=repo, check=True)
    agent = os.path.join(d, "agent.sh")
    open(agent, "w").write(AGENT)
    os.chmod(agent, 0o755)
    lines = [
        "schema_version = 1",
        "[agent]",
        f'command = ["{agent}"]',
        'prompt_arg_template = ["{prompt}"]',
        f'env = {{ BENCH_SLEEP = "{sleep}" }}',
    ]
    if placement:
        lines.append(f'placement = "{placement}"')
    lines += [
        "[runtime]",
        f'work_dir = "{repo}"',
        f'log_dir = "{os.path.join(d, "logs")}"',
        f"round_budget_s = {budget}",
        f"restart_delay_s = {delay}",
        "[prompt]",
        'file = "./prompts/main.md"',
    ]
    cfg = os.path.join(d, "agent-runner.toml")
    open(cfg, "w").write("\n".join(lines) + "\n")
    return d, cfg


def env_for(d):
    e = dict(os.environ)
    e["HOME"] = d
    e["BELAY_STATE_HOME"] = os.path.join(d, "state")
    e.pop("OPENAI_API_KEY", None)
    return e


def children(pid):
    out = []
    try:
        for c in open(f"/proc/{pid}/task/{pid}/children").read().split():
            out.append(int(c))
            out.extend(children(int(c)))
    except OSError:
        pass
    return out


def comm(pid):
    try:
        return open(f"/proc/{pid}/comm").read().strip()
    except OSError:
        return ""


def rss_kib(pid):
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def cpu_s(pid):
    """utime+stime of pid itself and its waited-for children."""
    try:
        f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        tck = os.sysconf("SC_CLK_TCK")
        return (int(f[11]) + int(f[12])) / tck, (int(f[13]) + int(f[14])) / tck
    except OSError:
        return 0.0, 0.0


def agent_alone(sleep, n):
    """The agent's own wall time and CPU per round, run alone (its sleep and
    its commit): what neither tool can make faster."""
    d, _ = setup(sleep, 1)
    repo = os.path.join(d, "repo")
    t = os.times()
    t0 = time.monotonic()
    for i in range(n):
        subprocess.run([os.path.join(d, "agent.sh"), PROMPT], cwd=repo, env=dict(os.environ, BENCH_SLEEP=str(sleep)), stdout=subprocess.DEVNULL, check=True)
    wall = (time.monotonic() - t0) / n
    t2 = os.times()
    shutil.rmtree(d, ignore_errors=True)
    return wall, (t2.children_user + t2.children_system - t.children_user - t.children_system) / n


def round_span(log_dir):
    """Seconds from the first round_start to the last round_end, from the
    event logs (belay's envelope `at`/`kind`, the peer's `ts`/`event`)."""
    import datetime, glob
    starts, ends = [], []
    for f in glob.glob(os.path.join(log_dir, "events*.jsonl")):
        for line in open(f):
            try:
                e = json.loads(line)
            except ValueError:
                continue
            kind = e.get("kind") or e.get("event")
            at = e.get("at") or e.get("ts")
            if kind not in ("round_start", "round_end") or not at:
                continue
            t = datetime.datetime.fromisoformat(at.replace("Z", "+00:00")).timestamp()
            (starts if kind == "round_start" else ends).append(t)
    if not starts or not ends:
        return None
    return max(ends) - min(starts)


def serve_cmd(tool, peer, cfg, n):
    if tool == "peer":
        return [peer, "serve", "--config", cfg, "--max-rounds", str(n)]
    return [BELAY, "-q", "rounds", "--config", cfg, "serve", "--max-rounds", str(n)]


def overhead(tool, peer, placement, n, sleep, delay, agent_wall_s, agent_cpu_s):
    d, cfg = setup(sleep, delay, placement)
    t0 = time.monotonic()
    p = subprocess.Popen(serve_cmd(tool, peer, cfg, n), env=env_for(d), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    self_cpu = [0.0, 0.0]
    while p.poll() is None:
        s, c = cpu_s(p.pid)
        if s or c:
            self_cpu = [s, c]
        time.sleep(0.01)
    wall = time.monotonic() - t0
    span = round_span(os.path.join(d, "logs"))
    rounds = int(subprocess.run(["git", "rev-list", "--count", "HEAD"], cwd=os.path.join(d, "repo"), capture_output=True, text=True).stdout) - 1
    assert p.returncode == 0 and rounds == n, (tool, placement, p.returncode, rounds)
    # One `round` command.
    t1 = time.monotonic()
    cmd = [peer, "round", "--config", cfg] if tool == "peer" else [BELAY, "-q", "rounds", "--config", cfg, "round"]
    subprocess.run(cmd, env=env_for(d), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    one = time.monotonic() - t1
    shutil.rmtree(d, ignore_errors=True)
    cpu = self_cpu[0] + self_cpu[1] - n * agent_cpu_s
    return {
        "serve_wall_s": round(wall, 3),
        "overhead_per_round_s": round((wall - n * agent_wall_s - (n - 1) * delay) / n, 4),
        # From the first round's start to the last one's end, by each tool's
        # own events: serve's start and exit left out.
        "loop_overhead_per_round_s": round((span - n * agent_wall_s - (n - 1) * delay) / n, 4) if span else None,
        "one_round_command_overhead_s": round(one - agent_wall_s, 4),
        "cpu_per_round_s": round(max(cpu, 0.0) / n, 4),
    }


def memory(tool, peer, placement, n=4):
    """Peak and median RSS (KiB) of the supervisor's processes, idle and mid-round."""
    d, cfg = setup(2, 2, placement)
    env = env_for(d)
    procs = [subprocess.Popen(serve_cmd(tool, peer, cfg, n), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    if tool == "peer":
        procs.append(subprocess.Popen([peer, "monitor", "--config", cfg], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    samples = {"idle": [], "mid": [], "docker_client": []}
    serve = procs[0]
    while serve.poll() is None:
        pids = []
        agent_running = False
        docker = 0
        for top in procs:
            if top.poll() is not None:
                continue
            pids.append(top.pid)
            for c in children(top.pid):
                name = comm(c)
                if name in ("agent.sh", "sleep", "git", "sh"):
                    agent_running = True
                    continue
                if name == "docker":
                    agent_running = True
                    docker += rss_kib(c)
                    continue
                if name.startswith("belay"):
                    # belay's own launcher is the agent once it has exec'd.
                    continue
                pids.append(c)
        total = sum(rss_kib(x) for x in pids)
        if total:
            samples["mid" if agent_running else "idle"].append(total)
            if docker:
                samples["docker_client"].append(docker)
        time.sleep(0.02)
    for pr in procs[1:]:
        pr.terminate()
        pr.wait()
    shutil.rmtree(d, ignore_errors=True)
    med = lambda xs: round(statistics.median(xs) / 1024, 1) if xs else None
    top = lambda xs: round(max(xs) / 1024, 1) if xs else None
    return {
        "idle_mib_median": med(samples["idle"]), "idle_mib_peak": top(samples["idle"]),
        "mid_round_mib_median": med(samples["mid"]), "mid_round_mib_peak": top(samples["mid"]),
        "docker_exec_client_mib_median": med(samples["docker_client"]),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--peer", required=True, help="the agent-runner executable")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--sleep", type=float, default=0.3)
    ap.add_argument("--delay", type=int, default=1, help="restart_delay_s (the peer takes whole seconds)")
    a = ap.parse_args()
    awall, acpu = agent_alone(a.sleep, 10)
    out = {"rounds": a.rounds, "agent_sleep_s": a.sleep, "restart_delay_s": a.delay, "agent_alone_wall_s": round(awall, 4), "agent_cpu_per_round_s": round(acpu, 4)}
    for name, tool, placement in [("peer", "peer", None), ("belay_host", "belay", "host"), ("belay_container", "belay", None)]:
        out[name] = overhead(tool, a.peer, placement, a.rounds, a.sleep, a.delay, awall, acpu)
        out[name]["memory"] = memory(tool, a.peer, placement)
    p, h = out["peer"], out["belay_host"]
    out["ratios"] = {
        "overhead_host_vs_peer": round(h["overhead_per_round_s"] / p["overhead_per_round_s"], 3) if p["overhead_per_round_s"] > 0 else None,
        "loop_overhead_host_vs_peer": round(h["loop_overhead_per_round_s"] / p["loop_overhead_per_round_s"], 3) if p.get("loop_overhead_per_round_s") else None,
        "cpu_host_vs_peer": round(h["cpu_per_round_s"] / p["cpu_per_round_s"], 3) if p["cpu_per_round_s"] > 0 else None,
        "memory_mid_round_host_vs_peer": round(h["memory"]["mid_round_mib_median"] / p["memory"]["mid_round_mib_median"], 3) if p["memory"]["mid_round_mib_median"] else None,
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    sys.exit(main())
