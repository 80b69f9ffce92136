# -*- coding: utf-8 -*-
# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)
"""Who owns the package repository entry that several node roles need (the nvidia_driver and cuda_toolkit roles both
install from NVIDIA's CUDA repository or a mirror of it): the one rule behind `<role>_repository: auto|own|external`.

apt refuses every source once two of them list one repository URL with different Signed-By keyrings ("Conflicting
values set for option Signed-By"), so under `auto` a role that finds another apt source listing its URL uses that
entry, and its keyring, as they are: it writes no entry or key of its own for that URL and touches no other file.
Two steps, because the host is read remotely and decided here: `search_spec` is host_probe's question (which other
files list the URL), `plan` decides from its answer.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Dict, List, Mapping, Optional, Sequence

MODES = ("auto", "own", "external")

# Where apt reads its sources, and the file names it reads there (one-line .list files, deb822 .sources files).
SOURCE_DIRS = ("/etc/apt", "/etc/apt/sources.list.d")
SOURCE_PATTERNS = ("sources.list", "*.list", "*.sources")


def _url(repository: Optional[Mapping[str, Any]]) -> str:
    return str((repository or {}).get("url") or "")


def url_line_pattern(url: str) -> str:
    """A regular expression for a line that lists the URL: in a one-line entry (`deb [signed-by=...] URL suite`) or a
    deb822 `URIs:` field, not commented out, with any number of trailing slashes (`.../x86_64` and `.../x86_64/`
    name the same repository)."""
    return r"^[^#]*" + re.escape(url.rstrip("/")) + r"/*(\s.*)?$"


def shared(repository: Optional[Mapping[str, Any]], package_manager: str) -> bool:
    """Whether another source of the same URL can conflict with the role's own entry.

    Only apt compares the keyrings of sources. And only an entry the role signs with its own key can conflict: one
    signed by a keyring it names (the distribution's archive keyring) is signed alike by every file that lists it."""
    return package_manager == "apt" and bool(_url(repository)) and not (repository or {}).get("keyring")


def search_spec(repository: Optional[Mapping[str, Any]], mode: str, package_manager: str,
                sources_file: str) -> Dict[str, Any]:
    """host_probe's `search` option: the other apt source files that list the role's repository URL (its own
    sources file excluded). Empty when nothing is asked: no shared repository, or `own` (then the answer is not
    needed)."""
    _check_mode(mode)
    if mode == "own" or not shared(repository, package_manager):
        return {}
    return {"repository": {"paths": list(SOURCE_DIRS), "patterns": list(SOURCE_PATTERNS),
                           "excludes": [os.path.basename(sources_file)],
                           "contains": url_line_pattern(_url(repository))}}


# Ansible's architecture fact -> Debian's name for it (binary-<arch> in a repository's dists tree).
DEBIAN_ARCHITECTURES = {"x86_64": "amd64", "aarch64": "arm64", "ppc64le": "ppc64el", "s390x": "s390x"}


def index_spec(repository: Optional[Mapping[str, Any]], package_manager: str, names: Sequence[str],
               prefixes: Sequence[str] = (), architecture: str = "x86_64") -> Dict[str, Any]:
    """host_probe's `index` option: the URLs of the repository's own Packages index (a flat repository, suite `/`, has
    it at its root, as NVIDIA's CUDA repositories do; otherwise dists/<suite>/<component>/binary-<arch>/) and the
    package names to look for. Empty where apt is not the package manager or there is no repository URL."""
    url = _url(repository)
    if package_manager != "apt" or not url or not names:
        return {}
    base = url.rstrip("/") + "/"
    suites = list((repository or {}).get("suites") or ["/"])
    urls: List[str] = []
    for suite in suites:
        if suite == "/" or suite.endswith("/"):
            root = base if suite == "/" else base + suite.lstrip("/")
            urls.extend([root + "Packages.gz", root + "Packages"])
            continue
        arch = DEBIAN_ARCHITECTURES.get(architecture, architecture)
        for component in (repository or {}).get("components") or []:
            root = "%sdists/%s/%s/binary-%s/" % (base, suite, component, arch)
            urls.extend([root + "Packages.gz", root + "Packages"])
    return {"urls": urls, "names": [str(name) for name in names], "prefixes": [str(prefix) for prefix in prefixes]}


def index_problems(index: Optional[Mapping[str, Any]], names: Sequence[str], variable: str, value: Any,
                   offered_pattern: str = "") -> List[str]:
    """A refusal when the repository's index was read and lacks a package the selection installs, naming the input
    (variable=value), the index and, with offered_pattern (a regex whose group 1 is a branch), what it does offer.
    Nothing when the index was not read (skipped, or unreachable: apt may reach it another way)."""
    index = index or {}
    if index.get("skipped", True) or index.get("problem") or not index.get("url"):
        return []
    have = set(index.get("names") or [])
    missing = [name for name in names if name not in have]
    if not missing:
        return []
    offered = ""
    if offered_pattern:
        pattern = re.compile(offered_pattern)
        found = sorted({match.group(1) for match in map(pattern.match, have) if match},
                       key=lambda branch: (len(branch), branch))
        offered = "; offered there: %s" % (", ".join(found) or "none")
    named = variable if value is None else "%s=%s" % (variable, json.dumps(value))
    return ["%s is not offered by the repository: its index %s has no %s%s." % (
        named, index["url"], ", ".join(missing), offered)]


def plan(probe: Optional[Mapping[str, Any]], repository: Optional[Mapping[str, Any]], mode: str,
         package_manager: str, key_file: str, sources_file: str, key_url: str = "", role: str = "") -> Dict[str, Any]:
    """What the role does with its own repository entry, from host_probe's answer.

    Returns:
      own: the role writes its own entry (and key, when it has a key URL)
      used: the other files whose entry the role uses instead (under auto); never changed by the role
      key, sources: the state of the role's own key and sources file, present or absent
      work: apt only: the own key or sources file differs from that state (a write is needed)
      message: what the role reports when the entry is not its own; empty when it is
    """
    _check_mode(mode)
    probe = probe or {}
    url = _url(repository)
    found: List[str] = list(((probe.get("search") or {}).get("repository")) or []) if shared(
        repository, package_manager) and mode != "own" else []
    if not url or mode == "external":
        own = False
    elif mode == "own":
        own = True
    else:
        own = not found
    used = found if url and not own else []
    own_key = own and bool(key_url)
    files = probe.get("files") or {}
    differ = set(probe.get("differ") or [])
    if own:
        # The probe compared both files with what the role writes: a write is needed where one differs.
        work = bool(differ & {key_file, sources_file})
    else:
        work = any((files.get(path) or {}).get("exists") for path in (key_file, sources_file))
    return {"own": own, "used": used, "key": "present" if own_key else "absent",
            "sources": "present" if own else "absent", "work": package_manager == "apt" and work,
            "message": _message(role, mode, url, own, used, shared(repository, package_manager))}


def _message(role: str, mode: str, url: str, own: bool, used: Sequence[str], searched: bool) -> str:
    if own or not url:
        return ""
    setting = "%s_repository=%s" % (role, mode) if role else "repository=%s" % mode
    if used:
        return ("%s is configured in %s; %s uses that entry and adds none of its own (%s)."
                % (url, ", ".join(used), role or "the role", setting))
    return ("%s: %s adds no entry for %s; another owner must configure it%s."
            % (setting, role or "the role", url, " (no other apt source on this host lists it yet)" if searched else ""))


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError("repository mode %r is not one of %s" % (mode, ", ".join(MODES)))
