#!/usr/bin/env python3
"""The job queue builder's figures, measured in one run on this machine.

  python3 bench/jobs/bench.py [--jobs 10]

It builds belay (release) and the benchmark's chat client, starts a private
prosody on loopback (accounts `builder` and `owner`), and runs `belay jobs
work` with the XMPP front end over a local site repository with a bare remote
and a scripted agent (commit block every time). Then:

* queue latency: the owner sends N requests one by one over XMPP; for each,
  the time from the message's arrival (its send time; the loopback delivery is
  in it) plus the batching window, to the agent's start (`agent_started`
  event), i.e. the latency without the window;
* resident memory of `belay jobs work`, idle, connected to the server;
* the overhead per job outside the agent: worktree, stash, commit, push and
  record (the `job_finished` event's `overhead_s`, and its phases from the
  events), for the agent in a container and on the host.

There is no runnable peer: the builder seed ships without its `common.py` and
`listener.py` (the queue, the XMPP front end and the git helpers), so the
figures are absolute. Cache state: warm (the release build and the agent image
exist; each job makes a fresh worktree and container).
"""

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TARGET = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
PASSWORD = "pw-bench-xmpp-4242"

AGENT = """#!/bin/sh
cat > /dev/null
echo "edit $(date +%s%N)" >> log.txt
echo "I added a line."
printf '===COMMIT-MESSAGE===\\nbench: a line\\n===END-COMMIT-MESSAGE===\\n'
"""


