"""Faults of the control plane in the middle of `playbooks/cluster.yml` (issue 21, docs/faults.md): kube-apiserver
stopped while the cluster roles run, then etcd stopped for a few seconds during the next run. Each time the run either
survives or stops with a message naming the API server, a plain re-run converges (a check run after it has nothing
to change), and what a user made in the cluster is still there.

The processes are the lab's real ones (lab/cluster.py stops them by PID and starts them again with `control_plane_up`,
which starts only what is not running and healthy)."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path
from typing import Callable

import cluster
import gobuild
from conftest import ROOT, Lab, playbook_env, recap_changed, run_playbook, wait_for

LAB_INVENTORY = "inventories/lab/hosts.yml"
# A task of the third cluster role: the run has applied objects already and has more to apply.
MID_RUN = "TASK [gpu_ops.cluster.nvidia_device_plugin : "
# The first failed task's line: "fatal: [localhost]: FAILED!" or, for a loop, "failed: [localhost] (item=...)".
FAILED = re.compile(r"^(fatal|failed): \[localhost\]", re.MULTILINE)


def run_with_fault(lab: Lab, log: Path, fault: Callable[[], None]) -> tuple[int, str]:
    """cluster.yml with fault() done once the run reaches MID_RUN; then every lab process is made healthy again
    (control_plane_up starts only what is not running and healthy). (rc, output)."""
    with log.open("w", encoding="utf-8") as handle:
        run = subprocess.Popen(["ansible-playbook", "playbooks/cluster.yml", "-i", LAB_INVENTORY,
                                "-e", f"gpu_cluster_kubeconfig={lab.kubeconfig}"],
                               cwd=ROOT, env=playbook_env(), stdout=handle, stderr=subprocess.STDOUT, text=True)
        try:
            def reached() -> bool:
                assert run.poll() is None, \
                    f"the run ended (rc={run.returncode}) before {MID_RUN!r}:\n{log.read_text()[-3000:]}"
                return MID_RUN in log.read_text(encoding="utf-8")

            wait_for(reached, 300, f"the run to reach {MID_RUN!r}", interval=0.1)
            fault()
            rc = run.wait(timeout=600)
        finally:
            if run.poll() is None:
                run.kill()
            cluster.control_plane_up(lab.config, build=False)
    return rc, log.read_text(encoding="utf-8")


def stop(lab: Lab, name: str) -> None:
    pid = cluster.read_pid(lab.paths, name)
    assert pid and cluster.is_alive(pid), f"{name} is not running"
    cluster.stop_pid(pid, name)


def start_again(lab: Lab, name: str) -> None:
    """Start one stopped lab process as `up` would, leaving the others as they are (the API server reconnects to
    etcd by itself, as in a real control plane)."""
    for process in cluster.processes(lab.config, gobuild.cached_builds(), lab.paths, cluster.venv_python()):
        if process.name == name:
            cluster.wait_healthy(lab.paths, process, cluster.start(lab.paths, process))
            return
    raise AssertionError(f"no lab process named {name}")


def names_the_server(output: str, port: int) -> bool:
    failed = FAILED.search(output)
    window = output[failed.start():][:3000] if failed else ""
    return f"port={port}" in window or f"127.0.0.1:{port}" in window


def user_objects(lab: Lab, namespace: str) -> dict:
    config_map = lab.core.read_namespaced_config_map("hand-made", namespace)
    claim = lab.core.read_namespaced_persistent_volume_claim("datasets", namespace)
    return {"config": config_map.data, "claim": claim.metadata.uid}


def test_a_stopped_api_server_or_etcd_mid_run_then_a_plain_rerun_converges(lab: Lab, namespace, tmp_path: Path):
    users = namespace()
    lab.core.create_namespaced_config_map(users, {"metadata": {"name": "hand-made"}, "data": {"keep": "me"}})
    lab.core.create_namespaced_persistent_volume_claim(users, {"metadata": {"name": "datasets"}, "spec": {
        "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}})
    before = user_objects(lab, users)

    # 1. kube-apiserver stops while the cluster roles run, and stays down until the run has ended.
    rc, output = run_with_fault(lab, tmp_path / "apiserver.log", lambda: stop(lab, "kube-apiserver"))
    assert rc != 0, output[-4000:]
    port = lab.config.ports["kube_apiserver"]
    assert names_the_server(output, port) and "Connection refused" in output, output[-4000:]

    # 2. etcd stops for a few seconds during the next run: the API server answers again once etcd is back.
    def etcd_away() -> None:
        stop(lab, "etcd")
        time.sleep(5)
        start_again(lab, "etcd")

    rc, output = run_with_fault(lab, tmp_path / "etcd.log", etcd_away)
    if rc != 0:  # a request in flight may fail while etcd is away; then the failed task names the server
        assert FAILED.search(output), output[-4000:]

    # 3. A plain re-run converges, and nothing of the user's is lost.
    rc, output = run_playbook(lab, "cluster.yml", "-i", LAB_INVENTORY)
    assert rc == 0, output[-4000:]
    rc, output = run_playbook(lab, "cluster.yml", "-i", LAB_INVENTORY, "--check")
    assert rc == 0 and recap_changed(output) == 0, output[-4000:]
    assert user_objects(lab, users) == before
    wait_for(lambda: cluster.is_healthy(lab.config), 60, "every lab process to be healthy")
