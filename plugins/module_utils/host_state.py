# -*- coding: utf-8 -*-
# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)
"""What the node modules read on a host: dpkg's packages and apt's indexes (host_probe), and how a file the caller owns
differs from the wanted one (host_files writes it, host_probe only compares)."""

from __future__ import annotations

import grp
import gzip
import hashlib
import os
import pwd
import re
import stat
from typing import Callable, Dict, List, Optional, Tuple

from ansible.module_utils.common.text.converters import to_bytes, to_text
from ansible.module_utils.urls import open_url
from ansible_collections.gpu_ops.cluster.plugins.module_utils.nvidia_driver import gather_driver_facts

# Packages ----------------------------------------------------------------------------------------------------------

QUERY_FORMAT = "${Package}\\t${Version}\\t${Architecture}\\t${Status}\\n"
# Every compression apt may keep an index in (Acquire::CompressionTypes); InRelease, Translation, Sources and
# Components files are not indexes of binary packages, and partial/ holds unfinished downloads.
INDEX = re.compile(r"_Packages(\.(lz4|gz|xz|zst|bz2|lzma))?$")
# dpkg's settled package states; any other (unpacked, half-configured, ...) is a change dpkg did not finish.
SETTLED = {"installed", "config-files", "not-installed"}


def parse_query(text: str) -> Tuple[Dict[str, List[Dict[str, str]]], List[str], List[str]]:
    """(packages in package_facts' format, held packages, packages between states) from lines of QUERY_FORMAT.

    Only installed packages count (status "install ok installed" or "hold ok installed"); a removed package whose
    configuration files remain ("deinstall ok config-files") is not installed, as package_facts has it too.
    """
    packages: Dict[str, List[Dict[str, str]]] = {}
    held: List[str] = []
    pending: List[str] = []
    for line in text.splitlines():
        fields = line.split("\t")
        if len(fields) != 4:
            continue
        name, version, arch, status = fields
        words = status.split()
        if len(words) == 3 and words[2] not in SETTLED:
            pending.append("%s %s" % (name, words[2]))
        if len(words) != 3 or words[2] != "installed":
            continue
        packages.setdefault(name, []).append({"name": name, "version": version, "arch": arch, "source": "apt"})
        if words[0] == "hold" and name not in held:
            held.append(name)
    return packages, held, pending


def journal_entries(dpkg_dir: str) -> int:
    """Files in dpkg's journal (updates/): dpkg writes them as it goes and folds them in when it finishes."""
    try:
        return sum(1 for name in os.listdir(os.path.join(dpkg_dir, "updates")) if name.isdigit())
    except FileNotFoundError:
        return 0


def count_indexes(lists_dir: str) -> int:
    """Package index files directly in apt's list directory (none when it does not exist)."""
    try:
        names = os.listdir(lists_dir)
    except FileNotFoundError:
        return 0
    return sum(1 for name in names if INDEX.search(name) and os.path.isfile(os.path.join(lists_dir, name)))


def apt_state(query_output: str, lists_dir: str, dpkg_dir: str) -> Dict:
    """held, indexes, lists_empty, dpkg_interrupted, dpkg_pending and packages (package_facts' format)."""
    packages, held, pending = parse_query(query_output)
    indexes = count_indexes(lists_dir)
    return {"held": held, "indexes": indexes, "lists_empty": indexes == 0,
            "dpkg_interrupted": bool(pending) or journal_entries(dpkg_dir) > 0, "dpkg_pending": pending,
            "packages": packages}


# A repository's own package index ------------------------------------------------------------------------------------

def index_names(text: str, names: List[str], prefixes: List[str]) -> List[str]:
    """The package names of a Packages index (its `Package:` fields) that are in names or start with a prefix."""
    wanted, found = set(names), set()
    for line in text.splitlines():
        if line.startswith("Package:"):
            name = line[len("Package:"):].strip()
            if name in wanted or any(name.startswith(prefix) for prefix in prefixes):
                found.add(name)
    return sorted(found)


