#!/usr/bin/env python3
"""Generate crates/belay-env/data/module-dists.tsv.

The table maps Python *import names* to the PyPI *distribution* that provides
them, where installing the import name would not do (``yaml`` -> ``PyYAML``,
``xdist`` -> ``pytest-xdist``, ``google.protobuf`` -> ``protobuf`` ...; see
listed() for exactly which pairs are written).  belay's env-builder
repair reads it when a test run fails with ``No module named 'X'``.

It is built from real package metadata: for every distribution listed in
``scripts/module-dists/popular.txt`` (most used first) the latest wheel is
fetched with ``pip download`` (pip talks to whatever index it is configured
with), opened, and the import names it provides are read from
``*.dist-info/top_level.txt`` or, failing that, from ``RECORD``.

Usage:  python3 scripts/gen-module-dists.py [--jobs N] [--max-mb N] [--limit N]
                                             [--keep-wheels DIR]
(--keep-wheels is for working on the script: wheels are kept and reused
instead of being deleted once read; the output does not depend on it.)

Python 3.11+, standard library only.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import csv
import datetime as dt
import email.parser
import io
import keyword
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
POPULAR = ROOT / "scripts" / "module-dists" / "popular.txt"
OUTPUT = ROOT / "crates" / "belay-env" / "data" / "module-dists.tsv"

# Known right answers that win over "first provider in popular.txt".  Several
# distributions ship the same import name (opencv-python, -headless, -contrib
# all ship cv2; pycrypto and pycryptodome both ship Crypto ...), and some
# right answers only publish sdists, so their wheel cannot be read here.
OVERRIDES: dict[str, str] = {
    # Headless build: no Qt/X11 libraries needed, which is what a CI/test
    # environment wants.  Deliberately NOT opencv-python.
    "cv2": "opencv-python-headless",
    "yaml": "PyYAML",
    "jwt": "PyJWT",
    "magic": "python-magic",
    "serial": "pyserial",
    "Crypto": "pycryptodome",
    "Cryptodome": "pycryptodomex",
    "dateutil": "python-dateutil",
    "attr": "attrs",
    "PIL": "Pillow",
    "skimage": "scikit-image",
    "sklearn": "scikit-learn",
    "bs4": "beautifulsoup4",
    "gi": "PyGObject",
    "cairo": "pycairo",
    "dbus": "dbus-python",
    "MySQLdb": "mysqlclient",
    "psycopg2": "psycopg2-binary",
    "zmq": "pyzmq",
    "dotenv": "python-dotenv",
    "docx": "python-docx",
    "pptx": "python-pptx",
    "jose": "python-jose",
    # Removed from the newest setuptools: the last ones that ship it.
    "pkg_resources": "setuptools<81",
    "nose": "pynose",
    # pyparsing's diagram extra; its test suite imports it.
    "railroad": "railroad-diagrams",
    # pytorch-lightning vendors a copy; the package of its own is the answer.
    "lightning_fabric": "lightning-fabric",
    # pytest ships a py.py shim (py.path only); code that imports py wants py.
    "py": "py",
    "_cffi_backend": "cffi",
    "OpenSSL": "pyOpenSSL",
    "ldap": "python-ldap",
    "usb": "pyusb",
    "fitz": "PyMuPDF",
    "git": "GitPython",
    "github": "PyGithub",
    "socks": "PySocks",
    "websocket": "websocket-client",
    "multipart": "python-multipart",
    "slugify": "python-slugify",
    "wx": "wxPython",
    "OpenGL": "PyOpenGL",
    "gnupg": "python-gnupg",
    "Bio": "biopython",
    "pydispatch": "PyDispatcher",
    "telegram": "python-telegram-bot",
    "kafka": "kafka-python",
    "engineio": "python-engineio",
    "socketio": "python-socketio",
    "decouple": "python-decouple",
    "snappy": "python-snappy",
    "community": "python-louvain",
}

# Top-level directories that are never the import name a project wants.
JUNK_TOP = {"tests", "test", "testing", "testing_data", "docs", "doc", "examples",
            "example", "benchmarks", "benchmark", "setup", "conftest", "typings",
            "licenses", "vendor_licenses"}

# How far to descend into namespace packages (google/cloud/storage is 3,
# opentelemetry/exporter/otlp/proto/http is 5).
MAX_NS_DEPTH = 5

PIP_BASE = [sys.executable, "-m", "pip", "download", "--no-deps",
            "--only-binary", ":all:", "--no-cache-dir", "--disable-pip-version-check",
            "--progress-bar", "off"]
PIP_PLATFORM = ["--python-version", "3.11",
                "--platform", "manylinux2014_x86_64",
                "--platform", "manylinux_2_17_x86_64",
                "--platform", "any"]

SIZE_RE = re.compile(r"Downloading \S+\.whl \(([\d.]+) (kB|MB|GB)\)")

print_lock = threading.Lock()


def log(*a: object) -> None:
    with print_lock:
        print(*a, flush=True)


def normalize(name: str) -> str:
    """PEP 503 normalisation."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_popular(path: Path) -> list[str]:
    names: list[str] = []
    seen: set[str] = set()
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        n = normalize(line)
        if n in seen:
            log(f"note: duplicate in popular.txt: {line}")
            continue
        seen.add(n)
        names.append(line)
    return names


