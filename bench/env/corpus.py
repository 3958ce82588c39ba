#!/usr/bin/env python3
"""belay env build-projects over a corpus of real open-source projects.

Fetches each project of corpus.txt (PyPI source archives with `pip download`,
crates with `cargo fetch`, npm tarballs with `npm pack`, Debian source packages'
orig tarballs from the mirror apt's sources name, so no registry address is
written here), writes a
projects file and an oracle per project, then:

  1. a cold batch build (no cache reuse), --jobs N, rules planner, full mode;
  2. the same batch again with the cache (every checkpoint should be reused);
  3. `docker build --no-cache` of each successful project's written Dockerfile,
     N at a time, for the overhead ratio.

Prints success rate, median and p90 time per project, repairs, failures by
class, second-run time and cache-hit rate, and the ratio against docker build.

  4. `--phases` picks some of: cold, warm (the checkpoint cache), packages (warm
     package caches, no checkpoint made before the batch reused: `--no-cache`,
     under which the batch still shares the toolchain checkpoints it makes),
     docker (the written Dockerfiles: Dockerfile.legacy with the legacy
     builder, then Dockerfile with BuildKit twice, cold and then warm for its
     cache mounts, all `--no-cache`; then Dockerfile.legacy with the layer
     cache, empty at the start, so that the projects share identical steps as
     belay's batch does).

Usage: bench/env/corpus.py [--jobs 2] [--limit N] [--belay PATH] [--work DIR] [--phases cold,warm,packages,docker]
       [--prune] [--from-cold] [--sample N] [--builders legacy,buildkit,legacy-cache]

--from-cold --phases packages,docker --sample N compares belay's batch with warm
package caches against `docker build --no-cache` of the same projects' written
Dockerfiles, in one run, on N of an earlier cold run's successes.
"""
import argparse
import concurrent.futures
import datetime
import glob
import hashlib
import json
import lzma
import os
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))


def read_corpus(limit, path=None):
    """`kind name version [tags] [| oracle command]`: an oracle command, where
    given, replaces the kind's own (a server started and a page fetched)."""
    items = []
    for line in open(path or os.path.join(HERE, "corpus.txt")):
        line = line.split(" #")[0].strip() if not line.lstrip().startswith("#") else ""
        if not line:
            continue
        line, _, oracle = line.partition(" | ")
        kind, name, version, *tags = line.split()
        items.append({"kind": kind, "name": name, "version": version, "native": "native" in tags, "tags": tags,
                      "oracle": oracle.strip() or None})
    return items[:limit] if limit else items


BACKENDS = ["setuptools", "wheel", "hatchling", "hatch-vcs", "hatch-fancy-pypi-readme", "flit-core", "poetry-core",
            "pdm-backend", "setuptools-scm", "cython", "cffi", "pbr", "versioneer", "maturin", "meson-python", "scikit-build-core"]
_fetch_python = []


def fetch_python(cache):
    """A venv with the common build backends, made once: pip reads each sdist's
    metadata with it and no build isolation, instead of installing a build env
    per project (slow through this machine's proxy)."""
    if not _fetch_python:
        venv = os.path.join(cache, "fetch-venv")
        py = os.path.join(venv, "bin", "python")
        if not os.path.exists(os.path.join(venv, ".ready")):
            subprocess.run([sys.executable, "-m", "venv", venv], check=True)
            subprocess.run([py, "-m", "pip", "install", "-q", *BACKENDS], check=True)
            open(os.path.join(venv, ".ready"), "w").close()
        _fetch_python.append(py)
    return _fetch_python[0]


def fetch_pypi(item, dest, cache):
    d = os.path.join(cache, "pypi")
    os.makedirs(d, exist_ok=True)
    spec = f"{item['name']}=={item['version']}"
    # --no-binary for the project alone: its sdist, while the build
    # dependencies pip needs to read its metadata may come as wheels.
    archives = [f for f in os.listdir(d) if f.lower().replace("_", "-").startswith(f"{item['name']}-{item['version']}".lower().replace("_", "-"))]
    if not archives:
        cmd = [fetch_python(cache), "-m", "pip", "download", "-q", "--no-deps", "--no-binary", item["name"], "--ignore-requires-python", spec, "-d", d]
        # Projects whose backend is not in the fetch venv retry with isolation.
        if subprocess.run(cmd + ["--no-build-isolation"], capture_output=True).returncode != 0:
            subprocess.run(cmd, check=True)
        archives = [f for f in os.listdir(d) if f.lower().replace("_", "-").startswith(f"{item['name']}-{item['version']}".lower().replace("_", "-"))]
    with tarfile.open(os.path.join(d, archives[0])) as t:
        top = t.getnames()[0].split("/")[0]
        t.extractall(os.path.dirname(dest), filter="tar")
    os.rename(os.path.join(os.path.dirname(dest), top), dest)


