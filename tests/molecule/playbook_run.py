"""Runs a scenario's converge playbook again from a verifier test, with extra vars: how the preflight tests feed the
roles bad input against a real host."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path


def run_playbook(playbook: Path, extra_vars: dict) -> subprocess.CompletedProcess:
    """ansible-playbook against the scenario's inventory; kept out of the scenario's change log, which the shared
    check-mode test reads."""
    return subprocess.run(
        ["ansible-playbook", "-i", os.environ["MOLECULE_INVENTORY_FILE"], str(playbook), "-e", json.dumps(extra_vars)],
        capture_output=True, text=True, timeout=600, check=False,
        env={**os.environ, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0", "GPU_CHANGE_LOG": ""},
    )


def flat_output(result: subprocess.CompletedProcess) -> str:
    """stdout and stderr with whitespace collapsed (the callback folds long messages over lines)."""
    return " ".join((result.stdout + result.stderr).split())
