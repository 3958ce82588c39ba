#!/usr/bin/env python3
"""Per-call cost of a real agent CLI in belay's container, minus on the host
(issue: CLIs fast in containers), for a baseline binary and this one, in one
run.

Each of codex, Claude Code and gemini answers one prompt through
`belay agent run` against `belay model replay` (a text reply, no tools), on
the host (`--on-host`) and in belay's container (the default image), ROUNDS
times each; the medians of the wall times and their difference are printed.

    BASELINE=/path/to/old/belay BELAY=target/release/belay \
        python3 bench/agents/cli_speed.py [--rounds 3]

Cache state: warm (the agent image is present, the CLIs are pinned under
/opt/belay-agents, the replay server runs for the whole bench). A call that
fails is reported with its exit code (a baseline without the Gemini dialect
cannot run gemini). Prints one JSON object.
"""
import argparse, json, os, statistics, subprocess, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BELAY = os.environ.get("BELAY", os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target")), "release", "belay"))
BASELINE = os.environ.get("BASELINE")
AGENTS = os.environ.get("BELAY_AGENTS_DIR", "/opt/belay-agents")
CLIS = {
    "codex": ("codex@gpt-5-codex", "/v1", "responses"),
    "claude": ("claude@claude-sonnet-4-5", "", "anthropic"),
    "gemini": ("gemini@gemini-2.5-flash", "", "gemini"),
}
KEYS = {
    "OPENAI_API_KEY": "sk-bench-000000000000000000",
    "ANTHROPIC_API_KEY": "sk-ant-bench-0000000000000000",
    "GEMINI_API_KEY": "gk-bench-00000000000000000000",
}


def one(binary, tmp, repo, url, cli, host):
    spec, suffix, api = CLIS[cli]
    env = dict(os.environ, BELAY_STATE_HOME=os.path.join(tmp, "state"), **KEYS)
    env["PATH"] = os.path.join(AGENTS, "node_modules", ".bin") + ":" + env["PATH"]
    cmd = [binary, "-q", "agent", "run", "--agent", spec, "--prompt", "Say done",
           "--repo", repo, "--openai-base-url", url + suffix, "--llm-api", api,
           "--out", tempfile.mkdtemp(dir=tmp)]
    if host:
        cmd += ["--on-host", "--auto-approve"]
    t0 = time.time()
    p = subprocess.run(cmd, env=env, capture_output=True)
    return time.time() - t0, p.returncode


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="belay-bench-cli.")
    repo = os.path.join(tmp, "repo")
    os.makedirs(repo)
    open(os.path.join(repo, "README.md"), "w").write("bench\n")
    for args in (["init", "-q", "-b", "main"], ["add", "-A"],
                 ["-c", "user.name=b", "-c", "user.email=b@b", "commit", "-q", "-m", "init"]):
        subprocess.run(["git", *args], cwd=repo, check=True)
    script = os.path.join(tmp, "replay.yaml")
    open(script, "w").write("turns:\n  - name: any\n    reply: {text: \"Done.\"}\n    repeat: true\n")
    server = subprocess.Popen([BELAY, "model", "replay", "--script", script, "--port", "0"],
                              stdout=subprocess.PIPE, text=True)
    url = next(w for w in server.stdout.readline().split() if w.startswith("http://"))
    out = {"rounds": a.rounds, "cache": "warm: agent image present, CLIs pinned, one replay server"}
    try:
        for name, binary in (("baseline", BASELINE), ("belay", BELAY)):
            if not binary:
                continue
            res = {}
            for cli in CLIS:
                row = {}
                for host in (True, False):
                    walls, codes = [], []
                    for _ in range(a.rounds):
                        w, c = one(binary, tmp, repo, url, cli, host)
                        walls.append(w)
                        codes.append(c)
                    key = "host" if host else "container"
                    row[key + "_s"] = round(statistics.median(walls), 2)
                    if any(codes):
                        row[key + "_exit_codes"] = codes
                row["container_extra_s"] = round(row["container_s"] - row["host_s"], 2)
                res[cli] = row
            out[name] = res
    finally:
        server.terminate()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