def fetch_crate(item, dest, cache):
    proj = os.path.join(cache, f"crate-{item['name']}-{item['version']}")
    if not os.path.isdir(proj):
        os.makedirs(os.path.join(proj, "src"), exist_ok=True)
        with open(os.path.join(proj, "Cargo.toml"), "w") as f:
            f.write(f'[package]\nname = "fetcher"\nversion = "0.0.0"\nedition = "2021"\n\n[dependencies]\n{item["name"]} = "={item["version"]}"\n')
        open(os.path.join(proj, "src", "lib.rs"), "w").close()
    out = subprocess.run(["cargo", "metadata", "--format-version", "1", "--manifest-path", os.path.join(proj, "Cargo.toml")],
                         capture_output=True, text=True, check=True)
    for p in json.loads(out.stdout)["packages"]:
        if p["name"] == item["name"] and p["version"] == item["version"]:
            shutil.copytree(os.path.dirname(p["manifest_path"]), dest)
            return
    raise SystemExit(f"crate {item['name']} {item['version']} not found")


def fetch_npm(item, dest, cache):
    """The package's published tarball (`npm pack`), made a git checkout whose
    one commit is dated when the version was published: what a checkout of
    its release commit would be (belay resolves an install without a
    lockfile as of the commit's date). The date is the tarball's newest
    file where it keeps real times, else the registry's."""
    d = os.path.join(cache, "npm")
    os.makedirs(d, exist_ok=True)
    spec = f"{item['name']}@{item['version']}"
    base = item["name"].lstrip("@").replace("/", "-") + "-" + item["version"] + ".tgz"
    tgz = os.path.join(d, base)
    meta = os.path.join(d, base + ".time")
    if not os.path.exists(tgz):
        out = subprocess.run(["npm", "pack", spec, "--silent", "--pack-destination", d],
                             capture_output=True, text=True, check=True).stdout.split()
        if os.path.join(d, out[-1]) != tgz:
            os.rename(os.path.join(d, out[-1]), tgz)
    if not os.path.exists(meta):
        times = json.loads(subprocess.run(["npm", "view", item["name"], "time", "--json"],
                                          capture_output=True, text=True, check=True).stdout)
        with open(meta, "w") as f:
            f.write(times[item["version"]])
    with tarfile.open(tgz) as t:
        top = t.getnames()[0].split("/")[0]
        newest = max((m.mtime for m in t.getmembers() if m.isfile()), default=0)
        tmp = tempfile.mkdtemp(dir=os.path.dirname(dest))
        t.extractall(tmp, filter="tar")
    os.rename(os.path.join(tmp, top), dest)
    os.rmdir(tmp)
    when = open(meta).read().strip()
    # The registry here reports times that are not the releases' (a
    # package's 0.1.0 in 2026, its 1.2.1 in 2024). A tarball packed before
    # npm 5 keeps its files' times, the truer date where there is one (npm
    # 5 and later write 1985-10-26 into every file); it is never later
    # than the publish.
    registry = datetime.datetime.fromisoformat(when.replace("Z", "+00:00")).timestamp()
    if datetime.datetime(2009, 1, 1, tzinfo=datetime.timezone.utc).timestamp() <= newest < registry:
        when = datetime.datetime.fromtimestamp(newest, datetime.timezone.utc).isoformat()
    commit_dated(dest, when, spec)


def debian_mirror():
    """The Debian mirror apt here uses (its sources' `URIs:` or `deb` lines),
    so that no host is written here."""
    for f in sorted(glob.glob("/etc/apt/sources.list.d/*.sources")) + ["/etc/apt/sources.list"]:
        try:
            text = open(f).read()
        except OSError:
            continue
        for m in re.finditer(r"^(?:URIs:\s*|deb\s+(?:\[[^]]*\]\s+)?)(\S+)", text, re.M):
            if m.group(1).rstrip("/").endswith("/debian"):
                return m.group(1).rstrip("/")
    raise SystemExit("no Debian mirror in apt's sources: a `deb` corpus line needs one")


