#!/usr/bin/env python3
"""What is behind: for every pin of versions.yml and the Python requirements, the pinned version, the newest release
the package registries the project already uses show (the Go module proxy, PyPI), its date and its release notes.

    python3 tests/outdated.py                 # the table, then a summary line
    python3 tests/outdated.py --json out.json # the same as JSON too

Not a test: its answers change with the registries. `make outdated` runs it. A pin is "behind" when a newer release of
its line (same major.minor) or a newer line exists and that release is more than a month old; a newer release younger
than that is only noted. Where no registry here can show the newest (NVIDIA's repositories and container registries are
not reachable), the line says so and why, as versions.yml's `watch` records it. Exit status 0 unless a registry
answered nothing at all (then 2): being behind is information, not a failure.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import yaml

ROOT = Path(__file__).resolve().parents[1]
MONTH = dt.timedelta(days=30)
# Modules whose import path is not their repository's (for the release notes' link).
REPOSITORIES = {
    "k8s.io/kubernetes": "kubernetes/kubernetes",
    "sigs.k8s.io/kueue": "kubernetes-sigs/kueue",
    "sigs.k8s.io/kwok": "kubernetes-sigs/kwok",
    "go.etcd.io/etcd/server/v3": "etcd-io/etcd",
    "tags.cncf.io/container-device-interface": "cncf-tags/container-device-interface",
}
_SEMVER = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)(?:-(\d+))?$")  # releases only (go-nvml's v0.13.4-1 counts as one)
_PY_RELEASE = re.compile(r"^(\d+)(?:\.(\d+))?(?:\.(\d+))?(?:\.(\d+))?$")

Fetch = Callable[[str], bytes]


@dataclass
class Pin:
    name: str
    pinned: str
    watch: str  # "go:<module>", "pypi:<project>", or "none:<why>"
    minor_only: bool = False  # a range's newest minor: only a newer major.minor counts, dated by its first release
    line_only: bool = False  # a build of one release line on purpose (containerd 2.2, 2.3, 2.4): only that line counts
    # Prometheus' Go module numbers v3.16.0 as v0.316.0: the module's version of the pin, and back.
    go_form: Optional[str] = None


@dataclass
class Row:
    name: str
    pinned: str
    newest_in_line: Optional[str]
    newest: Optional[str]
    released: Optional[str]
    status: str
    notes_url: Optional[str]


def release_key(version: str) -> Optional[Tuple[int, ...]]:
    """The sort key of a release (a pre-release, a pseudo-version or anything else: None)."""
    match = _SEMVER.match(version) or _PY_RELEASE.match(version)
    if not match:
        return None
    return tuple(int(part) if part else 0 for part in match.groups())


def same_line(version: str, pinned: str) -> bool:
    a, b = release_key(version), release_key(pinned)
    return a is not None and b is not None and a[:2] == b[:2]


def escape_module(module: str) -> str:
    """The Go module proxy's case encoding: an upper-case letter is '!' and the letter in lower case."""
    return re.sub(r"[A-Z]", lambda match: "!" + match.group(0).lower(), module)


def go_proxy() -> str:
    """The first proxy of GOPROXY (go env, else the environment, else Go's default)."""
    value = os.environ.get("GOPROXY", "")
    go = shutil.which("go") or ("/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").exists() else None)
    if not value and go:
        value = subprocess.run([go, "env", "GOPROXY"], capture_output=True, text=True, check=False).stdout.strip()
    for entry in re.split(r"[,|]", value or "https://proxy.golang.org"):
        if entry.startswith(("http://", "https://")):
            return entry.rstrip("/")
    return "https://proxy.golang.org"


def http_fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as answer:  # noqa: S310 (https URLs built here)
        return answer.read()


def versions_go(module: str, fetch: Fetch, proxy: str) -> Tuple[List[str], Callable[[str], Optional[str]]]:
    """The module's listed versions, and a function giving a version's date (the proxy's .info Time)."""
    base = "%s/%s/@v/" % (proxy, escape_module(module))
    listed = fetch(base + "list").decode("utf-8").split()

    def released(version: str) -> Optional[str]:
        try:
            return json.loads(fetch(base + version + ".info")).get("Time")
        except (urllib.error.URLError, OSError, ValueError):
            return None
    return listed, released


