"""Callback plugin (test tooling): appends, per playbook run, the tasks that changed or would change.

Enabled by the Molecule scenarios through ANSIBLE_CALLBACKS_ENABLED=change_log. It writes one JSON line per playbook
run to the file named by GPU_CHANGE_LOG:
``{"playbook": ..., "check_mode": bool, "changed": {host: [task names]}, "check_skipped": {host: [task names]}}``.
``check_skipped`` lists tasks and handlers that check mode skipped because they cannot run without changing the host
(commands); a real run executes them. The check-mode tests compare these records between runs.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict

from ansible import context
from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
name: change_log
type: aggregate
short_description: Record changed task names per host and run to a JSON lines file (test tooling).
description:
  - Writes one JSON object per playbook run to the file named by the GPU_CHANGE_LOG environment variable.
requirements:
  - enable in configuration (callbacks_enabled)
"""


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "change_log"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self) -> None:
        super().__init__()
        self._path = os.environ.get("GPU_CHANGE_LOG", "")
        self._playbook = ""
        self._changed: dict[str, list[str]] = defaultdict(list)
        self._check_skipped: dict[str, list[str]] = defaultdict(list)

    def v2_playbook_on_start(self, playbook) -> None:
        self._playbook = os.path.basename(playbook._file_name)

    @staticmethod
    def _task_name(result) -> str:
        return result._task.get_name().strip()

    def v2_runner_on_ok(self, result) -> None:
        if result._result.get("changed", False):
            name = self._task_name(result)
            host = result._host.get_name()
            if name not in self._changed[host]:
                self._changed[host].append(name)

    def v2_runner_on_skipped(self, result) -> None:
        message = str(result._result.get("msg", ""))
        if "check mode" in message:
            name = self._task_name(result)
            host = result._host.get_name()
            if name not in self._check_skipped[host]:
                self._check_skipped[host].append(name)

    def v2_playbook_on_stats(self, stats) -> None:
        if not self._path:
            return
        record = {
            "playbook": self._playbook,
            "check_mode": bool(context.CLIARGS.get("check", False)),
            "changed": dict(self._changed),
            "check_skipped": dict(self._check_skipped),
        }
        with open(self._path, "a", encoding="utf-8") as log:
            log.write(json.dumps(record, sort_keys=True) + "\n")