_debian_sources = {}
_debian_lock = threading.Lock()


def debian_sources(cache, suite):
    """The suite's source index (`Sources`), fetched once into the cache,
    as its stanzas (the fetches run four at a time)."""
    with _debian_lock:
        if suite not in _debian_sources:
            path = os.path.join(cache, "deb", f"Sources-{suite}")
            if not os.path.exists(path):
                os.makedirs(os.path.dirname(path), exist_ok=True)
                url = f"{debian_mirror()}/dists/{suite}/main/source/Sources.xz"
                data = subprocess.run(["curl", "-fsSL", "--retry", "3", url], capture_output=True, check=True).stdout
                with open(path + ".tmp", "wb") as f:
                    f.write(lzma.decompress(data))
                os.rename(path + ".tmp", path)
            _debian_sources[suite] = open(path, encoding="utf-8", errors="replace").read().split("\n\n")
        return _debian_sources[suite]


def fetch_deb(item, dest, cache):
    """A Debian source package's main orig tarball: for the JavaScript team's
    packages, the upstream tag's tree as its code host packs it (lockfile,
    CI files and tests kept, as a checkout has them; the extra `orig-NAME`
    tarballs of bundled modules are left out). Made a git checkout whose one
    commit is dated by the tarball's newest file: a code host's archive
    stamps every file with the tagged commit's time."""
    stanza = None
    for suite in ("trixie", "bookworm", "sid"):
        for s in debian_sources(cache, suite):
            if re.search(rf"^Package: {re.escape(item['name'])}$", s, re.M) and \
                    re.search(rf"^Version: {re.escape(item['version'])}$", s, re.M):
                stanza = s
                break
        if stanza:
            break
    if stanza is None:
        raise SystemExit(f"Debian source {item['name']} {item['version']} is in none of trixie, bookworm, sid")
    directory = re.search(r"^Directory: (\S+)$", stanza, re.M).group(1)
    sums = re.search(r"^Checksums-Sha256:\n((?: .*\n?)+)", stanza, re.M).group(1)
    upstream = item["version"].split(":")[-1].rsplit("-", 1)[0]
    orig = [(h, f) for h, _, f in (l.split() for l in sums.strip().splitlines())
            if re.fullmatch(rf"{re.escape(item['name'])}_{re.escape(upstream)}\.orig\.tar\.\w+", f)]
    if len(orig) != 1:
        raise SystemExit(f"Debian source {item['name']} {item['version']}: no one main orig tarball in {sums!r}")
    digest, fname = orig[0]
    d = os.path.join(cache, "deb")
    os.makedirs(d, exist_ok=True)
    tarball = os.path.join(d, fname)
    if not os.path.exists(tarball):
        data = subprocess.run(["curl", "-fsSL", "--retry", "3", f"{debian_mirror()}/{directory}/{fname}"],
                              capture_output=True, check=True).stdout
        if hashlib.sha256(data).hexdigest() != digest:
            raise SystemExit(f"{fname}: its SHA-256 is not the one the Sources index gives")
        with open(tarball + ".tmp", "wb") as f:
            f.write(data)
        os.rename(tarball + ".tmp", tarball)
    with tarfile.open(tarball) as t:
        tops = {n.split("/")[0] for n in t.getnames()}
        newest = max((m.mtime for m in t.getmembers() if m.isfile()), default=0)
        tmp = tempfile.mkdtemp(dir=os.path.dirname(dest))
        t.extractall(tmp, filter="tar")
    if len(tops) != 1:
        raise SystemExit(f"{fname} has no one top directory: {sorted(tops)[:5]}")
    os.rename(os.path.join(tmp, tops.pop()), dest)
    os.rmdir(tmp)
    if newest < datetime.datetime(2009, 1, 1, tzinfo=datetime.timezone.utc).timestamp():
        raise SystemExit(f"{fname}: its files carry no real time ({newest}) to date the checkout by")
    commit_dated(dest, datetime.datetime.fromtimestamp(newest, datetime.timezone.utc).isoformat(),
                 f"{item['name']} {item['version']}")


def commit_dated(dest, when, message):
    """`dest` made a git repository of one commit, dated `when`."""
    env = dict(os.environ, GIT_AUTHOR_DATE=when, GIT_COMMITTER_DATE=when, GIT_AUTHOR_NAME="corpus",
               GIT_AUTHOR_EMAIL="corpus@localhost", GIT_COMMITTER_NAME="corpus", GIT_COMMITTER_EMAIL="corpus@localhost")
    git = ["git", "-c", "core.hooksPath=/dev/null", "-c", "commit.gpgsign=false"]
    for cmd in (git + ["init", "-q"], git + ["add", "-A", "-f"], git + ["commit", "-q", "-m", message]):
        subprocess.run(cmd, cwd=dest, env=env, check=True, capture_output=True)


