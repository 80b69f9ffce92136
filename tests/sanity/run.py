#!/usr/bin/env python
"""Run ``ansible-test sanity`` on this checkout, as the collection galaxy.yml names, without Docker.

ansible-test only runs from a physical directory ``.../ansible_collections/<namespace>/<name>`` (not through the
virtualenv's symlink), so the files git knows of (tracked, and untracked but not ignored, so uncommitted work is
tested too) are copied into ``<cache>/ansible_collections/<namespace>/<name>`` (default cache: ``.cache/sanity`` in
the checkout), wiped and recreated on every run, and ansible-test runs there, on the files galaxy.yml's build_ignore
keeps in the built collection, plus tests/sanity (--all-files: on every copied file; the lab, the tests and the
benchmarks then add their own findings):

    .venv/bin/python tests/sanity/run.py                 # the default tests (TESTS below)
    .venv/bin/python tests/sanity/run.py --test pep8     # only some of them
    .venv/bin/python tests/sanity/run.py -- -v           # anything after -- goes to ansible-test as it is

ansible-test runs with ``--local`` (the interpreter running this script is the controller, with the ansible-core it
has) and ``--python`` of that interpreter. Each sanity test still gets its own virtualenv with ansible-test's pinned
tools, installed from PyPI once and then reused from ``~/.ansible/test/venv`` (keyed by the hash of the pins).
Those virtualenvs are bootstrapped with a get-pip script ansible-test downloads from ci-files.testing.ansible.com; where
that host cannot be reached, a stand-in that runs the same pip version from its PyPI wheel is put in ansible-test's
cache instead (see ensure_pip_bootstrap). The exit status is ansible-test's.
"""

from __future__ import annotations

import argparse
import fnmatch
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

# The sanity tests run by default: the ones the collection must pass, plus the cheap checks that need no extra tool.
TESTS: Tuple[str, ...] = (
    "validate-modules",
    "import",
    "compile",
    "pep8",
    "yamllint",
    # cheap extras: a few seconds together, no tool outside ansible-test's own virtualenvs
    "ansible-doc",
    "action-plugin-docs",
    "empty-init",
    "ignores",
    "line-endings",
    "no-assert",
    "no-get-exception",
    "no-illegal-filenames",
    "no-smart-quotes",
    "replace-urlopen",
    "runtime-metadata",
    "shebang",
    "symlinks",
    "use-argspec-type-path",
    "use-compat-six",
)
# What ansible-test writes into the content root: never copied from the checkout.
SKIPPED_PREFIXES: Tuple[str, ...] = ("tests/output/",)
# Tested even though galaxy.yml's build_ignore leaves tests/ out of the built collection.
ALWAYS_TESTED: Tuple[str, ...] = ("tests/sanity/",)
GET_PIP_URL = "https://ci-files.testing.ansible.com/ansible-test/get-pip-{version}.py"
GET_PIP_STAND_IN = '''\
"""Stand-in for get-pip.py, written by {writer} because {url} could not be downloaded.

Like get-pip.py it runs pip from a pip wheel (pip {version}, from PyPI) and installs what it is given, so
ansible-test can bootstrap its sanity virtualenvs.
"""
import sys

WHEEL = {wheel!r}
sys.path.insert(0, WHEEL)
from pip._internal.cli.main import main  # noqa: E402  (importable only once the wheel is on sys.path)

ARGS = [arg for arg in sys.argv[1:] if arg not in ("--no-setuptools", "--no-wheel")]
sys.exit(main(["install", "--upgrade", "--force-reinstall", "--find-links", {wheel_dir!r}] + ARGS))
'''


def git_root(start: Path) -> Path:
    """The top of the git checkout that holds start."""
    out = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=start, check=True, capture_output=True,
                         text=True).stdout
    return Path(out.strip())