def read_index(spec: Dict, installed: Dict, timeout: int, fetcher: Callable[[str, int], bytes] = None) -> Dict:
    """host_probe's `index`: which of spec's names (and names with its prefixes) the repository's Packages index has,
    read from the repository itself, so apt's lists on the host (absent before the first install, stale later) play
    no part. Skipped when every name is installed already (a no-op run asks the network nothing). The first of
    spec's URLs that answers is read (Packages.gz, then Packages); none answering is a problem, never a refusal by
    itself: apt may reach the repository through a proxy of its own."""
    names = [str(name) for name in spec.get("names") or []]
    if not names or all(name in installed for name in names):
        return {"skipped": True, "url": "", "names": [], "problem": ""}
    fetcher = fetcher or fetch
    failures = []
    for url in spec.get("urls") or []:
        try:
            body = fetcher(url, timeout)
            if url.endswith(".gz"):
                body = gzip.decompress(body)
        except Exception as exc:  # pylint: disable=broad-except
            failures.append("%s: %s" % (url, to_text(exc)))
            continue
        text = to_text(body, errors="surrogate_or_replace")
        return {"skipped": False, "url": url, "names": index_names(text, names, list(spec.get("prefixes") or [])),
                "problem": ""}
    return {"skipped": False, "url": "", "names": [], "problem": "; ".join(failures) or "no index URL"}


# Files -------------------------------------------------------------------------------------------------------------

ARMOR_HEADER = b"-----BEGIN PGP PUBLIC KEY BLOCK-----"

FILE_OPTIONS = {
    "path": {"type": "path", "required": True},
    "state": {"type": "str", "choices": ["present", "absent"], "default": "present"},
    "content": {"type": "str"},
    "url": {"type": "str"},
    "expect": {"type": "str", "choices": ["any", "openpgp_armored_key"], "default": "any"},
    "inputs": {"type": "list", "elements": "str", "default": []},
    "owner": {"type": "str", "default": "root"},
    "group": {"type": "str", "default": "root"},
    "mode": {"type": "str", "default": "0644"},
}


class FileProblem(Exception):
    """An entry that cannot be planned; the message names the entry and what is wrong."""


