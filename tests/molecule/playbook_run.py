"""Runs a scenario's converge playbook again from a verifier test, with extra vars: how the preflight tests feed the
roles bad input against a real host, and how a test sees which tasks a run changed or would change."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path


def run_playbook(playbook: Path, extra_vars: dict, check: bool = False,
                 change_log: Path | None = None, args: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """ansible-playbook against the scenario's inventory. Kept out of the scenario's change log, which the shared
    check-mode test reads; `change_log` names another file for the change_log callback's record of this run."""
    return subprocess.run(
        ["ansible-playbook", "-i", os.environ["MOLECULE_INVENTORY_FILE"], str(playbook), "-e", json.dumps(extra_vars)]
        + (["--check"] if check else []) + list(args),
        capture_output=True, text=True, timeout=600, check=False,
        env={**os.environ, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0",
             "GPU_CHANGE_LOG": str(change_log) if change_log else ""},
    )


def changed_tasks(playbook: Path, host: str, extra_vars: dict | None = None, check: bool = False,
                  args: tuple[str, ...] = ()) -> list[str]:
    """Runs the playbook (which must succeed) and returns the names of the tasks that changed, or in check mode would
    change, on `host`, as the change_log callback records them."""
    with tempfile.TemporaryDirectory() as scratch:
        log = Path(scratch) / "changes.jsonl"
        result = run_playbook(playbook, extra_vars or {}, check=check, change_log=log, args=args)
        assert result.returncode == 0, flat_output(result)[-3000:]
        record = json.loads(log.read_text(encoding="utf-8").splitlines()[-1])
    return record["changed"].get(host, [])


def flat_output(result: subprocess.CompletedProcess) -> str:
    """stdout and stderr with whitespace collapsed (the callback folds long messages over lines)."""
    return " ".join((result.stdout + result.stderr).split())