def node_test_command(pkg_json):
    """What a developer types to run the package's tests: its package
    manager's `test` (`packageManager`, else the lockfile's manager), as
    CI runs it: with `CI=true`, the signal every runner reads for a run
    without a terminal (vitest before 2 watches for changes without it)."""
    try:
        pm = (json.load(open(pkg_json)).get("packageManager") or "").split("@")[0]
    except (OSError, ValueError, AttributeError):
        pm = ""
    root = os.path.dirname(pkg_json)
    if not pm:
        pm = next((m for f, m in (("pnpm-lock.yaml", "pnpm"), ("yarn.lock", "yarn"))
                   if os.path.exists(os.path.join(root, f))), "npm")
    return f"CI=true {pm if pm in ('yarn', 'pnpm') else 'npm'} test"


def oracle_for(item, dest=None):
    if item.get("oracle"):
        cmd = item["oracle"]
    elif item["kind"] in ("npm", "deb"):
        cmd = node_test_command(os.path.join(dest, "package.json")) + " 2>&1"
    elif item["kind"] == "crate":
        # The crate's analogue of collection: every test target compiles and
        # links offline. Running the tests asks more of a crate than
        # `--collect-only` asks of a Python project (url's need DNS).
        cmd = "cargo test --no-run --offline 2>&1"
    else:
        cmd = "{ .venv/bin/python -m pytest --collect-only -q; rc=$?; [ \"$rc\" -eq 0 ] || [ \"$rc\" -eq 5 ]; }"
    return {"fixed_test_commands": [{"command": cmd, "oracle_id": f"{item['kind']}-tests", "source": "bench", "oracle_priority": 1}]}


CLASSES = [
    ("the test suite needs an older pytest", r"PytestRemovedIn|PluginValidationError|hookimpl"),
    ("a C extension was not built (its library is missing)", r"No module named '?\w+\._\w+"),
    ("test collection needs packages the project does not declare", r"No module named|ModuleNotFoundError|ImportError"),
    ("a native build dependency the rules do not know", r"fatal error: .*\.h|pg_config|not found in the pkg-config|Could not find"),
    ("toolchain too old or too new", r"requires.*(rustc|python|go)|edition20|lock file version|requires a different Python|is older than"),
    ("network or registry", r"Temporary failure|Could not resolve|timed out|HTTP error|503"),
    ("the project's own tests or build are broken", r"SyntaxError|error\[E|error: could not compile|FAILED"),
]


def failure_text(p):
    """The summary plus the tail of the failed command's full log."""
    text = p.get("error") or ""
    try:
        m = json.load(open(p["manifest"]))
        failed = [e for e in m["executions"] if e.get("exit_code") not in (0, None) and e.get("log_path")]
        if failed:
            with open(failed[-1]["log_path"], errors="replace") as f:
                text += "\n" + f.read()[-8000:]
    except (OSError, KeyError, TypeError, ValueError):
        pass
    return text


def classify(p):
    # belay's own classification first (the manifest's failure_class).
    if p.get("failure_class"):
        return p["failure_class"].split(": ")[0]
    text = failure_text(p)
    for name, pat in CLASSES:
        if re.search(pat, text or ""):
            return name
    return "other"


def pct(values, q):
    if not values:
        return float("nan")
    v = sorted(values)
    k = max(0, min(len(v) - 1, int(round(q * (len(v) - 1)))))
    return v[k]


# The package download caches live in the bench's own cache dir, emptied before
# the cold run, so that "cold" means cold for them too.
BENCH_ENV = dict(os.environ)


