#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: host_probe
short_description: Answer every question a node role asks the host before it changes anything, in one read-only task
description:
  - A node role's no-op run is mostly reads (is the package installed, does the file match, where does this link
    point, what does this command print), each a remote round trip when asked by its own task. This module answers
    all of them at once, changing nothing, so that a role asks the host once and runs a writing task only where the
    answer says something differs.
  - O(apt) reads dpkg's packages (in the format of M(ansible.builtin.package_facts)), holds, whether apt has package
    indexes and whether dpkg was interrupted. O(driver) reads the NVIDIA driver state as
    M(gpu_ops.cluster.nvidia_driver_info) does. O(files) compares files with what M(gpu_ops.cluster.host_files) would
    write (same entries), without writing. O(containerd) plans the NVIDIA runtime's containerd drop-in as
    M(gpu_ops.cluster.nvidia_containerd_runtime) does in check mode (containerd's own config dump included).
    O(binaries), O(commands), O(paths), O(search) and O(units) answer the rest.
  - Read-only; runs in check mode.
options:
  apt:
    description: Read dpkg's installed packages and holds and apt's package indexes (RV(apt), C(ansible_facts.packages)).
    type: bool
    default: false
  driver:
    description: Read the NVIDIA driver state (C(ansible_facts.nvidia_driver), as M(gpu_ops.cluster.nvidia_driver_info)).
    type: bool
    default: false
  driver_state_file:
    description: The state file the driver role records (read with O(driver)).
    type: path
    default: /etc/ansible/facts.d/nvidia_driver.fact
  files:
    description: >-
      Files as M(gpu_ops.cluster.host_files) takes them (same suboptions); each is compared, never written. A URL
      is fetched to compare its content; a fetch that fails or content that is not what O(files[].expect) says
      counts as a difference (RV(files)), and the writing task then fails with the reason.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: Absolute path of the file.
        type: path
        required: true
      state:
        description: V(present) compares with the wanted file, V(absent) asks whether the file is there.
        type: str
        choices: [present, absent]
        default: present
      content:
        description: The whole wanted content.
        type: str
      url:
        description: Fetch the wanted content from this URL on the host.
        type: str
      expect:
        description: What the content must be (V(openpgp_armored_key)); anything else counts as a difference.
        type: str
        choices: [any, openpgp_armored_key]
        default: any
      inputs:
        description: The inputs the content or URL came from, named in the reason.
        type: list
        elements: str
        default: []
      owner:
        description: Wanted owner.
        type: str
        default: root
      group:
        description: Wanted group.
        type: str
        default: root
      mode:
        description: Wanted mode, an octal string.
        type: str
        default: "0644"
  binaries:
    description: Executables looked up in PATH (RV(binaries)).
    type: list
    elements: str
    default: []
  commands:
    description: Read-only commands to run, by name (a name to an argv list); run in the C locale (RV(commands)).
    type: dict
    default: {}
  kernel_commands:
    description: >-
      Like O(commands), for questions that only mean something where the host owns its kernel (kernel headers): run
      only when O(driver) finds the host is not a container; otherwise each answers C(rc) null and C(skipped) true.
    type: dict
    default: {}
  containerd:
    description: >-
      Plan the NVIDIA runtime's containerd drop-in (the parameters of M(gpu_ops.cluster.nvidia_containerd_runtime),
      which writes it) and have containerd dump the planned config, changing nothing (RV(containerd)).
    type: dict
    suboptions:
      config_path:
        description: containerd's main config file.
        type: path
        default: /etc/containerd/config.toml
      drop_in_path:
        description: The drop-in that defines the runtime.
        type: path
        default: /etc/containerd/conf.d/99-nvidia.toml
      containerd_binary:
        description: The containerd executable (name in PATH or path).
        type: path
        default: containerd
      runtime_name:
        description: Name of the runtime in containerd.
        type: str
        default: nvidia
      runtime_binary:
        description: The runtime's executable.
        type: path
        default: /usr/bin/nvidia-container-runtime
      set_as_default:
        description: Whether the runtime becomes containerd's default.
        type: bool
        default: false
      systemd_cgroup:
        description: SystemdCgroup of the runtime (V(auto) follows runc's).
        type: str
        choices: [auto, "true", "false"]
        default: auto
      take_over:
        description: Plan to replace another owner's file at the drop-in's path and override its runtime definition.
        type: bool
        default: false
  paths:
    description: Paths to look at, by name (RV(paths)).
    type: dict
    default: {}
  search:
    description: >-
      Files to search, by name: each a dict of C(paths) (directories), C(patterns) (shell patterns of file names),
      C(excludes) (file names to skip) and C(contains) (a regular expression matched against each line); RV(search)
      lists the files with a matching line.
    type: dict
    default: {}
  units:
    description: systemd units whose load, enablement and activity to read (RV(units)).
    type: list
    elements: str
    default: []
  index:
    description: >-
      A repository's own Packages index, read over the network from the host (C(Packages.gz) is decompressed): which
      of O(index.names), and of the names starting with one of O(index.prefixes), it has (RV(index)). The first URL
      that answers is read. Nothing is fetched when every name is installed already (needs O(apt)).
    type: dict
    suboptions:
      urls:
        description: The index's URLs, in the order to try them.
        type: list
        elements: str
        default: []
      names:
        description: Package names to look for.
        type: list
        elements: str
        default: []
      prefixes:
        description: Name prefixes whose packages to list as well.
        type: list
        elements: str
        default: []
  timeout:
    description: Seconds to wait for each URL.
    type: int
    default: 30
notes:
  - Supports check mode (it changes nothing).
author:
  - GPU platform team (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Ask the host everything the role needs to know
  gpu_ops.cluster.host_probe:
    apt: true
    files:
      - path: /etc/modprobe.d/blacklist-nouveau.conf
        content: "{{ lookup('ansible.builtin.template', 'blacklist-nouveau.conf.j2') }}"
    commands:
      nvcc: [/usr/local/cuda/bin/nvcc, --version]
    paths:
      home: /usr/local/cuda
    units: [nvidia-persistenced.service]
  register: probe
"""

RETURN = r"""
apt:
  description: With O(apt), what M(gpu_ops.cluster.host_probe) read of dpkg and apt.
  returned: when apt is true
  type: dict
  contains:
    held:
      description: Installed packages whose dpkg selection is C(hold).
      type: list
      elements: str
    indexes:
      description: How many package index files apt has.
      type: int
    lists_empty:
      description: True when apt has no package index.
      type: bool
    dpkg_interrupted:
      description: True when dpkg was interrupted (its journal is not empty, or a package is between states).
      type: bool
    dpkg_pending:
      description: The packages dpkg left between states (name and state).
      type: list
      elements: str
files:
  description: Per path of O(files), whether it exists and why it is not as wanted (empty when it is).
  returned: always
  type: dict
  sample:
    /etc/modprobe.d/blacklist-nouveau.conf: {"exists": true, "reason": "content differs"}
differ:
  description: The paths of O(files) that a write would change, in the order given.
  returned: always
  type: list
  elements: str
binaries:
  description: Per name of O(binaries), its path in PATH, or null.
  returned: always
  type: dict
commands:
  description: >-
    Per name of O(commands), C(rc), C(stdout) and C(stderr); C(rc) is null when the executable is missing. Trailing
    line ends are stripped, as M(ansible.builtin.command) does.
  returned: always
  type: dict
containerd:
  description: >-
    With O(containerd): C(config_changed) and C(drop_in_changed) (what a write would change), C(containerd_major),
    C(containerd_version), C(config_version), C(systemd_cgroup), C(dump_checked), and C(problem), the reason the
    module would refuse (empty when none).
  returned: when containerd is set
  type: dict
paths:
  description: >-
    Per name of O(paths), C(exists), C(type) (file, link, directory, other), C(target) (where a link resolves to),
    C(mode), C(uid), C(gid) and, for a regular file of at most 1 MiB, its C(content) as text.
  returned: always
  type: dict
search:
  description: Per name of O(search), the files with a matching line.
  returned: always
  type: dict
units:
  description: Per unit of O(units), C(load_state), C(unit_file_state) and C(active_state) as systemd has them.
  returned: always
  type: dict
index:
  description: >-
    With O(index): C(skipped) (every name installed, nothing fetched), C(url) (the index read), C(names) (the names
    asked for, and with a prefix, that it has) and C(problem) (why no URL answered; empty otherwise).
  returned: when index is set
  type: dict
ansible_facts:
  description: C(packages) with O(apt) (as M(ansible.builtin.package_facts)), C(nvidia_driver) with O(driver).
  returned: when apt or driver is true
  type: dict
"""

import fnmatch
import os
import re
import stat
from typing import Dict, List

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.text.converters import to_text
from ansible_collections.gpu_ops.cluster.plugins.module_utils.host_state import (
    C_LOCALE, FILE_OPTIONS, QUERY_FORMAT, FileProblem, apt_state, driver_facts, plan_file, read_index,
)
from ansible_collections.gpu_ops.cluster.plugins.module_utils.container_runtime import ConfigError
from ansible_collections.gpu_ops.cluster.plugins.module_utils.containerd_plan import PLAN_OPTIONS, plan_runtime
from ansible_collections.gpu_ops.cluster.plugins.module_utils.nvidia_driver import DEFAULT_STATE_FILE

MAX_CONTENT = 1024 * 1024


def look_at(path: str) -> Dict:
    try:
        info = os.lstat(path)
    except OSError:
        return {"exists": False, "type": None, "target": None, "mode": None, "uid": None, "gid": None,
                "content": None}
    kind = ("link" if stat.S_ISLNK(info.st_mode) else "file" if stat.S_ISREG(info.st_mode)
            else "directory" if stat.S_ISDIR(info.st_mode) else "other")
    content = None
    if kind == "file" and info.st_size <= MAX_CONTENT:
        try:
            with open(path, "rb") as handle:
                content = to_text(handle.read(), errors="surrogate_or_replace")
        except OSError:
            content = None
    return {"exists": True, "type": kind, "target": os.path.realpath(path) if kind == "link" else None,
            "mode": "%04o" % stat.S_IMODE(info.st_mode), "uid": info.st_uid, "gid": info.st_gid, "content": content}


def search_files(spec: Dict) -> List[str]:
    pattern = re.compile(spec.get("contains") or "")
    excludes = set(spec.get("excludes") or [])
    found = []
    for directory in spec.get("paths") or []:
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            continue
        for name in names:
            path = os.path.join(directory, name)
            if name in excludes or not os.path.isfile(path):
                continue
            if not any(fnmatch.fnmatch(name, glob) for glob in spec.get("patterns") or ["*"]):
                continue
            try:
                with open(path, encoding="utf-8", errors="replace") as handle:
                    if any(pattern.search(line.rstrip("\n")) for line in handle):
                        found.append(path)
            except OSError:
                continue
    return found


def read_units(module: AnsibleModule, units: List[str]) -> Dict[str, Dict]:
    answers = {unit: {"load_state": None, "unit_file_state": None, "active_state": None} for unit in units}
    systemctl = module.get_bin_path("systemctl")
    if not units or systemctl is None:
        return answers
    rc, out, _ = module.run_command([systemctl, "show", "--property=Id,LoadState,UnitFileState,ActiveState", "--"]
                                    + units, check_rc=False, environ_update=C_LOCALE)
    if rc != 0:
        return answers
    # One block per unit, in the order asked, separated by an empty line.
    for unit, block in zip(units, out.strip("\n").split("\n\n")):
        values = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        answers[unit] = {"load_state": values.get("LoadState") or None,
                         "unit_file_state": values.get("UnitFileState") or None,
                         "active_state": values.get("ActiveState") or None}
    return answers


def run_read_only(module: AnsibleModule, name: str, argv) -> Dict:
    if not isinstance(argv, list) or not argv:
        module.fail_json(msg="commands.%s must be a non-empty list of arguments, not %r" % (name, argv))
    argv = [str(word) for word in argv]
    binary = argv[0] if os.path.isabs(argv[0]) else module.get_bin_path(argv[0])
    if binary is None or not os.access(binary, os.X_OK):
        return {"rc": None, "stdout": "", "stderr": "%s: not found" % argv[0]}
    rc, out, err = module.run_command([binary] + argv[1:], check_rc=False, environ_update=C_LOCALE)
    # Trailing line ends stripped, as ansible.builtin.command returns them.
    return {"rc": rc, "stdout": out.rstrip("\r\n"), "stderr": err.rstrip("\r\n")}


def main() -> None:
    module = AnsibleModule(argument_spec={
        "apt": {"type": "bool", "default": False},
        "driver": {"type": "bool", "default": False},
        "driver_state_file": {"type": "path", "default": DEFAULT_STATE_FILE},
        "files": {"type": "list", "elements": "dict", "default": [], "options": FILE_OPTIONS,
                  "mutually_exclusive": [["content", "url"]]},
        "binaries": {"type": "list", "elements": "str", "default": []},
        "commands": {"type": "dict", "default": {}},
        "kernel_commands": {"type": "dict", "default": {}},
        "containerd": {"type": "dict", "options": PLAN_OPTIONS},
        "paths": {"type": "dict", "default": {}},
        "search": {"type": "dict", "default": {}},
        "units": {"type": "list", "elements": "str", "default": []},
        "index": {"type": "dict", "options": {
            "urls": {"type": "list", "elements": "str", "default": []},
            "names": {"type": "list", "elements": "str", "default": []},
            "prefixes": {"type": "list", "elements": "str", "default": []}}},
        "timeout": {"type": "int", "default": 30},
    }, supports_check_mode=True)
    params = module.params
    result: Dict = {"changed": False, "ansible_facts": {}}

    if params["apt"]:
        query = module.get_bin_path("dpkg-query", required=True)
        rc, out, err = module.run_command([query, "-W", "-f=" + QUERY_FORMAT])
        if rc != 0:
            module.fail_json(msg="dpkg-query failed: %s" % (err or out).strip(), rc=rc)
        state = apt_state(out, "/var/lib/apt/lists", "/var/lib/dpkg")
        result["ansible_facts"]["packages"] = state.pop("packages")
        result["apt"] = state

    if params["driver"]:
        facts, warnings = driver_facts(module, "/", params["driver_state_file"])
        for warning in warnings:
            module.warn(warning)
        result["ansible_facts"]["nvidia_driver"] = facts

    files, differ = {}, []
    for index, entry in enumerate(params["files"]):
        path = entry["path"]
        try:
            plan = plan_file(entry, "files[%d] (%s)" % (index, path), params["timeout"])
            reason = ", ".join(plan["reasons"])
        except FileProblem as problem:
            reason = str(problem)
        files[path] = {"exists": os.path.lexists(path), "reason": reason}
        if reason:
            differ.append(path)
    result.update(files=files, differ=differ)

    result["binaries"] = {name: module.get_bin_path(name) for name in params["binaries"]}

    in_container = result["ansible_facts"].get("nvidia_driver", {}).get("in_container")
    commands = {name: run_read_only(module, name, argv) for name, argv in params["commands"].items()}
    for name, argv in params["kernel_commands"].items():
        commands[name] = ({"rc": None, "stdout": "", "stderr": "", "skipped": True} if in_container is not False
                          else run_read_only(module, name, argv))
    result["commands"] = commands

    if params["containerd"] is not None:
        try:
            planned, _plan = plan_runtime(dict(params["containerd"], state="present", verify=True),
                                          module.run_command, module.get_bin_path)
            planned.pop("diff", None)
            planned.pop("changed", None)
            planned["problem"] = ""
        except ConfigError as exc:
            planned = {"config_changed": None, "drop_in_changed": None, "dump_checked": False, "problem": str(exc)}
        result["containerd"] = planned

    result["paths"] = {name: look_at(str(path)) for name, path in params["paths"].items()}
    result["search"] = {name: search_files(spec or {}) for name, spec in params["search"].items()}
    result["units"] = read_units(module, params["units"])
    if params["index"] is not None:
        result["index"] = read_index(params["index"], result["ansible_facts"].get("packages", {}), params["timeout"])
    module.exit_json(**result)


if __name__ == "__main__":
    main()
