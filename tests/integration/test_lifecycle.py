"""`down` then `up` leaves nothing stale. conftest.py runs it after every other test because it restarts the control
plane; it wipes the cluster's data, so it runs only on a lab this test session
started itself (as in CI), or when GPU_LAB_ALLOW_RESET=1 says a running lab may be wiped."""

from __future__ import annotations

import os
import signal
import time

import pytest

import cluster
from conftest import Lab


def test_down_then_up_leaves_nothing_stale(lab: Lab):
    if not (lab.started_here or os.environ.get("GPU_LAB_ALLOW_RESET")):
        pytest.skip("the lab was already running before the tests; set GPU_LAB_ALLOW_RESET=1 to let this test wipe it")
    lab.core.create_namespace({"metadata": {"name": "it-before-down"}})
    pids = {name: cluster.read_pid(lab.paths, name) for name in cluster.PROGRAMS}
    assert all(pids.values()), pids

    stopped = cluster.control_plane_down(lab.config)

    assert sorted(stopped) == sorted(cluster.PROGRAMS)
    assert not [name for name, pid in pids.items() if cluster.is_alive(pid)]
    assert all(cluster.port_free(port) for port in lab.config.ports.values())
    assert not list(lab.paths.run.glob("*.pid"))
    assert not lab.paths.etcd_data.exists()
    assert cluster.control_plane_down(lab.config) == []  # a second down finds nothing to do

    cluster.control_plane_up(lab.config, build=False)

    assert cluster.is_healthy(lab.config)
    names = {ns.metadata.name for ns in lab.core.list_namespace().items}
    assert "it-before-down" not in names and {"default", "kube-system"} <= names
    assert sorted(n.metadata.name for n in lab.core.list_node().items) == sorted(n for n, _ in lab.config.nodes())
    new_pids = {name: cluster.read_pid(lab.paths, name) for name in cluster.PROGRAMS}
    assert not set(new_pids.values()) & set(pids.values())


def kill_every_process(lab: Lab) -> None:
    """As a session's end or a power cut does: no shutdown, pid files and data left behind."""
    pids = [cluster.read_pid(lab.paths, name) for name in cluster.PROGRAMS]
    for pid in pids:
        os.killpg(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while any(cluster.is_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in pids if cluster.is_alive(pid)]


def test_a_killed_lab_starts_again_without_its_data(lab: Lab):
    """What the test session's lab fixture does on a lab that is not running (CI after a killed run)."""
    if not (lab.started_here or os.environ.get("GPU_LAB_ALLOW_RESET")):
        pytest.skip("the lab was already running before the tests; set GPU_LAB_ALLOW_RESET=1 to let this test wipe it")
    lab.core.create_namespace({"metadata": {"name": "it-left-by-a-killed-run"}})
    kill_every_process(lab)
    assert lab.paths.etcd_data.exists() and not cluster.is_healthy(lab.config)

    cluster.start_fresh(lab.config, build=False)

    assert cluster.is_healthy(lab.config)
    names = {ns.metadata.name for ns in lab.core.list_namespace().items}
    assert "it-left-by-a-killed-run" not in names and "kube-system" in names
    assert sorted(n.metadata.name for n in lab.core.list_node().items) == sorted(n for n, _ in lab.config.nodes())
