#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)
"""Collect what debugging a GPU node needs, read-only, in one round trip."""

from __future__ import absolute_import, annotations, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: gpu_diagnose_node
short_description: Collect what debugging a GPU node needs (read-only)
description:
  - Runs the read-only commands and reads the files a person debugging a GPU node asks for, and returns each as text
    under a file name for the diagnose archive; changes nothing on the host, in either mode.
  - C(nvidia-smi) (its table), the driver and kernel module versions (C(/proc/driver/nvidia/version),
    C(/sys/module/nvidia/version), C(modinfo -F version nvidia)), the running kernel, the installed NVIDIA packages,
    containerd's own view of its configuration (C(containerd config dump)) and version, every CDI spec in
    O(cdi_dirs), the journal tails of O(journal_units), and the tails of the container logs under
    C(/var/log/containers) whose names contain one of O(container_log_names) (the device plugin's and exporter's own
    output, readable on the node even when the API server cannot reach the kubelet).
  - A command that is missing or fails is recorded with its exit status and output, never a failure of the task.
options:
  line_count:
    description: Lines kept from the end of each journal and container log.
    type: int
    default: 200
  cdi_dirs:
    description: Directories whose CDI specs (C(*.yaml), C(*.yml), C(*.json)) are collected.
    type: list
    elements: path
    default: [/etc/cdi, /var/run/cdi]
  journal_units:
    description: systemd units whose journal tails are collected.
    type: list
    elements: str
    default: [containerd, kubelet]
  container_log_names:
    description: Substrings of the container log file names under C(/var/log/containers) that are collected.
    type: list
    elements: str
    default: [nvidia-device-plugin, dcgm-exporter]
  timeout:
    description: Seconds each command may run.
    type: int
    default: 30
notes:
  - Supports check mode; the module makes no changes in either mode.
author:
  - GPU platform team (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Collect the node's GPU, driver, runtime and CDI state
  gpu_ops.cluster.gpu_diagnose_node:
    line_count: 500
  register: node_diagnose
"""

RETURN = r"""
files:
  description: File name in the archive (under nodes/<host>/) to its text; each command's text starts with the command
    and its exit status.
  returned: always
  type: dict
  sample: {"nvidia-smi.txt": "$ nvidia-smi\n(exit 0)\n..."}
"""

import glob
import os
import shutil
from typing import Any, Callable, Dict, List, Sequence, Tuple

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpu_ops.cluster.plugins.module_utils.nvidia_gpu import run_with_timeout

CONTAINER_LOGS = "/var/log/containers"
FILE_LIMIT = 2 * 1024 * 1024


def build_argspec() -> Dict[str, Any]:
    return dict(
        line_count=dict(type="int", default=200),
        cdi_dirs=dict(type="list", elements="path", default=["/etc/cdi", "/var/run/cdi"]),
        journal_units=dict(type="list", elements="str", default=["containerd", "kubelet"]),
        container_log_names=dict(type="list", elements="str", default=["nvidia-device-plugin", "dcgm-exporter"]),
        timeout=dict(type="int", default=30),
    )


def command_text(argv: Sequence[str], runner: Callable[..., Any], timeout: float) -> str:
    """The command's output as one text, headed by the command and its exit status; a missing program is said so."""
    shown = " ".join(arg.replace("\n", "\\n") for arg in argv)
    if shutil.which(argv[0]) is None and not os.path.isabs(argv[0]):
        return "$ %s\n(not installed: %s is not on PATH)\n" % (shown, argv[0])
    result = runner(list(argv), timeout)
    status = "timed out after %ds" % timeout if getattr(result, "timed_out", False) else "exit %s" % result.rc
    output = (result.stdout or "") + (("\n" + result.stderr) if result.stderr else "")
    return "$ %s\n(%s)\n%s" % (shown, status, output if output.endswith("\n") or not output else output + "\n")


def read_text(path: str, tail_lines: int = 0) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - FILE_LIMIT))
            text = handle.read().decode("utf-8", "replace")
    except OSError as error:
        return "(cannot read %s: %s)\n" % (path, error.strerror or error)
    if tail_lines:
        text = "".join(text.splitlines(keepends=True)[-tail_lines:])
    return text


def safe_name(path: str) -> str:
    return path.strip("/").replace("/", "_")


def collect(params: Dict[str, Any], runner: Callable[..., Any] = run_with_timeout) -> Dict[str, str]:
    timeout = params["timeout"]
    lines = params["line_count"]
    files: Dict[str, str] = {}
    files["nvidia-smi.txt"] = command_text(["nvidia-smi"], runner, timeout)
    versions: List[str] = []
    for path in ("/proc/driver/nvidia/version", "/sys/module/nvidia/version"):
        versions.append("== %s\n%s" % (path, read_text(path) if os.path.exists(path) else "(absent)\n"))
    versions.append(command_text(["modinfo", "-F", "version", "nvidia"], runner, timeout))
    versions.append(command_text(["uname", "-r"], runner, timeout))
    if shutil.which("dpkg-query"):
        versions.append(command_text(["dpkg-query", "-W", "-f", "${Package} ${Version} ${db:Status-Abbrev}\n",
                                      "*nvidia*", "cuda-*"], runner, timeout))
    elif shutil.which("rpm"):
        versions.append(command_text(["rpm", "-qa", "*nvidia*", "cuda-*"], runner, timeout))
    files["driver-versions.txt"] = "\n".join(versions)
    files["containerd-config-dump.toml"] = command_text(["containerd", "config", "dump"], runner, timeout)
    files["containerd-version.txt"] = command_text(["containerd", "--version"], runner, timeout)
    for directory in params["cdi_dirs"]:
        specs = sorted(path for pattern in ("*.yaml", "*.yml", "*.json")
                       for path in glob.glob(os.path.join(directory, pattern)))
        if not specs:
            files["cdi/%s.txt" % safe_name(directory)] = "(no CDI spec in %s)\n" % directory
        for path in specs:
            files["cdi/%s" % safe_name(path)] = read_text(path)
    for unit in params["journal_units"]:
        files["journal/%s.txt" % unit] = command_text(
            ["journalctl", "--no-pager", "-o", "short-iso", "-n", str(lines), "-u", unit], runner, timeout)
    for path in sorted(glob.glob(os.path.join(CONTAINER_LOGS, "*.log"))):
        if any(name in os.path.basename(path) for name in params["container_log_names"]):
            files["container-logs/%s" % os.path.basename(path)] = read_text(path, lines)
    return files


def main() -> None:
    module = AnsibleModule(argument_spec=build_argspec(), supports_check_mode=True)
    problems: List[Tuple[str, Any]] = [(name, module.params[name]) for name in ("line_count", "timeout")
                                       if module.params[name] < 1]
    if problems:
        module.fail_json(msg="; ".join("%s=%r is not valid; allowed: an integer >= 1" % item for item in problems))
    module.exit_json(changed=False, files=collect(module.params))


if __name__ == "__main__":
    main()
