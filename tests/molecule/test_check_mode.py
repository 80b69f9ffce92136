"""Shared Molecule verifier test: check mode predicts the real run, and a converged host reports no change.

Reads the run records that the change_log callback (tests/plugins/callback/change_log.py) appended during this
scenario's test sequence: check on the fresh host, converge, idempotence, check on the converged host.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

PREDICTED_SUFFIX = re.compile(r" \(predicted[^)]*\)$")


def _records() -> list[dict]:
    path = Path(os.environ["GPU_CHANGE_LOG"])
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    # Only this sequence's runs: everything after the last prepare run.
    starts = [i for i, record in enumerate(records) if record["playbook"] == "prepare.yml"]
    return records[starts[-1] + 1:] if starts else records


def _converge_runs() -> list[dict]:
    runs = [record for record in _records() if record["playbook"] == "converge.yml"]
    assert len(runs) >= 4, f"expected check, converge, idempotence, check runs of converge.yml, got {len(runs)}"
    fresh_check, real, _again, converged_check = runs[:4]
    assert fresh_check["check_mode"] and converged_check["check_mode"] and not real["check_mode"]
    return runs[:4]


def normalise(names: list[str]) -> set[str]:
    return {PREDICTED_SUFFIX.sub("", name) for name in names}


def test_check_mode_on_a_fresh_host_predicts_the_real_run() -> None:
    fresh_check, real, _again, _converged_check = _converge_runs()
    assert real["changed"], "the converge changed nothing, so there is nothing to predict"
    for host, changed in real["changed"].items():
        predicted = normalise(fresh_check["changed"].get(host, []))
        not_checkable = set(fresh_check["check_skipped"].get(host, []))
        assert predicted <= set(changed), f"{host}: check mode predicted changes the real run did not make"
        assert set(changed) <= predicted | not_checkable, (
            f"{host}: the real run changed {sorted(set(changed) - predicted - not_checkable)} unpredicted"
        )


def test_check_mode_on_a_converged_host_reports_no_change() -> None:
    _fresh_check, _real, _again, converged_check = _converge_runs()
    changed = {host: names for host, names in converged_check["changed"].items() if names}
    assert not changed, f"check mode on a converged host reports changes: {changed}"