def prune_finished(pdir, done):
    """Remove the images of every run in `pdir` whose manifest says it ended."""
    tags = subprocess.run(["docker", "images", "--format", "{{.Repository}}:{{.Tag}}"],
                          capture_output=True, text=True).stdout.split()
    for m in glob.glob(os.path.join(pdir, ".belay-state", "runs", "*", "manifest.json")):
        run = os.path.basename(os.path.dirname(m))
        if run in done:
            continue
        try:
            status = json.load(open(m)).get("status")
        except (OSError, ValueError):
            continue
        if status in ("succeeded", "failed"):
            # By name, newest first (`docker images` lists them so): a child
            # goes before its parent. Removing by id in another order leaves
            # every parent of a later checkpoint behind ("has dependent child
            # images"), and the disk fills.
            out = subprocess.run(["docker", "images", "--filter", f"label=belay.run={run}",
                                  "--format", "{{.Repository}}:{{.Tag}}"],
                                 capture_output=True, text=True).stdout.split()
            # A toolchain block's image is shared by the batch (its `belay.run`
            # is empty), and the run keeps a tag of its own on it.
            # Its tags are `<run>-final` and `<run>-NNN-<block>-…`; a run
            # whose id only starts with this one's is not this run.
            own = re.compile(rf"{re.escape(run)}-(final|\d{{3}}-)")
            out += [r for r in tags if own.match(r.rsplit(":", 1)[-1])]
            refs = list(dict.fromkeys(r for r in out if not r.endswith(":<none>")))
            if refs:
                subprocess.run(["docker", "rmi", "-f", *refs], capture_output=True)
            # What is left of the run (untagged parents) goes by id.
            left = subprocess.run(["docker", "images", "-q", "--filter", f"label=belay.run={run}"],
                                  capture_output=True, text=True).stdout.split()
            for i in left:
                subprocess.run(["docker", "rmi", "-f", i], capture_output=True)
            done.add(run)


def prune_toolchains(prefix):
    """Remove the toolchain images this batch made (`belay.cache.scope` names its run-id prefix)."""
    ids = subprocess.run(["docker", "images", "-q", "--filter", "label=belay.kind=toolchain"],
                         capture_output=True, text=True).stdout.split()
    if not ids:
        return
    out = subprocess.run(["docker", "image", "inspect", "--format",
                          '{{.Id}} {{index .Config.Labels "belay.cache.scope"}}', *dict.fromkeys(ids)],
                         capture_output=True, text=True).stdout.splitlines()
    ids = [line.split()[0] for line in out if f" batch-{prefix}-" in line]
    for i in dict.fromkeys(ids):
        subprocess.run(["docker", "rmi", "-f", i], capture_output=True)


def run_batch(belay, projects, pdir, odir, prefix, jobs, extra, prune=False):
    t0 = time.monotonic()
    cmd = [belay, "env", "build-projects", "--projects-file", projects, "--projects-dir", pdir, "--oracles-dir", odir,
           "--jobs", str(jobs), "--run-id-prefix", prefix, "--command-timeout", "1200", "--oracle-timeout", "900", *extra]
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, env=BENCH_ENV)
        done = set()
        while p.poll() is None:
            if prune:
                # A finished project's checkpoints and final image go as the
                # batch goes (its oracle has run): 122 projects' images do not
                # fit on a small disk.
                prune_finished(pdir, done)
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        wall = time.monotonic() - t0
        if prune:
            # The last projects ended after the loop's last look; the batch's
            # toolchain images (no run of their own) go with the batch.
            prune_finished(pdir, done)
            prune_toolchains(prefix)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if p.returncode not in (0, 1):
        sys.exit(f"build-projects failed ({p.returncode}):\n{stdout}\n{stderr}")
    return wall, json.load(open(os.path.join(pdir, "build-projects-summary.json"))), stdout


def report_warm(args, projects, odir, cold, cold_wall, stamp):
    ok = [p for p in cold["projects"] if p["status"] == "ok"]
    warm_wall, warm, _ = run_batch(args.belay, projects, os.path.join(args.work, "warm"), odir, f"corpus-{stamp}-warm", args.jobs, [])
    hits = sum(p["cache_hits"] for p in warm["projects"])
    misses = sum(p["cache_misses"] for p in warm["projects"])
    print(f"\nsecond run (cache): batch wall {warm_wall:.1f} s = {100.0 * warm_wall / cold_wall:.1f}% of the cold run; "
          f"cache hits {hits}/{hits + misses} = {100.0 * hits / max(1, hits + misses):.0f}%; {warm['ok']}/{warm['total']} ok")
    cold_ok = {p["name"]: p["duration_s"] for p in ok}
    warm_ok = [p["duration_s"] for p in warm["projects"] if p["name"] in cold_ok]
    if warm_ok:
        print(f"  projects that built: second run {sum(warm_ok):.1f} s vs {sum(cold_ok.values()):.1f} s cold = "
              f"{100.0 * sum(warm_ok) / sum(cold_ok.values()):.1f}% (median {statistics.median(warm_ok):.2f} s per project); "
              f"the failed ones retry their failing block")



