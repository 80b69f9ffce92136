"""The lab's node containers against the real podman: a container whose processes were killed behind podman's back
(with the session that started it) is still listed as running, answers no command, and is found and removed.

This is what a CI run met after a session's end killed the node containers: every node waited for GPUs the
device-plugin double could not read from them (lab/nodes.py, remove_dead_containers)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import uuid

import pytest

import nodes

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("podman"),
                                reason="the lab's containers are root's podman containers")


def podman(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *argv], capture_output=True, text=True, check=check)


def test_a_container_killed_behind_podmans_back_is_found_and_removed():
    if podman("image", "exists", nodes.IMAGE, check=False).returncode != 0:
        pytest.skip(f"{nodes.IMAGE} is not built (`labctl images`)")
    # A label of its own: the lab's real node containers (running beside this test in lane 1) are never looked at.
    label = f"gpu-lab.role=test-dead-{uuid.uuid4().hex[:8]}"
    dead, alive = f"it-dead-{uuid.uuid4().hex[:8]}", f"it-alive-{uuid.uuid4().hex[:8]}"
    try:
        for name in (dead, alive):
            podman("run", "-d", "--name", name, "--label", label, nodes.IMAGE, "sleep", "infinity")
        state = json.loads(podman("inspect", dead).stdout)[0]["State"]
        for pid in (state["Pid"], state["ConmonPid"]):
            os.kill(pid, signal.SIGKILL)

        assert nodes.container_states(label) == {dead: "running", alive: "running"}  # what podman still says
        assert not nodes.answers(dead) and nodes.answers(alive)

        assert nodes.remove_dead_containers([label]) == [dead]

        assert nodes.container_states(label) == {alive: "running"}
        assert nodes.remove_dead_containers([label]) == []  # a second look finds nothing
    finally:
        podman("rm", "--force", "--time", "0", "--ignore", dead, alive, check=False)
        podman("rm", "--force", "--time", "0", "--ignore", dead, check=False)