def versions_pypi(project: str, fetch: Fetch) -> Tuple[List[str], Callable[[str], Optional[str]]]:
    data = json.loads(fetch("https://pypi.org/pypi/%s/json" % project))
    releases = data.get("releases") or {}
    listed = [version for version, files in releases.items() if files and not all(f.get("yanked") for f in files)]

    def released(version: str) -> Optional[str]:
        files = releases.get(version) or []
        return min((f.get("upload_time_iso_8601") for f in files if f.get("upload_time_iso_8601")), default=None)
    return listed, released


def notes_url(pin: Pin, version: str) -> Optional[str]:
    kind, _, what = pin.watch.partition(":")
    if kind == "pypi":
        return "https://pypi.org/project/%s/%s/" % (what, version)
    if kind == "go":
        repository = REPOSITORIES.get(what)
        if repository is None and what.startswith("github.com/"):
            repository = "/".join(what.split("/")[1:3])
        if repository:
            return "https://github.com/%s/releases/tag/%s" % (repository, version)
    return None


def judge(pin: Pin, listed: Sequence[str], released: Callable[[str], Optional[str]], today: dt.date) -> Row:
    """The row of one pin from the versions its registry lists."""
    pinned = pin.go_form or pin.pinned
    shown = from_go_form if pin.go_form else (lambda version: version)
    releases = sorted((v for v in listed if release_key(v) is not None), key=release_key)
    if pin.watch.startswith("go:"):
        # A Go module's major version is part of its path (v2 and up), so another major listed under this path is an
        # old tag from before modules (Prometheus' v1.99.0 beside its module's v0.316.0), not a newer release.
        releases = [v for v in releases if release_key(v)[0] == release_key(pinned)[0]]
    if not releases:
        return Row(pin.name, pin.pinned, None, None, None, "no release listed", None)
    newest = releases[-1]
    in_line = [v for v in releases if same_line(v, pinned)]
    newest_line = in_line[-1] if in_line else None
    if release_key(pinned) > release_key(newest):
        return Row(pin.name, pin.pinned, None, shown(newest), None,
                   "the registry lists up to %s only (the pin is newer)" % shown(newest), None)
    if pin.minor_only:
        newer_line = [v for v in releases if release_key(v)[:2] == release_key(newest)[:2]]
        behind = [newer_line[0]] if release_key(newest)[:2] > release_key(pinned)[:2] else []
    else:
        behind = [v for v in (newest_line, None if pin.line_only else newest)
                  if v and release_key(v) > release_key(pinned)]
    if not behind:
        return Row(pin.name, pin.pinned, shown(newest_line) if newest_line else None, shown(newest), None, "current",
                   None)
    target = behind[0]  # the newest of the pinned line first: the smaller step
    when = released(target)
    age = (today - dt.date.fromisoformat(when[:10])).days if when else None
    if age is None:
        status = "newer: %s (date unknown)" % shown(target)
    elif age > MONTH.days:
        status = "behind: %s, released %s (%d days ago)" % (shown(target), when[:10], age)
    else:
        status = "newer: %s, released %s (%d days ago, under a month)" % (shown(target), when[:10], age)
    if newest != target and not pin.line_only:
        status += "; newest %s" % shown(newest)
    return Row(pin.name, pin.pinned, shown(newest_line) if newest_line else None, shown(newest),
               when[:10] if when else None, status, notes_url(pin, target))


def to_go_form(version: str) -> str:
    """Prometheus v3.16.0 -> its Go module's v0.316.0."""
    major, minor, patch = (int(part) for part in version.lstrip("v").split("."))
    return "v0.%d%02d.%d" % (major, minor, patch)


