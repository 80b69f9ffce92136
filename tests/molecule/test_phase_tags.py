"""Shared Molecule verifier test: each phase of a node role runs alone by its tag on the converged host.

`--tags <role>_install` (or any other phase tag) must still run the role's preflight, which loads the per-OS
variables and checks the inputs the phase needs; before, it skipped preflight and failed on undefined variables.
On a converged host each phase alone changes nothing. One scenario per role runs it (the Debian 12 one): the phases
are the same on every OS.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from playbook_run import changed_tasks  # noqa: E402

SHARED = Path(__file__).resolve().parents[2] / "molecule" / "_shared"
# scenario -> (role, its converge playbook, the phase tags of roles/<role>/tasks/main.yml after preflight)
SCENARIOS = {
    "nvidia_driver_debian12": ("nvidia_driver", SHARED / "converge.yml", ["install", "configure", "service"]),
    "cuda_toolkit_debian12": ("cuda_toolkit", SHARED / "cuda_toolkit" / "converge.yml",
                              ["install", "configure", "verify"]),
    "nvidia_container_toolkit_debian12": ("nvidia_container_toolkit", SHARED / "container_toolkit" / "converge.yml",
                                          ["install", "configure", "cdi"]),
}
SCENARIO = os.environ.get("MOLECULE_SCENARIO_NAME", "")


def test_every_phase_tag_is_one_the_role_has() -> None:
    """The table above names real tags: a renamed phase fails here instead of skipping silently."""
    if SCENARIO not in SCENARIOS:
        pytest.skip(f"phase tags are run in {', '.join(SCENARIOS)}")
    role, _playbook, phases = SCENARIOS[SCENARIO]
    main = yaml.safe_load((Path(__file__).resolve().parents[2] / "roles" / role / "tasks" / "main.yml").read_text(
        encoding="utf-8"))
    (preflight,) = [task for task in main if task.get("ansible.builtin.import_tasks") == "preflight.yml"]
    for phase in phases:
        assert f"{role}_{phase}" in preflight["tags"], f"preflight of {role} lacks the tag {role}_{phase}"
        assert any(f"{role}_{phase}" in task.get("tags", []) and task is not preflight for task in main), phase


@pytest.mark.parametrize("index", [0, 1, 2], ids=["first", "second", "third"])
def test_each_phase_runs_alone_and_changes_nothing_on_a_converged_host(host, index: int) -> None:
    if SCENARIO not in SCENARIOS:
        pytest.skip(f"phase tags are run in {', '.join(SCENARIOS)}")
    role, playbook, phases = SCENARIOS[SCENARIO]
    tag = f"{role}_{phases[index]}"
    assert changed_tasks(playbook, host.backend.get_hostname(), args=("--tags", tag)) == [], tag