def buildkit_cli():
    """A docker CLI that builds with BuildKit: with buildx, or Debian's
    docker.io client (BuildKit built in before 23)."""
    if subprocess.run(["docker", "buildx", "version"], capture_output=True).returncode == 0:
        return "docker"
    return "/usr/bin/docker"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--limit", type=int)
    ap.add_argument("--corpus", help="the corpus file (default corpus.txt beside this script; corpus-node.txt is the node one)")
    ap.add_argument("--belay", default=os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target")), "release", "belay"))
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "belay-corpus"))
    ap.add_argument("--cache", default=os.path.expanduser("~/.cache/belay-bench"))
    ap.add_argument("--skip-docker", action="store_true")
    ap.add_argument("--phases", default="cold,warm,packages,docker")
    ap.add_argument("--prune", action="store_true",
                    help="remove each project's images once it has finished (not with the warm phase, which reuses them)")
    ap.add_argument("--from-cold", action="store_true",
                    help="reuse the cold run in --work (its summary, scripts and package caches) for the packages and docker phases")
    ap.add_argument("--sample", type=int,
                    help="the packages and docker phases take this many of the cold run's successful projects, spread over the corpus")
    ap.add_argument("--builders", default="legacy,buildkit,legacy-cache",
                    help="docker phase: legacy (Dockerfile.legacy, --no-cache), buildkit (Dockerfile, --no-cache, cache mounts "
                         "emptied, then warm), legacy-cache (Dockerfile.legacy with the layer cache, empty at the start)")
    ap.add_argument("--warm-only", action="store_true",
                    help="reuse the cold run in --work (its images are on the engine) and only measure the cache run")
    args = ap.parse_args()
    phases = set(args.phases.split(","))
    if args.prune and "warm" in phases:
        sys.exit("--prune removes the cold run's images, which the warm phase reuses: leave warm out of --phases")
    if args.skip_docker:
        phases.discard("docker")
    if not os.path.exists(args.belay):
        sys.exit(f"{args.belay} not found: cargo build --release -p belay")

    items = read_corpus(args.limit, args.corpus)
    if args.from_cold:
        cold = json.load(open(os.path.join(args.work, "cold", "build-projects-summary.json")))
        odir = os.path.join(args.work, "oracles")
        # The package caches the cold run filled, kept.
        BENCH_ENV["BELAY_CACHE_DIR"] = os.path.join(args.work, "belay-cache")
        print(f"reusing the cold run of {cold['started_at']}: {cold['ok']}/{cold['total']} ok, batch wall {cold['duration_s']:.0f} s", flush=True)
        compare(args, phases, cold, odir, time.strftime("%H%M%S"))
        return
    if args.warm_only:
        cold = json.load(open(os.path.join(args.work, "cold", "build-projects-summary.json")))
        projects, odir = os.path.join(args.work, "projects.txt"), os.path.join(args.work, "oracles")
        shutil.rmtree(os.path.join(args.work, "warm"), ignore_errors=True)
        report_warm(args, projects, odir, cold, cold["duration_s"], time.strftime("%H%M%S"))
        return
    shutil.rmtree(args.work, ignore_errors=True)
    src, odir = os.path.join(args.work, "src"), os.path.join(args.work, "oracles")
    os.makedirs(src)
    os.makedirs(odir)
    def fetch(it):
        name = f"{it['name']}-{it['version']}".lower()
        name = re.sub(r"[^a-z0-9._-]", "-", name.lstrip("@").replace("/", "-"))
        dest = os.path.join(src, name)
        {"crate": fetch_crate, "npm": fetch_npm, "deb": fetch_deb}.get(it["kind"], fetch_pypi)(it, dest, args.cache)
        with open(os.path.join(odir, f"{name}.oracle.json"), "w") as f:
            json.dump(oracle_for(it, dest), f)
        it["project"] = name
    if any(it["kind"] == "pypi" for it in items):
        fetch_python(args.cache)
    # Fetching is network-bound (and pip prepares each sdist's metadata): 4 at a time.
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as ex:
        list(ex.map(fetch, items))
    lines = [f"./src/{it['project']}" for it in items]
    projects = os.path.join(args.work, "projects.txt")
    with open(projects, "w") as f:
        f.write("\n".join(lines) + "\n")
    stamp = time.strftime("%H%M%S")

    BENCH_ENV["BELAY_CACHE_DIR"] = os.path.join(args.work, "belay-cache")
    shutil.rmtree(BENCH_ENV["BELAY_CACHE_DIR"], ignore_errors=True)
    print(f"corpus: {len(items)} projects ({sum(i['kind'] == 'pypi' for i in items)} PyPI, {sum(i['kind'] == 'crate' for i in items)} crates, "
          f"{sum(i['kind'] == 'npm' for i in items)} npm, {sum(i['kind'] == 'deb' for i in items)} Debian sources, {sum(i['native'] for i in items)} native); jobs {args.jobs}; "
          f"cold: --no-cache, package caches emptied", flush=True)
    cold_wall, cold, _ = run_batch(args.belay, projects, os.path.join(args.work, "cold"), odir, f"corpus-{stamp}", args.jobs, ["--no-cache"],
                                   prune=args.prune)
    ok = [p for p in cold["projects"] if p["status"] == "ok"]
    times = [p["duration_s"] for p in cold["projects"]]
    print(f"\ncold run: {cold['ok']}/{cold['total']} ok = {100.0 * cold['ok'] / cold['total']:.0f}% success, batch wall {cold_wall:.0f} s")
    print(f"time per project: median {statistics.median(times):.1f} s, p90 {pct(times, 0.9):.1f} s")
    print(f"repairs used: {sum(p['repairs'] for p in cold['projects'])} in {sum(1 for p in cold['projects'] if p['repairs'])} projects "
          f"({', '.join(p['name'] for p in cold['projects'] if p['repairs'])})")
    failed = [p for p in cold["projects"] if p["status"] != "ok"]
    if failed:
        print("failed projects by class:")
        by = {}
        for p in failed:
            by.setdefault(classify(p), []).append(p)
        for cls, ps in by.items():
            print(f"  {cls}: " + ", ".join(p["name"] for p in ps))

    # Success per class of project (the corpus tags); a project counts in each of its tags.
    # Each result names the directory it was built from (`source`), as the
    # projects file gave it: `./src/<project>`.
    by_source = {os.path.basename(p["source"]): p for p in cold["projects"]}
    classes = {}
    for it in items:
        r = by_source.get(it["project"])
        if r is None:
            continue
        for tag in [it["kind"]] + (it["tags"] or ["plain"]):
            c = classes.setdefault(tag, [0, 0])
            c[1] += 1
            c[0] += r["status"] == "ok"
    print("success per class:")
    print("  | class | ok | total | success |")
    print("  |---|---|---|---|")
    for tag, (good, total) in sorted(classes.items()):
        print(f"  | {tag} | {good} | {total} | {100.0 * good / total:.0f}% |")

    if "warm" in phases:
        report_warm(args, projects, odir, cold, cold_wall, stamp)
    compare(args, phases, cold, odir, stamp)


