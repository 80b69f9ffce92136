"""Callback plugin: a JSON record of a playbook run, kept current on disk while the run goes.

`make lab` enables it for playbooks/site.yml (GPU_RUN_RECORD=reports/site-run.json) so that `lab/labctl.py summary`
can say what happened even when the run failed or was killed part way: the file is rewritten (temp file, then
os.replace) at the playbook's start, at each play, as each host starts each task, at each failure and at the recap.
"""

from __future__ import annotations

DOCUMENTATION = """
name: run_record
type: aggregate
short_description: Keep a JSON record of the run (per host, last play and task, failures, recap) in a file.
description:
  - Writes nothing unless O(path) is set.
  - The record is rewritten atomically as the run goes, so a run killed part way still leaves one with
    C(status=running).
  - C(schema) (1), C(playbook), C(check_mode), C(started) and C(ended) (ISO 8601, UTC), C(status)
    (C(running), C(ok) or C(failed)), C(log), C(current_play), and per host in C(hosts) its C(state) (C(ok),
    C(failed) or C(unreachable)), C(last_play), C(last_task) (named as Ansible prints it, after its role), C(failure)
    (C(play), C(task), C(message)) and, after the recap, C(recap) (C(ok), C(changed), C(failed), C(unreachable),
    C(skipped), C(rescued), C(ignored)).
  - Errors ignored with C(ignore_errors) and failures a C(rescue) section handles do not fail a host; the recap
    decides each host's final state.
  - Results of C(no_log) tasks reach callbacks censored by Ansible; the record keeps only that censored text.
requirements:
  - enable in configuration (callbacks_enabled)
options:
  path:
    description: The file to write the record to (its directory must exist).
    type: path
    env:
      - name: GPU_RUN_RECORD
  log:
    description: Where the run's output is logged, copied into the record as C(log) for whoever reads it.
    type: str
    env:
      - name: GPU_RUN_LOG
"""

import json
import os
import tempfile
import threading
import time
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from ansible import context
from ansible.playbook.block import Block
from ansible.plugins.callback import CallbackBase

SCHEMA = 1
MESSAGE_LIMIT = 500
# Every host starts every task: over hundreds of hosts, one rewrite each would write the whole record hundreds of
# times per task. Up to THROTTLE_ABOVE_HOSTS hosts each start is written at once; above, at most every THROTTLE_S.
THROTTLE_ABOVE_HOSTS = 50
THROTTLE_S = 1.0
RECAP_KEYS = (("ok", "ok"), ("changed", "changed"), ("failed", "failures"), ("unreachable", "unreachable"),
              ("skipped", "skipped"), ("rescued", "rescued"), ("ignored", "ignored"))


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def tail(text: str, limit: int = MESSAGE_LIMIT) -> str:
    """The end of a long output (where the error usually is), whitespace runs kept but trimmed at the ends."""
    text = text.strip()
    return text if len(text) <= limit else "..." + text[-(limit - 3):]


def head(text: str, limit: int = MESSAGE_LIMIT) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[:limit - 3] + "..."