def from_go_form(version: str) -> str:
    key = release_key(version)
    if key is None or key[0] != 0 or key[1] < 100:
        return version
    return "v%d.%d.%d" % (key[1] // 100, key[1] % 100, key[2])


def pins(versions: dict, requirement_files: Sequence[Path]) -> List[Pin]:
    """Every pin to look at: versions.yml's components (their `watch`), its lab builds (the go.mod module they pin),
    the Kubernetes range's newest minor, and the Python requirements."""
    out: List[Pin] = []
    kube = versions["kubernetes"]
    out.append(Pin("Kubernetes, newest supported minor (versions.yml kubernetes.maximum)", kube["maximum"] + ".0",
                   "go:k8s.io/kubernetes", minor_only=True))
    for component in versions["components"]:
        watch = component.get("watch", "none:no registry here lists it")
        version = component["version"]
        if isinstance(version, list):
            version = max(version, key=lambda v: release_key(v) or ())
        go_form = to_go_form(version) if watch == "go:github.com/prometheus/prometheus" else None
        out.append(Pin(component["name"], version, watch, go_form=go_form))
    for entry in versions["lab"]:
        modules = [spec.split(":", 1)[1].split("=")[0] for spec in entry["pinned_in"] if ".mod:" in spec]
        if modules:
            out.append(Pin(entry["name"], entry["version"], "go:" + modules[0], line_only=bool(entry.get("line_only"))))
    for path in requirement_files:
        for raw in path.read_text(encoding="utf-8").splitlines():
            line = raw.split("#", 1)[0].strip()
            match = re.match(r"^([A-Za-z0-9_.-]+)(\[[^\]]*\])?==([^\s;]+)", line)
            if match:
                out.append(Pin("%s (%s)" % (match.group(1), path.name), match.group(3), "pypi:" + match.group(1)))
    return out


def look(pin: Pin, fetch: Fetch, proxy: str, today: dt.date) -> Row:
    kind, _, what = pin.watch.partition(":")
    if kind == "none":
        return Row(pin.name, pin.pinned, None, None, None, "not visible here: " + what, None)
    try:
        listed, released = versions_go(what, fetch, proxy) if kind == "go" else versions_pypi(what, fetch)
    except urllib.error.HTTPError as exc:
        return Row(pin.name, pin.pinned, None, None, None, "not visible here: %s answers %d for %s"
                   % ("the Go module proxy" if kind == "go" else "PyPI", exc.code, what), None)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return Row(pin.name, pin.pinned, None, None, None, "no answer: %s" % exc, None)
    return judge(pin, listed, released, today)


def render(rows: Sequence[Row]) -> str:
    width = max(len(row.name) for row in rows)
    lines = ["%-*s  %-24s  %s" % (width, "pin", "pinned", "status")]
    for row in rows:
        lines.append("%-*s  %-24s  %s%s" % (width, row.name, row.pinned, row.status,
                                            "  " + row.notes_url if row.notes_url else ""))
    behind = sum(row.status.startswith("behind") for row in rows)
    newer = sum(row.status.startswith("newer") for row in rows)
    unseen = sum(row.status.startswith(("not visible", "no answer", "no release")) for row in rows)
    lines.append("%d pins: %d behind by over a month, %d with a newer release under a month old, %d current, "
                 "%d not visible here" % (len(rows), behind, newer, len(rows) - behind - newer - unseen, unseen))
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None, fetch: Fetch = http_fetch, today: Optional[dt.date] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = parser.parse_args(argv)
    versions = yaml.safe_load((ROOT / "versions.yml").read_text(encoding="utf-8"))
    wanted = pins(versions, [ROOT / "requirements.txt", ROOT / "requirements-scan.txt"])
    proxy = go_proxy()
    today = today or dt.datetime.now(dt.timezone.utc).date()
    with ThreadPoolExecutor(max_workers=8) as pool:
        rows = list(pool.map(lambda pin: look(pin, fetch, proxy, today), wanted))
    print(render(rows))
    if args.json:
        args.json.write_text(json.dumps([asdict(row) for row in rows], indent=1) + "\n", encoding="utf-8")
    return 2 if rows and all(row.status.startswith("no answer") for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