def compare(args, phases, cold, odir, stamp):
    """The packages and docker phases, on the same projects: the cold run's
    successes, or --sample of them."""
    if not phases & {"packages", "docker"}:
        return
    cold_wall = cold["duration_s"]
    ok = [p for p in cold["projects"] if p["status"] == "ok"]
    if args.sample and args.sample < len(ok):
        step = len(ok) / args.sample
        ok = [ok[int(i * step)] for i in range(args.sample)]
    print(f"\npackages and docker phases: {len(ok)} projects ({', '.join(p['name'] for p in ok)})", flush=True)
    projects = os.path.join(args.work, f"projects-compare-{stamp}.txt")
    with open(projects, "w") as f:
        f.write("\n".join(p["source"] for p in ok) + "\n")

    # Warm package caches, no checkpoint reuse: every block runs again, but
    # downloads come from the machine's caches.
    pkg_wall, pkg = None, None
    if "packages" in phases:
        pdir = os.path.join(args.work, "warm-packages")
        shutil.rmtree(pdir, ignore_errors=True)
        pkg_wall, pkg, _ = run_batch(args.belay, projects, pdir, odir,
                                     f"corpus-{stamp}-pkg", args.jobs, ["--no-cache"], prune=args.prune)
    if pkg:
        shared = 0
        for p in pkg["projects"]:
            try:
                shared += len((json.load(open(p["manifest"])).get("toolchain") or {}).get("shared", []))
            except (OSError, ValueError, TypeError):
                pass
        print(f"toolchain blocks shared within the batch: {shared}", flush=True)
        if args.prune:
            subprocess.run("docker images --format '{{.Repository}}:{{.Tag}}' | grep '^belay-toolchain:' | xargs -r docker rmi -f",
                           shell=True, capture_output=True)
        times = [p["duration_s"] for p in pkg["projects"]]
        print(f"\nwarm package caches (--no-cache): batch wall {pkg_wall:.1f} s; {pkg['ok']}/{pkg['total']} ok; "
              f"per project median {statistics.median(times):.1f} s, p90 {pct(times, 0.9):.1f} s", flush=True)

    if "docker" in phases and ok:
        def docker_build(p, builder, layer_cache=False):
            m = json.load(open(p["manifest"]))
            tag = f"belay-corpus-docker:{p['name']}"
            # The state dir is outside the checkout: the Dockerfile expects the
            # run directory at ./belay-run of its context (its header says so).
            run_copy = os.path.join(m["repo_path"], "belay-run")
            shutil.rmtree(run_copy, ignore_errors=True)
            shutil.copytree(m["run_dir"], run_copy, ignore=shutil.ignore_patterns("logs"))
            if builder == "legacy":
                cli, env = ["docker"], dict(os.environ, DOCKER_BUILDKIT="0")
                dockerfile = m.get("dockerfile_legacy_path") or m["dockerfile_path"]
            else:
                cli, env = [buildkit_cli()], dict(os.environ, DOCKER_BUILDKIT="1")
                dockerfile = m["dockerfile_path"]
            t0 = time.monotonic()
            no_cache = [] if layer_cache else ["--no-cache"]
            r = subprocess.run([*cli, "build", *no_cache, "-q", "-t", tag, "-f", dockerfile, m["repo_path"]],
                               capture_output=True, text=True, env=env)
            wall = time.monotonic() - t0
            if not layer_cache:
                subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)
            return p, wall, r.returncode == 0
        # The legacy builder downloads everything every time; BuildKit's first
        # pass fills its cache mounts (emptied first) and the second uses them.
        subprocess.run([buildkit_cli(), "builder", "prune", "-af", "--filter", "type=exec.cachemount"],
                       capture_output=True, env=dict(os.environ, DOCKER_BUILDKIT="1"))
        walls = {}
        builders = args.builders.split(",")
        passes = ([("legacy builder", "legacy")] if "legacy" in builders else []) + \
            ([("BuildKit, cold cache mounts", "buildkit"), ("BuildKit, warm cache mounts", "buildkit")] if "buildkit" in builders else []) + \
            ([("legacy builder, layer cache empty at the start", "legacy-cache")] if "legacy-cache" in builders else [])
        for label, builder in passes:
            # Without --no-cache, the projects' identical steps (the toolchain
            # before the COPY) share layers within the pass, as belay's batch
            # shares its toolchain checkpoints: the like-for-like figure. The
            # earlier passes removed their images, so its cache starts empty.
            layer_cache = builder == "legacy-cache"
            builder = "legacy" if layer_cache else builder
            t0 = time.monotonic()
            with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as ex:
                results = list(ex.map(lambda p: docker_build(p, builder, layer_cache), ok))
            walls[label] = time.monotonic() - t0
            if layer_cache:
                for p in ok:
                    subprocess.run(["docker", "rmi", "-f", f"belay-corpus-docker:{p['name']}"], capture_output=True)
            built = [(p, w) for p, w, good in results if good]
            print(f"\ndocker build --no-cache of the written Dockerfiles ({label}): {len(built)}/{len(ok)} built, batch wall {walls[label]:.0f} s", flush=True)
        if "legacy builder" in walls and not args.sample:
            print(f"batch wall, cold: belay {cold_wall:.0f} s vs docker (legacy builder) {walls['legacy builder']:.0f} s = "
                  f"{cold_wall / walls['legacy builder']:.2f}x (belay's includes the failed projects and validates and checkpoints every block)")
        for label in [w for w in ("legacy builder", "BuildKit, warm cache mounts", "legacy builder, layer cache empty at the start") if w in walls] if pkg else ():
            pkg_ok = {p["name"]: p["duration_s"] for p in pkg["projects"] if p["status"] == "ok"}
            print(f"batch wall, belay with warm package caches vs docker ({label}): {pkg_wall:.0f} s vs {walls[label]:.0f} s = "
                  f"{pkg_wall / walls[label]:.2f}x ({len(pkg_ok)} projects built by belay)")


if __name__ == "__main__":
    main()