def failure_message(result: Mapping[str, Any]) -> str:
    """What went wrong, from a (callback, so already no_log-censored) task result: msg and the tail of stderr (else
    stdout), at most MESSAGE_LIMIT characters.

    A censored result yields only Ansible's own censoring sentence; a loop's generic "One or more items failed"
    gives way to the first failed item's message.
    """
    if "censored" in result:
        return str(result["censored"])
    message = result.get("msg")
    items = result.get("results")
    if isinstance(items, list) and (not message or str(message).startswith("One or more items failed")):
        for item in items:
            if isinstance(item, Mapping) and item.get("failed"):
                item_message = failure_message(item)
                if item_message:
                    return item_message
    text = "" if not message else message if isinstance(message, str) else json.dumps(message, default=str)
    output = next((result[key] for key in ("stderr", "module_stderr", "stdout", "module_stdout")
                   if isinstance(result.get(key), str) and result[key].strip()), "")
    if not output:
        return head(text)
    if not text:
        return tail(output)
    # "non-zero return code" says little without the command's own words: keep the msg, then the output's end.
    text = head(text, MESSAGE_LIMIT // 2)
    return f"{text}: {tail(output, MESSAGE_LIMIT - len(text) - 2)}"


def shown_path(path: str) -> str:
    """A path relative to the working directory when it lies below it (playbooks/site.yml), else absolute."""
    relative = os.path.relpath(os.path.abspath(path))
    return os.path.abspath(path) if relative.startswith(os.pardir) else relative


def recap_counts(summary: Mapping[str, int]) -> dict[str, int]:
    """Ansible's AggregateStats.summarize() under the names the recap line prints."""
    return {name: int(summary.get(key, 0)) for name, key in RECAP_KEYS}


def final_state(recap: Mapping[str, int]) -> str:
    if recap.get("unreachable"):
        return "unreachable"
    return "failed" if recap.get("failed") else "ok"


def run_status(hosts: Mapping[str, Mapping[str, Any]]) -> str:
    return "ok" if all(entry.get("state") == "ok" for entry in hosts.values()) else "failed"


def in_rescued_part(task: Any) -> bool:
    """Whether the task sits in the `block:` part of a block that has a `rescue:` (so its failure is rescued).

    Ansible decides this in the strategy (which also counts `rescued` in the recap); the callback sees only the task,
    so it walks the task's parents: tasks, blocks and includes, each knowing its `_parent`.
    """
    child, parent = task, getattr(task, "_parent", None)
    while parent is not None:
        if isinstance(parent, Block) and parent.rescue and any(
                getattr(member, "_uuid", None) == child._uuid for member in parent.block):
            return True
        child, parent = parent, getattr(parent, "_parent", None)
    return False


def write_atomically(path: str, record: Mapping[str, Any]) -> None:
    directory = os.path.dirname(path) or "."
    handle, temporary = tempfile.mkstemp(prefix=".run_record-", suffix=".json", dir=directory)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(json.dumps(record, indent=2, sort_keys=True) + "\n")
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "run_record"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._path = ""
        self._play = ""
        self._record: dict[str, Any] = {}
        # The flush timer writes from its own thread: record changes and writes hold this lock.
        self._lock = threading.RLock()
        self._last_write = 0.0
        self._flush_timer: threading.Timer | None = None

    def set_options(self, task_keys: Any = None, var_options: Any = None, direct: Any = None) -> None:
        super().set_options(task_keys=task_keys, var_options=var_options, direct=direct)
        path = self.get_option("path")
        # Absolute now: the record must land where the caller said even if something changes the directory later.
        self._path = os.path.abspath(path) if path else ""

    def _write(self) -> None:
        with self._lock:
            if self._flush_timer is not None:
                self._flush_timer.cancel()
                self._flush_timer = None
            if not self._path:
                return
            try:
                write_atomically(self._path, self._record)
            except OSError as error:
                self._display.warning(f"run_record: cannot write {self._path}: {error}")
                self._path = ""  # one warning, not one per task
            self._last_write = time.monotonic()

    def _write_soon(self) -> None:
        """A task start: written at once on small runs; over many hosts at most every THROTTLE_S seconds, and always
        within THROTTLE_S of the last start (a run that hangs in a task still shows that task)."""
        with self._lock:
            if len(self._record.get("hosts", {})) <= THROTTLE_ABOVE_HOSTS:
                self._write()
                return
            if self._flush_timer is not None:
                return
            wait = THROTTLE_S - (time.monotonic() - self._last_write)
            if wait > 0:
                self._flush_timer = threading.Timer(wait, self._write)
                self._flush_timer.daemon = True
                self._flush_timer.start()
                return
        self._write()

    def _host(self, name: str) -> dict[str, Any]:
        return self._record.setdefault("hosts", {}).setdefault(
            name, {"state": "ok", "last_play": self._play, "last_task": ""})

    def v2_playbook_on_start(self, playbook: Any) -> None:
        self._record = {
            "schema": SCHEMA,
            "playbook": shown_path(playbook._file_name),
            "check_mode": bool(context.CLIARGS.get("check", False)),
            "started": utc_now(),
            "ended": None,
            "status": "running",
            "log": self.get_option("log") or "",
            "current_play": "",
            "hosts": {},
        }
        self._write()

    def v2_playbook_on_play_start(self, play: Any) -> None:
        with self._lock:
            self._play = play.get_name().strip()
            self._record["current_play"] = self._play
            self._write()

    def v2_runner_on_start(self, host: Any, task: Any) -> None:
        with self._lock:
            entry = self._host(host.get_name())
            entry["last_play"] = self._play
            entry["last_task"] = task.get_name().strip()
        self._write_soon()

    def v2_runner_on_failed(self, result: Any, ignore_errors: bool = False) -> None:
        if ignore_errors or in_rescued_part(result.task):
            return
        self._fail(result, "failed")

    def v2_runner_on_unreachable(self, result: Any) -> None:
        if result.task.ignore_unreachable:
            return
        self._fail(result, "unreachable")

    def _fail(self, result: Any, state: str) -> None:
        with self._lock:
            entry = self._host(result.host.get_name())
            task = result.task.get_name().strip()
            entry.update(state=state, last_play=self._play, last_task=task,
                         failure={"play": self._play, "task": task, "message": failure_message(result.result)})
            self._write()

    def v2_playbook_on_stats(self, stats: Any) -> None:
        with self._lock:
            self._final(stats)

    def _final(self, stats: Any) -> None:
        for name in sorted(stats.processed):
            entry = self._host(name)
            entry["recap"] = recap_counts(stats.summarize(name))
            entry["state"] = final_state(entry["recap"])
            if entry["state"] == "ok":
                entry.pop("failure", None)  # a failure the recap counts as rescued
        self._record.update(status=run_status(self._record.get("hosts", {})), ended=utc_now())
        self._write()