def collection_name(root: Path) -> Tuple[str, str]:
    """(namespace, name) from galaxy.yml (top-level scalar keys; no YAML library needed)."""
    text = (root / "galaxy.yml").read_text(encoding="utf-8")
    found = {}
    for key in ("namespace", "name"):
        match = re.search(r"^%s:\s*[\"']?([A-Za-z0-9_]+)[\"']?\s*(?:#.*)?$" % key, text, re.MULTILINE)
        if not match:
            raise SystemExit("run.py: no %s in %s" % (key, root / "galaxy.yml"))
        found[key] = match.group(1)
    return found["namespace"], found["name"]


def checkout_files(root: Path) -> List[str]:
    """Paths git tracks, and untracked ones it does not ignore, that exist in the work tree."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                         check=True, capture_output=True).stdout
    paths = sorted({path for path in out.decode("utf-8", "surrogateescape").split("\0") if path})
    return [path for path in paths if os.path.lexists(root / path) and not path.startswith(SKIPPED_PREFIXES)]


def copy_tree(root: Path, paths: Sequence[str], target: Path) -> List[str]:
    """Copy paths from root to target (modes kept, symlinks inside the checkout kept as links); return the symlinks
    left out because they point outside the checkout (a local virtualenv link, for example)."""
    left_out = []
    real_root = root.resolve()
    for path in paths:
        source, destination = root / path, target / path
        destination.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            if not source.resolve().is_relative_to(real_root):
                left_out.append(path)
                continue
            os.symlink(os.readlink(source), destination)
        else:
            shutil.copy2(source, destination)
    return left_out


def build_ignore_patterns(root: Path) -> List[str]:
    """galaxy.yml's build_ignore patterns (a block or flow list of scalars; no YAML library needed)."""
    patterns: List[str] = []
    in_list = False
    for line in (root / "galaxy.yml").read_text(encoding="utf-8").splitlines():
        flow = re.match(r"^build_ignore:\s*\[(.*)\]\s*(?:#.*)?$", line)
        if flow:
            return [item.strip().strip("\"'") for item in flow.group(1).split(",") if item.strip()]
        if re.match(r"^build_ignore:\s*(?:#.*)?$", line):
            in_list = True
        elif in_list:
            item = re.match(r"^\s*-\s+(.+?)\s*(?:\s#.*)?$", line)
            if item:
                patterns.append(item.group(1).strip("\"'"))
            elif line.strip() and not line.lstrip().startswith("#"):
                break
    return patterns


def in_build(path: str, patterns: Sequence[str]) -> bool:
    """Whether `ansible-galaxy collection build` keeps path: neither it nor a directory above it matches a
    build_ignore pattern (fnmatch on the path relative to the collection root, as ansible-galaxy does)."""
    parts = path.split("/")
    candidates = ["/".join(parts[:end]) for end in range(1, len(parts) + 1)]
    return not any(fnmatch.fnmatchcase(candidate, pattern) for candidate in candidates for pattern in patterns)


def ansible_test_pip_version() -> Optional[str]:
    """The pip version ansible-test bootstraps its virtualenvs with (python_requirements.get_venv_packages)."""
    spec = importlib.util.find_spec("ansible_test")
    if spec is None or not spec.submodule_search_locations:
        return None
    source = Path(list(spec.submodule_search_locations)[0], "_internal", "python_requirements.py")
    match = re.search(r"\bpip='([0-9][0-9.]*)'", source.read_text(encoding="utf-8")) if source.exists() else None
    return match.group(1) if match else None


