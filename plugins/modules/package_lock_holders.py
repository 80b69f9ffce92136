#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: package_lock_holders
short_description: Name the processes that hold the package manager's locks
description:
  - Read-only. Reads the kernel's table of file locks (C(/proc/locks)) and reports, for each lock file of O(paths)
    that exists, the processes holding a lock on it, with their command line.
  - The node roles call it when an apt task failed, so that a run stopped by another package manager (unattended
    upgrades, a person's C(apt-get), a cloud agent) says which process held the lock instead of apt's generic
    "Unable to acquire the dpkg frontend lock".
  - apt and dpkg take POSIX record locks (C(fcntl)); open file description locks are reported too, with the process
    that holds the file open.
options:
  paths:
    description: Lock files to look at; those that do not exist are skipped.
    type: list
    elements: path
    default:
      - /var/lib/dpkg/lock-frontend
      - /var/lib/dpkg/lock
      - /var/lib/apt/lists/lock
      - /var/cache/apt/archives/lock
notes:
  - Supports check mode; the module makes no changes in either mode.
  - A process in another PID namespace (another container sharing the file) is shown with the PID the kernel gives
    in this namespace, which may be 0.
author:
  - GPU platform team (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Find what holds the package manager's lock
  gpu_ops.cluster.package_lock_holders:
  register: lock

- name: Say who holds it
  ansible.builtin.debug:
    msg: "{{ lock.holders | map(attribute='summary') | join('; ') }}"
  when: lock.holders | length > 0
"""

RETURN = r"""
holders:
  description: One entry per lock held on one of O(paths).
  returned: always
  type: list
  elements: dict
  contains:
    path:
      description: The lock file.
      type: str
      sample: /var/lib/dpkg/lock-frontend
    pid:
      description: The holder's process ID (-1 when the kernel names none and no process has the file open).
      type: int
      sample: 1234
    command:
      description: The holder's command line (at most 200 characters), or its name when the command line is empty.
      type: str
      sample: /usr/bin/apt-get -y install unattended-upgrades
    kind:
      description: The lock's kind in C(/proc/locks) (POSIX, FLOCK, OFDLCK, ...).
      type: str
      sample: POSIX
    summary:
      description: One line for a person.
      type: str
      sample: /var/lib/dpkg/lock-frontend is held by process 1234 (/usr/bin/apt-get -y install unattended-upgrades)
"""

import os
from typing import Dict, List, Optional, Tuple

from ansible.module_utils.basic import AnsibleModule

COMMAND_LIMIT = 200


def parse_locks(text: str) -> List[Tuple[str, int, int, int, int]]:
    """(kind, pid, major, minor, inode) of every lock in /proc/locks' text (blocked waiters, lines with ->, skipped)."""
    locks = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 8 or fields[1] == "->":
            continue
        kind, pid, device = fields[1], fields[4], fields[5]
        parts = device.split(":")
        if len(parts) != 3:
            continue
        try:
            locks.append((kind, int(pid), int(parts[0], 16), int(parts[1], 16), int(parts[2])))
        except ValueError:
            continue
    return locks


def command_of(pid: int, proc: str = "/proc") -> str:
    try:
        with open(os.path.join(proc, str(pid), "cmdline"), "rb") as handle:
            command = " ".join(handle.read().replace(b"\0", b" ").decode("utf-8", "replace").split())
        if not command:
            with open(os.path.join(proc, str(pid), "comm"), "rb") as handle:
                command = "[%s]" % handle.read().decode("utf-8", "replace").strip()
    except OSError:
        return "unknown: the process is gone or cannot be read"
    return command if len(command) <= COMMAND_LIMIT else command[:COMMAND_LIMIT - 3] + "..."


def openers_of(path: str, proc: str = "/proc") -> List[int]:
    """Processes with path open (for locks the kernel shows without a PID: open file description locks)."""
    found = []
    try:
        pids = [int(name) for name in os.listdir(proc) if name.isdigit()]
    except OSError:
        return found
    for pid in pids:
        fd_dir = os.path.join(proc, str(pid), "fd")
        try:
            for fd in os.listdir(fd_dir):
                if os.readlink(os.path.join(fd_dir, fd)) == path:
                    found.append(pid)
                    break
        except OSError:
            continue
    return found


def lock_holders(paths: List[str], locks_text: str, proc: str = "/proc",
                 stat=os.stat) -> List[Dict[str, object]]:
    by_file: Dict[Tuple[int, int, int], str] = {}
    for path in paths:
        try:
            info = stat(path)
        except OSError:
            continue
        by_file[(os.major(info.st_dev), os.minor(info.st_dev), info.st_ino)] = path
    holders: List[Dict[str, object]] = []
    seen = set()
    for kind, pid, major, minor, inode in parse_locks(locks_text):
        path: Optional[str] = by_file.get((major, minor, inode))
        if path is None:
            continue
        pids = [pid] if pid > 0 else (openers_of(path, proc) or [-1])
        for holder in pids:
            if (path, holder) in seen:
                continue
            seen.add((path, holder))
            command = command_of(holder, proc) if holder > 0 else "unknown: no process of this namespace has it open"
            holders.append({"path": path, "pid": holder, "command": command, "kind": kind,
                            "summary": "%s is held by process %d (%s)" % (path, holder, command)})
    return holders


def main() -> None:
    module = AnsibleModule(argument_spec={"paths": {"type": "list", "elements": "path", "default": [
        "/var/lib/dpkg/lock-frontend", "/var/lib/dpkg/lock", "/var/lib/apt/lists/lock",
        "/var/cache/apt/archives/lock"]}}, supports_check_mode=True)
    try:
        with open("/proc/locks") as handle:
            text = handle.read()
    except OSError as exc:
        module.fail_json(msg="cannot read /proc/locks to find the package lock's holder: %s" % exc)
    module.exit_json(changed=False, holders=lock_holders(module.params["paths"], text))


if __name__ == "__main__":
    main()