def read_current(path: str) -> Tuple[Optional[bytes], Optional[os.stat_result]]:
    """(content, stat) of a regular file, (None, None) when it does not exist."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None, None
    if not stat.S_ISREG(info.st_mode):
        return None, info
    with open(path, "rb") as handle:
        return handle.read(), info


def owner_ids(owner: str, group: str) -> Tuple[int, int]:
    uid = int(owner) if owner.isdigit() else pwd.getpwnam(owner).pw_uid
    gid = int(group) if group.isdigit() else grp.getgrnam(group).gr_gid
    return uid, gid


def differences(want: bytes, mode: int, uid: int, gid: int, content: Optional[bytes],
                info: Optional[os.stat_result]) -> List[str]:
    """Why the file on the host is not the wanted one (empty: it is)."""
    if info is None:
        return ["missing"]
    if not stat.S_ISREG(info.st_mode):
        return ["not a regular file"]
    reasons = []
    if hashlib.sha256(content or b"").digest() != hashlib.sha256(want).digest():
        reasons.append("content differs")
    if stat.S_IMODE(info.st_mode) != mode:
        reasons.append("mode %04o, wanted %04o" % (stat.S_IMODE(info.st_mode), mode))
    if (info.st_uid, info.st_gid) != (uid, gid):
        reasons.append("owner %d:%d, wanted %d:%d" % (info.st_uid, info.st_gid, uid, gid))
    return reasons


def check_expectation(entry: Dict, body: bytes) -> Optional[str]:
    """A failure message when the content is not what the entry expects."""
    if entry["expect"] == "openpgp_armored_key" and ARMOR_HEADER not in body:
        source = entry.get("url") or "the given content"
        named = " (check %s)" % " / ".join(entry["inputs"]) if entry["inputs"] else ""
        return ("%s for %s is not an ASCII-armoured OpenPGP public key (it starts with %r)%s"
                % (source, entry["path"], to_text(body[:40], errors="replace"), named))
    return None


def fetch(url: str, timeout: int) -> bytes:
    return open_url(url, timeout=timeout).read()


def plan_file(entry: Dict, where: str, timeout: int, fetcher: Callable[[str, int], bytes] = fetch) -> Dict:
    """What writing the entry would do: {entry, before, info, reasons[, body, mode, uid, gid]}; reasons empty when the
    file is already as wanted. Raises FileProblem for an entry that cannot be written."""
    path = entry["path"]
    if not os.path.isabs(path):
        raise FileProblem("%s: path must be absolute" % where)
    content, info = read_current(path)
    if entry["state"] == "absent":
        return {"entry": entry, "before": content, "info": info, "reasons": ["present"] if info is not None else []}
    if entry["content"] is None and entry["url"] is None:
        raise FileProblem("%s: state=present needs content or url" % where)
    try:
        mode = int(entry["mode"], 8)
    except ValueError:
        raise FileProblem("%s: mode=%r is not an octal mode such as \"0644\"" % (where, entry["mode"]))
    try:
        uid, gid = owner_ids(entry["owner"], entry["group"])
    except KeyError:
        raise FileProblem("%s: owner %r or group %r does not exist on this host" % (where, entry["owner"], entry["group"]))
    if entry["url"] is not None:
        try:
            body = fetcher(entry["url"], timeout)
        except Exception as error:  # pylint: disable=broad-except
            named = " (%s)" % " / ".join(entry["inputs"]) if entry["inputs"] else ""
            raise FileProblem("Could not fetch %s%s for %s: %s. Nothing was written: check that the server is up"
                              " and reachable from this host, or the URL." % (entry["url"], named, path, error))
    else:
        body = to_bytes(entry["content"])
    problem = check_expectation(entry, body)
    if problem:
        raise FileProblem(problem)
    return {"entry": entry, "before": content, "info": info, "body": body, "mode": mode, "uid": uid, "gid": gid,
            "reasons": differences(body, mode, uid, gid, content, info)}


# The NVIDIA driver ---------------------------------------------------------------------------------------------------

# Parsers match English output.
C_LOCALE = {"LC_ALL": "C", "LANG": "C"}


def is_live_root(root: str) -> bool:
    return os.path.realpath(root) == "/"


def run_if_installed(module, command: List[str]) -> Optional[Tuple[int, str, str]]:
    """Run a read-only host command; None when it is not installed."""
    binary = module.get_bin_path(command[0])
    if binary is None:
        return None
    return module.run_command([binary] + command[1:], check_rc=False, environ_update=C_LOCALE)


def modinfo_command(root: str, kernel_release: str) -> List[str]:
    command = ["modinfo", "-F", "version", "-k", kernel_release]
    if not is_live_root(root):
        command += ["-b", root]
    return command + ["nvidia"]


def installed_version_output(module, root: str, kernel_release: str) -> Optional[str]:
    result = run_if_installed(module, modinfo_command(root, kernel_release))
    if result is None or result[0] != 0:
        return None
    return result[1]


def secure_boot_output(module, root: str) -> Optional[str]:
    # mokutil reads the live firmware, so it says nothing about another root.
    if not is_live_root(root):
        return None
    result = run_if_installed(module, ["mokutil", "--sb-state"])
    if result is None:
        return None
    # mokutil exits non-zero on hosts without Secure Boot and says so on either stream; the text is the answer.
    return result[1] + "\n" + result[2]


def driver_facts(module, root: str, state_file: str) -> Tuple[Dict, List[str]]:
    """ansible_facts.nvidia_driver of this host (nvidia_driver_info, host_probe's driver=true) and warnings."""
    kernel_release = os.uname().release
    return gather_driver_facts(root=root, kernel_release=kernel_release, state_file=state_file,
                               modinfo=lambda: installed_version_output(module, root, kernel_release),
                               mokutil=lambda: secure_boot_output(module, root))