def sh(*a, **k):
    return subprocess.run(a, check=True, **k)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def prosody(d: Path, port: int):
    (d / "data").mkdir(parents=True)
    (d / "certs").mkdir()
    cfg = d / "prosody.cfg.lua"
    cfg.write_text(f"""run_as_root = true
pidfile = "{d}/prosody.pid"
data_path = "{d}/data"
certificates = "{d}/certs"
daemonize = false
log = {{ info = "{d}/prosody.log"; error = "{d}/prosody.err" }}
c2s_ports = {{ {port} }}
c2s_interfaces = {{ "127.0.0.1" }}
s2s_ports = {{ }}
c2s_require_encryption = false
allow_unencrypted_plain_auth = true
authentication = "internal_hashed"
storage = "internal"
modules_enabled = {{ "roster"; "saslauth"; "disco"; "carbons"; "ping"; "offline"; "smacks" }}
modules_disabled = {{ "s2s"; "http"; "posix" }}
VirtualHost "localhost"
""")
    for u in ("builder", "owner"):
        sh("prosodyctl", "--config", str(cfg), "register", u, "localhost", PASSWORD,
           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    p = subprocess.Popen(["prosody", "--config", str(cfg)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t = time.time()
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return p
        except OSError:
            if time.time() - t > 20:
                raise SystemExit("prosody did not start")
            time.sleep(0.05)


def workspace(tmp: Path, placement: str, port: int, window_ms: int):
    remote = tmp / "remote.git"
    sh("git", "init", "-q", "--bare", "-b", "main", str(remote))
    site = tmp / "site"
    site.mkdir()
    (site / "index.html").write_text("<h1>bench</h1>\n")
    g = ["git", "-c", "user.name=bench", "-c", "user.email=b@example.invalid", "-C", str(site)]
    sh(*g, "init", "-q", "-b", "main")
    sh(*g, "add", "-A")
    sh(*g, "commit", "-qm", "start")
    sh(*g, "remote", "add", "origin", str(remote))
    sh(*g, "push", "-q", "-u", "origin", "main")
    agent = tmp / "agent.sh"
    agent.write_text(AGENT)
    agent.chmod(0o755)
    (tmp / "jobs.toml").write_text(f"""queue = "queue"
owners = ["owner@localhost"]
[agent]
spec = "cmd:{agent}"
placement = "{placement}"
[[repo]]
name = "site"
path = "site"
[xmpp]
jid = "builder@localhost"
password_env = "BENCH_XMPP_PW"
server = "127.0.0.1:{port}"
insecure_plaintext_loopback = true
batch_window_ms = {window_ms}
chunk_pause_ms = 50
""")


def events(run_dir: Path):
    out = []
    for l in (run_dir / "events.jsonl").read_text().splitlines():
        out.append(json.loads(l))
    return out


def ts(e):
    # The envelope's time: RFC 3339 with milliseconds.
    from datetime import datetime
    return datetime.fromisoformat(e["at"].replace("Z", "+00:00")).timestamp()


def rss_kib(pid: int) -> int:
    for l in Path(f"/proc/{pid}/status").read_text().splitlines():
        if l.startswith("VmRSS:"):
            return int(l.split()[1])
    return 0


def run(placement: str, n: int, belay: Path, client: Path, window_ms: int):
    tmp = Path(tempfile.mkdtemp(prefix=f"belay-jobs-bench-{placement}-"))
    port = free_port()
    server = prosody(tmp / "xmpp", port)
    workspace(tmp, placement, port, window_ms)
    env = dict(os.environ, BENCH_XMPP_PW=PASSWORD, BELAY_STATE_HOME=str(tmp / "state"))
    work = subprocess.Popen([str(belay), "jobs", "--config", str(tmp / "jobs.toml"), "work"],
                            env=env, stdout=subprocess.DEVNULL, stderr=open(tmp / "work.log", "w"), cwd=tmp)
    try:
        t = time.time()
        while "online as" not in (tmp / "work.log").read_text():
            if time.time() - t > 30:
                raise SystemExit("belay did not come online: " + (tmp / "work.log").read_text())
            time.sleep(0.05)
        time.sleep(10)
        idle_rss = rss_kib(work.pid)
        children = subprocess.run(["pgrep", "-P", str(work.pid)], capture_output=True, text=True).stdout.split()
        msgs = "\n".join(f"request {i}: add a line" for i in range(n)) + "\n"
        out = subprocess.run([str(client), str(port), "owner", PASSWORD, "builder@localhost"],
                             input=msgs, capture_output=True, text=True, timeout=60 * n + 60)
        if out.returncode != 0:
            raise SystemExit(out.stderr)
        sends = [json.loads(l) for l in out.stdout.splitlines()]
        busy_rss = rss_kib(work.pid)
    finally:
        work.terminate()
        work.wait(timeout=60)
        server.terminate()
        server.wait()
    runs = sorted((tmp / "queue" / "runs").iterdir())
    lat, over, phases = [], [], {"prepare": [], "commit_push": [], "after": []}
    for s, r in zip(sends, runs):
        ev = events(r)
        kinds = {e["kind"]: e for e in ev}
        started = ts(kinds["agent_started"])
        lat.append(started - (s["sent_ms"] / 1000 + window_ms / 1000))
        fin = kinds["job_finished"]
        over.append(fin["data"]["overhead_s"])
        phases["prepare"].append(ts(kinds["agent_started"]) - ts(kinds["job_started"]))
        if "pushed" in kinds:
            phases["commit_push"].append(ts(kinds["pushed"]) - ts(kinds["agent_finished"]))
            phases["after"].append(ts(fin) - ts(kinds["pushed"]))
    statuses = [json.loads(p.read_text())["status"] for p in sorted((tmp / "queue" / "done").iterdir())]
    shutil.rmtree(tmp, ignore_errors=True)
    med = statistics.median
    return {
        "placement": placement,
        "jobs": len(runs),
        "committed": statuses.count("committed"),
        "queue_latency_ms_median": round(med(lat) * 1000, 1),
        "queue_latency_ms_max": round(max(lat) * 1000, 1),
        "overhead_s_median": round(med(over), 3),
        "prepare_s_median": round(med(phases["prepare"]), 3),
        "commit_push_s_median": round(med(phases["commit_push"]), 3) if phases["commit_push"] else None,
        "record_s_median": round(med(phases["after"]), 3) if phases["after"] else None,
        "idle_rss_mib": round(idle_rss / 1024, 1),
        "rss_after_jobs_mib": round(busy_rss / 1024, 1),
        "idle_children": len(children),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=10)
    ap.add_argument("--window-ms", type=int, default=3000)
    a = ap.parse_args()
    sh("cargo", "build", "-q", "--release", "-p", "belay", cwd=ROOT)
    sh("cargo", "build", "-q", "--release", "-p", "belay-jobs", "--example", "xmpp_client", cwd=ROOT)
    belay = TARGET / "release" / "belay"
    client = TARGET / "release" / "examples" / "xmpp_client"
    res = [run(p, a.jobs, belay, client, a.window_ms) for p in ("container", "host")]
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    sys.exit(main())