def ensure_pip_bootstrap(python: str) -> None:
    """Make sure ansible-test's get-pip cache file exists: the official script if it can be downloaded, else a
    stand-in that runs the same pip from its PyPI wheel (ansible-test's own advice when the download fails is to put
    the script at that path by hand)."""
    version = ansible_test_pip_version()
    if version is None:
        return  # unknown layout: leave it to ansible-test
    cache = Path.home() / ".ansible" / "test" / "cache"
    script = cache / ("get_pip_%s.py" % version.replace(".", "_"))
    if script.exists():
        match = re.search(r"^WHEEL = '([^']+)'$", script.read_text(encoding="utf-8"), re.MULTILINE)
        if match is None or Path(match.group(1)).exists():
            return  # the official script, or a stand-in whose wheel is still there
    cache.mkdir(parents=True, exist_ok=True)
    url = GET_PIP_URL.format(version=version)
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            script.write_bytes(response.read())
        return
    except OSError as exc:
        print("run.py: %s: %s; using pip %s's wheel from PyPI instead" % (url, exc, version), flush=True)
    wheels = cache / "pip-wheels"
    subprocess.run([python, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", "--dest",
                    str(wheels), "pip==%s" % version], check=True)
    wheel = next(wheels.glob("pip-%s-*.whl" % version))
    script.write_text(GET_PIP_STAND_IN.format(writer="tests/sanity/run.py", url=url, version=version,
                                              wheel=str(wheel), wheel_dir=str(wheels)), encoding="utf-8")


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--cache", type=Path, help="scratch directory (default: .cache/sanity in the checkout)")
    parser.add_argument("--test", action="append", help="a sanity test to run instead of the defaults (repeatable)")
    parser.add_argument("--all-files", action="store_true",
                        help="test every copied file, also those galaxy.yml's build_ignore leaves out of the collection")
    parser.add_argument("extra", nargs="*", help="after --: more ansible-test options")
    return parser.parse_args(argv)


def main(argv: Sequence[str]) -> int:
    started = time.monotonic()
    options = parse_args(argv)
    root = git_root(Path(__file__).resolve().parent)
    namespace, name = collection_name(root)
    cache = (options.cache or root / ".cache" / "sanity").absolute()
    content = cache / "ansible_collections" / namespace / name
    if root.resolve().is_relative_to(cache.resolve()) or (
            cache.is_dir() and any(entry.name != "ansible_collections" for entry in cache.iterdir())):
        raise SystemExit("run.py: %s holds more than a scratch tree of this script's; choose another --cache" % cache)
    shutil.rmtree(cache, ignore_errors=True)
    paths = checkout_files(root)
    left_out = copy_tree(root, paths, content)
    if left_out:
        print("run.py: not copied (symlinks out of the checkout): %s" % ", ".join(left_out), flush=True)

    python = sys.executable
    bin_dir = str(Path(python).parent)
    ansible_test = shutil.which("ansible-test", path=bin_dir) or shutil.which("ansible-test")
    if ansible_test is None:
        raise SystemExit("run.py: ansible-test not found next to %s or in PATH" % python)
    ensure_pip_bootstrap(python)

    version = "%d.%d" % sys.version_info[:2]
    tests = options.test or list(TESTS)
    command = [ansible_test, "sanity", "--local", "--python", version]
    for test in tests:
        command += ["--test", test]
    command += options.extra
    copied = [path for path in paths if path not in left_out]
    if options.all_files:
        targets = copied
    else:
        patterns = build_ignore_patterns(root)
        targets = [path for path in copied if in_build(path, patterns) or path.startswith(ALWAYS_TESTED)]
        if len(targets) < len(copied):
            command += targets
    env = dict(os.environ, PATH=os.pathsep.join([bin_dir, os.environ.get("PATH", os.defpath)]),
               # The scratch tree lies inside this (ignored) checkout: without this ansible-test would take its file
               # list from the checkout's git, which ignores the copy.
               ANSIBLE_TEST_CONTENT_ROOT=str(content))
    print("run.py: %d files copied to %s, %d of them tested%s" % (
        len(copied), content, len(targets), "" if len(targets) == len(copied) else
        " (galaxy.yml's build_ignore leaves out the rest; --all-files tests them too)"), flush=True)
    rc = subprocess.run(command, cwd=content, env=env, check=False).returncode
    print("sanity %s: rc=%d, %d tests, Python %s, %s.%s, %.1fs" % (
        "passed" if rc == 0 else "FAILED", rc, len(tests), version, namespace, name, time.monotonic() - started))
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
