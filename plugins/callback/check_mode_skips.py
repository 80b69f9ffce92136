"""Callback plugin: why each task was skipped, one JSON line per skipped host and task.

A drift check runs in check mode, where Ansible skips what it cannot predict (a command without creates/removes, an
action without check mode support) and reports it as an ordinary skip: ansible-runner's events keep no reason for a
skip, so a skip for a false condition and a skip because of check mode look the same. runner/gpu_ops_drift.py enables
this plugin for its runs and lists the check-mode skips as tasks the run could not verify, never as in sync.
"""

from __future__ import annotations

DOCUMENTATION = """
name: check_mode_skips
type: aggregate
short_description: Write why each task was skipped (for drift checks), one JSON line per host and task.
description:
  - Writes nothing unless O(path) is set.
  - Each line holds C(host), C(task) (its name, without its role), C(task_uuid), C(role), C(action),
    C(check_mode) (whether the run is in check mode) and C(reason) (Ansible's skip reason or the module's message,
    for example V(Command would have run if not in check mode) or V(Conditional result was False)).
  - Lines are appended and flushed as the run goes, so a run killed part way leaves the skips it saw.
requirements:
  - enable in configuration (callbacks_enabled)
options:
  path:
    description: The file to append the lines to (its directory must exist).
    type: path
    env:
      - name: GPU_CHECK_MODE_SKIPS
"""

import json
import threading
from typing import Any, Optional, TextIO

from ansible import context
from ansible.plugins.callback import CallbackBase


def skip_reason(result: Any) -> str:
    """The reason Ansible or the module gave for a skip (a result dict), or ''."""
    if not isinstance(result, dict):
        return ""
    for key in ("skip_reason", "msg", "skipped_reason"):
        if isinstance(result.get(key), str) and result[key] and result[key] != "All items skipped":
            return result[key]
    # A loop whose items were all skipped: the items say why.
    for item in result.get("results") or []:
        reason = skip_reason(item)
        if reason:
            return reason
    return ""


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "gpu_ops.cluster.check_mode_skips"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self) -> None:
        super().__init__()
        self._handle: Optional[TextIO] = None
        self._lock = threading.Lock()

    def set_options(self, task_keys=None, var_options=None, direct=None):  # noqa: ANN001
        super().set_options(task_keys=task_keys, var_options=var_options, direct=direct)
        path = self.get_option("path")
        if path:
            self._handle = open(path, "a", encoding="utf-8")  # noqa: SIM115 (open for the run's length)

    def v2_runner_on_skipped(self, result: Any) -> None:
        if self._handle is None:
            return
        task = result._task
        role = task._role.get_name(include_role_fqcn=True) if task._role else ""
        line = {
            "host": result._host.get_name(),
            "task": task.name or task.resolved_action or task.action,
            "task_uuid": task._uuid,
            "role": role,
            "action": task.resolved_action or task.action,
            "check_mode": bool(context.CLIARGS.get("check")),
            "reason": skip_reason(result._result),
        }
        with self._lock:
            self._handle.write(json.dumps(line, sort_keys=True) + "\n")
            self._handle.flush()

    def v2_playbook_on_stats(self, stats: Any) -> None:
        if self._handle is not None:
            with self._lock:
                self._handle.close()
                self._handle = None
