"""Dropping docker from nvidia_container_toolkit_default_for gives Docker back the default runtime it had before the
role made nvidia its default (here none: the operator's daemon.json named no default-runtime). The nvidia runtime and
every key of the operator stay; check mode predicts the change; the next run changes nothing. The test ends by asking
for the default again, which leaves the host as the scenario converged it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests" / "molecule"))

import container_toolkit_checks as checks  # noqa: E402
from playbook_run import changed_tasks  # noqa: E402

CONVERGE = Path(__file__).resolve().parents[2] / "_shared" / "container_toolkit" / "converge.yml"
HOST = "ctk-debian12"
MERGE = "Merge the NVIDIA runtime into the Docker daemon configuration"
RESTART = "Docker | restart"
NOT_DEFAULT = {"nvidia_container_toolkit_default_for": []}


def short_names(names: list[str]) -> set[str]:
    return {name.split(" : ", 1)[-1] for name in names}


def recorded(host) -> dict:
    return json.loads(host.file("/etc/ansible/facts.d/nvidia_container_toolkit.fact").content_string)


def test_docker_default_is_given_back(host):
    assert recorded(host)["docker_default_before"] == ""
    predicted = short_names(changed_tasks(CONVERGE, HOST, NOT_DEFAULT, check=True))
    assert {MERGE, RESTART} <= predicted, predicted
    assert "default-runtime" in json.loads(host.file("/etc/docker/daemon.json").content_string), "check mode wrote"

    assert short_names(changed_tasks(CONVERGE, HOST, NOT_DEFAULT)) == predicted
    checks.assert_docker_keeps_user_and_adds_nvidia(host, as_default=False)
    assert "docker_default_before" not in recorded(host)
    assert changed_tasks(CONVERGE, HOST, NOT_DEFAULT) == []

    # Asked for again: nvidia is Docker's default once more, as the scenario left it.
    assert {MERGE, RESTART} <= short_names(changed_tasks(CONVERGE, HOST))
    checks.assert_docker_keeps_user_and_adds_nvidia(host, as_default=True)
    assert recorded(host)["docker_default_before"] == ""