# --------------------------------------------------------------------------
# Downloading


def run_pip(cmd: list[str], max_bytes: int) -> tuple[bool, str]:
    """Run pip download; kill it if it announces a wheel bigger than max_bytes."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**os.environ, "PIP_NO_INPUT": "1"})
    out: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        out.append(line)
        m = SIZE_RE.search(line)
        if m:
            size = float(m.group(1)) * {"kB": 1e3, "MB": 1e6, "GB": 1e9}[m.group(2)]
            if size > max_bytes:
                proc.kill()
                proc.wait()
                return False, f"wheel too large ({m.group(1)} {m.group(2)})"
    rc = proc.wait()
    if rc != 0:
        err = [l.strip() for l in out if l.strip().startswith("ERROR")]
        return False, (err[0] if err else f"pip exited {rc}")[:200]
    return True, ""


def fetch_wheel(name: str, dest: Path, max_bytes: int) -> tuple[Path | None, str]:
    reason = ""
    for extra in (PIP_PLATFORM, []):
        ok, why = run_pip(PIP_BASE + ["--dest", str(dest)] + extra + [name], max_bytes)
        if ok:
            wheels = sorted(dest.glob("*.whl"))
            if wheels:
                return wheels[0], ""
            why = "pip succeeded but left no wheel"
        reason = reason or why
        if why.startswith("wheel too large"):
            return None, why
    return None, reason


# --------------------------------------------------------------------------
# Reading a wheel


def module_name(filename: str) -> str | None:
    """'foo.py' -> 'foo', 'foo.cpython-311-x86_64-linux-gnu.so' -> 'foo'."""
    if filename.endswith(".py") or filename.endswith(".so") or filename.endswith(".pyd"):
        return filename.split(".", 1)[0]
    return None


def valid_dotted(name: str) -> bool:
    return all(p.isidentifier() and not keyword.iskeyword(p) for p in name.split("."))


class Tree:
    """The importable files of a wheel, as a directory tree."""

    def __init__(self, files: list[str]):
        self.dirs: dict[str, set[str]] = {}   # dir path -> child names (files and dirs)
        self.files: set[str] = set()
        for f in files:
            f = strip_data_prefix(f)
            if f is None:
                continue
            parts = f.split("/")
            if "__pycache__" in parts or parts[0].endswith(".dist-info"):
                continue
            self.files.add(f)
            for i in range(len(parts)):
                parent = "/".join(parts[:i])
                self.dirs.setdefault(parent, set()).add(parts[i])

    def is_dir(self, path: str) -> bool:
        return path in self.dirs

    def has_code(self, path: str) -> bool:
        """Does the directory contain any module, at any depth?"""
        prefix = path + "/"
        return any(f.startswith(prefix) and module_name(f.rsplit("/", 1)[1])
                   for f in self.files)

    def init_of(self, path: str) -> str | None:
        for cand in ("__init__.py", "__init__.pyi"):
            if f"{path}/{cand}" in self.files:
                return f"{path}/{cand}"
        for child in self.dirs.get(path, ()):
            if child.startswith("__init__.") and module_name(child):
                return f"{path}/{child}"
        return None

    def modules_at(self, path: str) -> dict[str, str]:
        """Importable names directly under a directory: name -> 'dir' | 'mod'."""
        out: dict[str, str] = {}
        for child in sorted(self.dirs.get(path, ())):
            full = f"{path}/{child}" if path else child
            if self.is_dir(full):
                # 'numpy.libs', 'foo-1.0.data' ... are not importable
                if child.isidentifier() and self.has_code(full):
                    out[child] = "dir"
            else:
                m = module_name(child)
                if m and m != "__init__" and m.isidentifier():
                    out.setdefault(m, "mod")
        return out


def strip_data_prefix(path: str) -> str | None:
    parts = path.split("/")
    if parts[0].endswith(".data"):
        if len(parts) > 2 and parts[1] in ("purelib", "platlib"):
            return "/".join(parts[2:])
        return None
    return path


NS_MARKERS = ("declare_namespace", "extend_path")


def expand(tree: Tree, zf: zipfile.ZipFile, path: str, depth: int, out: list[str],
           ns: dict[str, bool], dist_norm: str) -> None:
    """Emit the import name for directory `path`, descending into namespaces.

    Namespace directories passed through are recorded in `ns` (dotted name ->
    whether modules sit directly in it, like google/api/*_pb2.py).  A namespace
    directory named like the distribution itself (PyQt5/ in PyQt5, poetry/ in
    poetry) belongs to it: it is emitted as a whole."""
    dotted = path.replace("/", ".")
    init = tree.init_of(path)
    namespace = init is None
    if init is not None and init.endswith(".py"):
        try:
            text = zf.read(init).decode("utf-8", "replace")
            # pkg_resources / pkgutil style namespace package (old zope, ...)
            if len(text) < 2000 and any(m in text for m in NS_MARKERS):
                namespace = True
        except KeyError:
            pass
    if not namespace or depth >= MAX_NS_DEPTH or normalize(dotted) == dist_norm:
        out.append(dotted)
        return
    children = tree.modules_at(path)
    if not children:
        out.append(dotted)
        return
    ns[dotted] = any(kind == "mod" for kind in children.values())
    for child, kind in children.items():
        sub = f"{path}/{child}"
        if kind == "dir":
            expand(tree, zf, sub, depth + 1, out, ns, dist_norm)
        else:
            out.append(sub.replace("/", "."))


def read_wheel(whl: Path, dist_norm: str) -> tuple[str, list[str], dict[str, bool]]:
    """Return (METADATA Name, import names provided, namespace dirs seen)."""
    with zipfile.ZipFile(whl) as zf:
        names = zf.namelist()
        info = sorted({n.split("/", 1)[0] for n in names
                       if n.split("/", 1)[0].endswith(".dist-info")})
        if not info:
            raise ValueError("no .dist-info in wheel")
        di = info[0]
        meta = email.parser.Parser().parsestr(
            zf.read(f"{di}/METADATA").decode("utf-8", "replace"), headersonly=True)
        dist_name = (meta.get("Name") or "").strip()
        if not dist_name:
            raise ValueError("METADATA has no Name")

        files = names
        if f"{di}/RECORD" in names:
            rec = zf.read(f"{di}/RECORD").decode("utf-8", "replace")
            files = [row[0] for row in csv.reader(io.StringIO(rec)) if row]
        tree = Tree(files)

        top: list[str] = []
        if f"{di}/top_level.txt" in names:
            listed = zf.read(f"{di}/top_level.txt").decode("utf-8", "replace").split()
            for t in listed:
                t = t.strip().strip("/")
                if "/" in t:  # 'googleapiclient/discovery_cache': not top level
                    continue
                if tree.is_dir(t) or t in tree.modules_at(""):
                    top.append(t)
        if not top:  # no top_level.txt, or nothing it names is in the wheel
            top = list(tree.modules_at(""))

        provided: list[str] = []
        ns: dict[str, bool] = {}
        for t in top:
            if t.lower() in JUNK_TOP and normalize(t) != dist_norm:
                continue
            if tree.is_dir(t):
                expand(tree, zf, t, 1, provided, ns, dist_norm)
            else:
                provided.append(t)
    return dist_name, provided, ns


def listed(imp: str, dist: str) -> bool:
    """Does the pair go in the table?

    Not when the import name differs from its distribution's name only by
    case (requests, Jinja2, SQLAlchemy): installing the import name works.
    Names that differ only by `_`/`-` (pytest_cov -> pytest-cov) are kept so
    the table answers for them explicitly, and so are all dotted names
    (google.cloud.storage -> google-cloud-storage, jaraco.functools): a lookup
    that falls back to a module's first component would get those wrong.
    """
    return "." in imp or imp.lower() != dist.lower()


def keep_import(name: str) -> bool:
    if not valid_dotted(name):
        return False
    first = name.split(".", 1)[0]
    if name == "_cffi_backend":
        return True
    if "__mypyc" in name:  # mypyc's runtime helper, e.g. 'c78778...__mypyc'
        return False
    if any(p.startswith("_") for p in name.split(".")):
        return False
    if first in sys.stdlib_module_names:
        return False
    return True


# --------------------------------------------------------------------------


Result = tuple[str | None, list[str], dict[str, bool], str]


def process(name: str, workdir: Path, max_bytes: int,
            keep: Path | None = None) -> tuple[str, Result]:
    if keep is not None:  # development: reuse / keep the wheels
        dest = keep / normalize(name)
        dest.mkdir(parents=True, exist_ok=True)
    else:
        dest = Path(tempfile.mkdtemp(prefix="whl-", dir=workdir))
    try:
        cached = sorted(dest.glob("*.whl")) if keep is not None else []
        whl, why = (cached[0], "") if cached else fetch_wheel(name, dest, max_bytes)
        if whl is None:
            return name, (None, [], {}, why)
        try:
            dist_name, provided, ns = read_wheel(whl, normalize(name))
        except Exception as e:  # noqa: BLE001 - report and go on
            return name, (None, [], {}, f"cannot read {whl.name}: {e}")
        return name, (dist_name, provided, ns, whl.name)
    finally:
        if keep is None:
            shutil.rmtree(dest, ignore_errors=True)  # delete each wheel once read


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--popular", type=Path, default=POPULAR)
    ap.add_argument("--output", type=Path, default=OUTPUT)
    ap.add_argument("--jobs", type=int, default=4, help="parallel pip downloads")
    ap.add_argument("--max-mb", type=float, default=60.0, help="skip larger wheels")
    ap.add_argument("--limit", type=int, default=0, help="only the first N names (testing)")
    ap.add_argument("--keep-wheels", type=Path, default=None, metavar="DIR",
                    help="development: keep wheels in DIR and reuse them on the next run")
    args = ap.parse_args()

    popular = read_popular(args.popular)
    if args.limit:
        popular = popular[: args.limit]
    order = {normalize(n): i for i, n in enumerate(popular)}
    max_bytes = int(args.max_mb * 1e6)

    results: dict[str, Result] = {}
    with tempfile.TemporaryDirectory(prefix="gen-module-dists-") as tmp:
        work = Path(tmp)
        with cf.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as ex:
            futs = [ex.submit(process, n, work, max_bytes, args.keep_wheels) for n in popular]
            for done, fut in enumerate(cf.as_completed(futs), 1):
                name, res = fut.result()
                results[name] = res
                dist, provided, _, note = res
                status = f"{len(provided)} names" if dist else f"FAILED: {note}"
                log(f"[{done}/{len(popular)}] {name}: {status}")

    # A namespace directory with modules directly in it (google/api/*_pb2.py)
    # is named as a whole when a single distribution read puts anything in it:
    # `from google.api import http_pb2` fails with "No module named
    # 'google.api'".  Shared ones (google/cloud: google-cloud-core's modules
    # next to every google-cloud-* package) stay module by module, so that a
    # longest-prefix lookup of google.cloud.storage does not hit them.
    # Never one that another distribution ships as a regular package or is
    # named after (PyQt5/ in PyQt5_sip only adds PyQt5.sip to PyQt5).
    contributors: dict[str, set[str]] = {}
    regular: set[str] = set()
    for dist, provided, ns, _ in results.values():
        for d in ns if dist else ():
            contributors.setdefault(d, set()).add(dist)
        regular.update(provided)
    for name in popular:
        dist, provided, ns, note = results[name]
        if dist is None:
            continue
        whole: list[str] = []
        for d, direct in ns.items():  # parents come before their children
            if (direct and d not in regular and normalize(d) not in order
                    and contributors[d] == {dist}
                    and not any(d.startswith(w + ".") for w in whole)):
                whole.append(d)
        if whole:
            kept = [p for p in provided if not any(p.startswith(w + ".") for w in whole)]
            results[name] = (dist, kept + whole, ns, note)

    # import name -> providers in popularity order
    providers: dict[str, list[str]] = {}
    spelled: dict[str, str] = {}  # normalised dist -> METADATA Name
    read_ok = 0
    for name in popular:
        dist, provided, _, _ = results[name]
        if dist is None:
            continue
        read_ok += 1
        spelled[normalize(dist)] = dist
        for imp in provided:
            if keep_import(imp):
                lst = providers.setdefault(imp, [])
                if dist not in lst:
                    lst.append(dist)

    table: dict[str, str] = {}
    conflicts: list[str] = []
    for imp, dists in providers.items():
        dists.sort(key=lambda d: order.get(normalize(d), len(order)))
        table[imp] = dists[0]
        if len(dists) > 1:
            conflicts.append(f"{imp}: {', '.join(dists)} -> {dists[0]}")
    overridden: list[str] = []
    for imp, dist in OVERRIDES.items():
        dist = spelled.get(normalize(dist), dist)
        if table.get(imp) != dist:
            overridden.append(f"{imp}: {table.get(imp, '(none)')} -> {dist}")
        table[imp] = dist

    rows = sorted((imp, dist) for imp, dist in table.items() if listed(imp, dist))

    args.output.parent.mkdir(parents=True, exist_ok=True)
    today = dt.date.today().isoformat()
    argv = " ".join(["python3", "scripts/gen-module-dists.py", *sys.argv[1:]])
    with args.output.open("w") as f:
        f.write(
            "# Python import name -> PyPI distribution that provides it.\n"
            f"# Generated by `{argv}` on {today}\n"
            f"# from the latest wheels of {read_ok} distributions listed in\n"
            "# scripts/module-dists/popular.txt, each fetched with\n"
            "#   pip download --no-deps --only-binary :all: --python-version 3.11 \\\n"
            "#     --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform any\n"
            "# and read from *.dist-info/top_level.txt or RECORD (namespace packages as\n"
            "# dotted names, e.g. google.protobuf).  Listed: every name that is not\n"
            "# its distribution's own name up to case (so pytest_cov -> pytest-cov is\n"
            "# listed, requests is not), and every dotted name; when several\n"
            "# distributions ship a name the most popular wins, except for the explicit\n"
            "# OVERRIDES in the script (e.g. cv2 -> opencv-python-headless).\n"
            "# Distribution names are spelled as in the wheel's METADATA Name field.\n"
            "# Do not edit by hand: rerun the script.\n"
            "# import_name\tdistribution\n"
        )
        for imp, dist in rows:
            f.write(f"{imp}\t{dist}\n")

    failures = [(n, results[n][3]) for n in popular if results[n][0] is None]
    print(f"\nwheels read: {read_ok} of {len(popular)}")
    print(f"failures: {len(failures)}")
    for n, why in failures:
        print(f"  {n}: {why}")
    print(f"conflicts resolved by popularity: {len(conflicts)}")
    for c in sorted(conflicts):
        print(f"  {c}")
    print(f"overrides that changed the result: {len(overridden)}")
    for o in sorted(overridden):
        print(f"  {o}")
    print(f"entries written: {len(rows)} -> {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
