#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: apt_state
short_description: Read a Debian host's installed packages, their holds and whether apt has package indexes, in one task
description:
  - One C(dpkg-query) for every installed package's version, architecture and selection, and one look at
    C(/var/lib/apt/lists) for package indexes (C(*_Packages), plain or compressed). Read-only; runs in check mode.
  - Sets C(ansible_facts.packages) in the format of M(ansible.builtin.package_facts) (V(apt) manager), so the tasks
    that read that fact need no change; answers what three tasks (package facts, a find of the indexes, a read of the
    dpkg selections) answered, in one remote round trip.
  - Container and cloud images delete their package lists but keep a fresh directory mtime, which the apt module takes
    for a fresh cache (C(cache_valid_time)); RV(lists_empty) tells the caller to refresh the index then.
options:
  lists_dir:
    description: apt's list directory.
    type: path
    default: /var/lib/apt/lists
  dpkg_dir:
    description: dpkg's administrative directory.
    type: path
    default: /var/lib/dpkg
notes:
  - Supports check mode (it changes nothing).
requirements:
  - dpkg
author:
  - GPU platform team (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Read the installed packages, their holds and whether apt has package indexes
  gpu_ops.cluster.apt_state:
  register: apt
"""

RETURN = r"""
held:
  description: Installed packages whose dpkg selection is C(hold).
  returned: always
  type: list
  elements: str
  sample: [nvidia-driver]
lists_empty:
  description: True when apt has no package index (C(apt-get update) has not run since the lists were deleted).
  returned: always
  type: bool
dpkg_interrupted:
  description: >-
    True when dpkg was interrupted (its journal under C(updates/) is not empty, or a package is unpacked but not
    configured, half-installed or waiting for triggers): apt refuses to work until C(dpkg --configure -a) has run.
  returned: always
  type: bool
dpkg_pending:
  description: The packages dpkg left between states (name and state).
  returned: always
  type: list
  elements: str
  sample: ["nvidia-smi half-configured"]
indexes:
  description: How many package index files apt has.
  returned: always
  type: int
ansible_facts:
  description: C(packages), as M(ansible.builtin.package_facts) returns it (name to a list of installed versions).
  returned: always
  type: dict
  sample: {"packages": {"nvidia-smi": [{"name": "nvidia-smi", "version": "550.163.01-2", "arch": "amd64",
           "source": "apt"}]}}
"""

import os
import re
from typing import Dict, List, Tuple

from ansible.module_utils.basic import AnsibleModule

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


def main() -> None:
    module = AnsibleModule(argument_spec={"lists_dir": {"type": "path", "default": "/var/lib/apt/lists"},
                                          "dpkg_dir": {"type": "path", "default": "/var/lib/dpkg"}},
                           supports_check_mode=True)
    query = module.get_bin_path("dpkg-query", required=True)
    rc, out, err = module.run_command([query, "-W", "-f=" + QUERY_FORMAT])
    if rc != 0:
        module.fail_json(msg="dpkg-query failed: %s" % (err or out).strip(), rc=rc)
    packages, held, pending = parse_query(out)
    indexes = count_indexes(module.params["lists_dir"])
    interrupted = bool(pending) or journal_entries(module.params["dpkg_dir"]) > 0
    module.exit_json(changed=False, held=held, indexes=indexes, lists_empty=indexes == 0,
                     dpkg_interrupted=interrupted, dpkg_pending=pending, ansible_facts={"packages": packages})


if __name__ == "__main__":
    main()
