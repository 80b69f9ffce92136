"""playbooks/upgrade.yml on the lab (issue 17, docs/driver_upgrade.md): the three GPU nodes' containers move to
driver branch 590 and then 595 of the lab mirror's driver doubles (NVIDIA's unversioned package names, held by
nvidia-driver-pinning-<branch>), through the real API server: cordons, the real Eviction API with a
PodDisruptionBudget, Jobs run by the real controller manager and placed by the real scheduler, kwok's pods finishing.

The node containers are started here when no earlier test left them running, and always removed afterwards (their
driver is not the main job's any more): a later test starts them fresh."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest

import cluster
import nodes
from conftest import ROOT, Lab, playbook_env, recap_changed, wait_for

NODES = ("gpu-a100-0", "gpu-h100-0", "gpu-h100-1")
# How long the rollout waits for GPU jobs on a node before it evicts them: sized for the lab (production waits hours).
WAIT_S = 30
STATE = "gpu-cluster.dev/driver-upgrade-state"
RECORD = "gpu-cluster.dev/driver-upgrade"
MIRROR = "http://gpu-lab-mirror:8080"
# The lab mirror's copy of NVIDIA's CUDA repository carries the driver doubles (lab/nvidia_packages.py).
DRIVER_FROM_MIRROR = {"nvidia_driver_source": "mirror", "nvidia_driver_mirror_packages": "cuda_repo",
                      "nvidia_driver_mirror_url": f"{MIRROR}/cuda/repos/debian12/x86_64/",
                      "nvidia_driver_mirror_key_url": f"{MIRROR}/gpu-lab-mirror.asc", "nvidia_driver_kernel_modules": "open"}


def labctl(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{ROOT / '.venv' / 'bin'}:{os.environ['PATH']}"}
    return subprocess.run([str(ROOT / ".venv" / "bin" / "python"), "lab/labctl.py", *args], cwd=ROOT, env=env,
                          text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=1800, check=False)


def upgrade(lab: Lab, report_dir: Path, settings: dict, *extra: str) -> tuple[int, str, dict]:
    """upgrade.yml against the lab; (rc, output, the rollout report)."""
    variables = {**DRIVER_FROM_MIRROR, "gpu_cluster_kubeconfig": str(lab.kubeconfig),
                 "gpu_driver_upgrade_report_dir": str(report_dir), **settings}
    run = subprocess.run(["ansible-playbook", "playbooks/upgrade.yml", "-i", "inventories/lab/hosts.yml",
                          "-e", json.dumps(variables), *extra], cwd=ROOT, env=playbook_env(), text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=1800, check=False)
    report = report_dir / "driver-upgrade.json"
    return run.returncode, run.stdout, json.loads(report.read_text()) if report.exists() else {}


def node_driver(name: str) -> str:
    out = subprocess.run(["podman", "exec", name, "nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    return out.splitlines()[0].strip()


class Watcher:
    """Watches the GPU nodes while a rollout runs (every update the API server sends, not samples): the most
    cordoned at once, and every state label each one showed, in order."""

    def __init__(self, lab: Lab) -> None:
        self.lab, self.most_cordoned, self.states = lab, 0, {name: [] for name in NODES}
        self.cordoned: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _see(self, node) -> None:
        name = node.metadata.name
        if name not in NODES:
            return
        (self.cordoned.add if node.spec.unschedulable else self.cordoned.discard)(name)
        self.most_cordoned = max(self.most_cordoned, len(self.cordoned))
        state = (node.metadata.labels or {}).get(STATE)
        if state and (not self.states[name] or self.states[name][-1] != state):
            self.states[name].append(state)

    def _run(self) -> None:
        from kubernetes import watch

        listed = self.lab.core.list_node()
        for node in listed.items:
            self._see(node)
        version = listed.metadata.resource_version
        while not self._stop.is_set():
            stream = watch.Watch()
            for event in stream.stream(self.lab.core.list_node, resource_version=version, timeout_seconds=2):
                self._see(event["object"])
                version = event["object"].metadata.resource_version
                if self._stop.is_set():
                    stream.stop()

    def __enter__(self) -> "Watcher":
        self._thread.start()
        time.sleep(1)
        return self

    def __exit__(self, *exc: object) -> None:
        time.sleep(1)
        self._stop.set()
        self._thread.join(timeout=10)


@pytest.fixture(scope="module")
def hosts(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    if not set(NODES) <= set(nodes.container_states()):
        up = labctl("up")
        assert up.returncode == 0, up.stdout[-3000:]
    yield tmp_path_factory.mktemp("upgrade")
    for name in NODES:
        lab.core.patch_node(name, {"metadata": {"labels": {STATE: None}, "annotations": {RECORD: None}},
                                   "spec": {"unschedulable": None}})
    if not os.environ.get("GPU_LAB_KEEP"):
        nodes.down()


def gpu_job(ns: str, name: str, node: str, annotations: dict) -> dict:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": ns}, "spec": {
        "backoffLimit": 0, "template": {"metadata": {"labels": {"app": name}, "annotations": annotations}, "spec": {
            "restartPolicy": "Never", "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                            "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}}


def pods_on(lab: Lab, ns: str, node: str) -> list:
    return [p for p in lab.core.list_namespaced_pod(ns).items if p.spec.node_name == node]


def test_a_branch_the_nodes_cannot_install_is_refused_before_the_first_cordon(lab: Lab, hosts: Path):
    """Issue 35: with a branch the source does not offer, the rollout cordoned the first node, evicted its GPU pods,
    then the driver role refused and left it cordoned and upgrade-failed. Now every node passes the driver role's
    preflight for the target before the plan, and one that cannot take it stops the rollout with nothing changed."""
    drivers = {name: node_driver(name) for name in NODES}
    for extra in ((), ("--check",)):
        rc, output, report = upgrade(lab, hosts / "refused", {"gpu_driver_upgrade_branch": "999"}, *extra)
        assert rc != 0, output[-4000:]
        said = " ".join(output.split())  # the YAML result format folds long messages
        assert 'gpu_driver_upgrade_branch="999" cannot be installed on gpu-' in said, output[-4000:]
        assert "nothing was cordoned" in said, output[-4000:]
        # The mirror's own index said so (the source's branches cannot be known from the role's data).
        assert ('nvidia_driver_branch="999" is not offered by the repository: its index '
                f"{MIRROR}/cuda/repos/debian12/x86_64/Packages.gz has no nvidia-driver-pinning-999; offered there: "
                "580, 590, 595.") in said, output[-4000:]
        assert "PLAY [Plan the rollout]" not in output and not report
        for name in NODES:
            node = lab.core.read_node(name)
            assert not node.spec.unschedulable and STATE not in (node.metadata.labels or {}), name
        assert {name: node_driver(name) for name in NODES} == drivers


def test_check_mode_prints_the_plan_and_a_rollout_moves_every_node_one_at_a_time(lab: Lab, hosts: Path, namespace):
    from kubernetes import client

    allocatable = {n.metadata.name: n.status.allocatable for n in lab.core.list_node().items if n.metadata.name in NODES}
    settings = {"gpu_driver_upgrade_branch": "590", "gpu_driver_upgrade_order": ["gpu-h100-0"],
                "gpu_driver_upgrade_wait_for_jobs_timeout": WAIT_S, "gpu_driver_upgrade_eviction_timeout": 60,
                "gpu_driver_upgrade_smoke_test": True}
    rc, output, report = upgrade(lab, hosts, settings, "--check")
    assert rc == 0, output[-4000:]
    assert report["check_mode"] is True and report["plan"]["batches"] == [["gpu-h100-0"], ["gpu-a100-0"],
                                                                          ["gpu-h100-1"]], report
    assert "batch 1: gpu-h100-0 -> driver 590 (cordon-required -> wait-for-jobs-required" in output
    assert all(STATE not in (n.metadata.labels or {}) and not n.spec.unschedulable
               for n in lab.core.list_node().items if n.metadata.name in NODES)

    # On the first node: a GPU job that finishes on its own (kwok completes it 40 s after it starts, while the
    # rollout waits: the wait begins after the run's preflight, over 10 s in) is waited for; a GPU pod that keeps
    # running is evicted once the wait is over.
    ns = namespace()
    jobs = client.BatchV1Api(lab.api_client)
    jobs.create_namespaced_job(ns, gpu_job(ns, "finishing", "gpu-h100-0",
                                           {"pod-complete.stage.kwok.x-k8s.io/delay": "40s"}))
    lab.core.create_namespaced_pod(ns, {"metadata": {"name": "running", "annotations": {
        cluster.HOLD_RUNNING_ANNOTATION: "true"}}, "spec": gpu_job(ns, "x", "gpu-h100-0", {})["spec"]["template"]["spec"]})
    wait_for(lambda: len(pods_on(lab, ns, "gpu-h100-0")) == 2, 60, "both GPU pods on gpu-h100-0")

    started = time.monotonic()
    with Watcher(lab) as watcher:
        rc, output, report = upgrade(lab, hosts, settings)
    took = time.monotonic() - started
    assert rc == 0, output[-6000:]
    print(f"rollout of {len(NODES)} nodes, one at a time: {took:.0f} s ({WAIT_S} s of it waiting for a GPU pod)")
    assert watcher.most_cordoned == 1, watcher.states
    for name in NODES:
        assert watcher.states[name][0] == "upgrade-required" and watcher.states[name][-1] == "upgrade-done", watcher.states
        assert {"cordon-required", "wait-for-jobs-required", "pod-deletion-required", "validation-required",
                "uncordon-required"} <= set(watcher.states[name]), watcher.states
        assert node_driver(name).startswith("590."), name
    assert report["upgraded"] == ["gpu-h100-0", "gpu-a100-0", "gpu-h100-1"] and report["failed_now"] == []
    assert report["counts"]["done"] == 3
    first = report["nodes"]["gpu-h100-0"]
    assert first["evicted"] == [f"{ns}/running"] and float(first["waited_for_jobs_s"]) >= WAIT_S - 1, first
    assert jobs.read_namespaced_job("finishing", ns).status.succeeded == 1
    for node in lab.core.list_node().items:
        if node.metadata.name in NODES:
            assert not node.spec.unschedulable and RECORD not in (node.metadata.annotations or {})
            assert node.status.allocatable == allocatable[node.metadata.name]
            assert any(c.type == "Ready" and c.status == "True" for c in node.status.conditions)
    # Each node ran the CUDA smoke Job of its own before its cordon was lifted (kwok completes the pod).
    smoke = client.BatchV1Api(lab.api_client).list_namespaced_job("gpu-validation").items
    pinned = {job.spec.template.spec.node_selector.get("kubernetes.io/hostname"): job for job in smoke
              if job.spec.template.spec.node_selector}
    assert set(NODES) <= set(pinned) and all(pinned[name].status.succeeded == 1 for name in NODES), pinned
    metrics = (hosts / "driver-upgrade.prom").read_text()
    assert 'gpu_driver_upgrade_nodes{stage="done"} 3' in metrics

    # A second run finds every node at the target and changes nothing.
    rc, output, report = upgrade(lab, hosts, settings)
    assert rc == 0 and recap_changed(output) == 0, output[-4000:]
    assert sorted(report["plan"]["done"]) == sorted(NODES), report


def test_a_blocked_eviction_and_a_failed_validation_stop_the_rollout_within_its_budget_and_a_rerun_finishes(
        lab: Lab, hosts: Path, namespace):
    from kubernetes import client

    ns = namespace()
    # gpu-a100-0's training pod is protected by a PodDisruptionBudget that allows no eviction.
    lab.core.create_namespaced_pod(ns, {"metadata": {"name": "protected", "labels": {"app": "protected"},
                                                     "annotations": {cluster.HOLD_RUNNING_ANNOTATION: "true"}},
                                        "spec": {"nodeSelector": {"kubernetes.io/hostname": "gpu-a100-0"},
                                                 "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                                                 "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}})
    policy = client.PolicyV1Api(lab.api_client)
    policy.create_namespaced_pod_disruption_budget(ns, {"metadata": {"name": "protected"}, "spec": {
        "maxUnavailable": 0, "selector": {"matchLabels": {"app": "protected"}}}})
    wait_for(lambda: (lab.core.read_namespaced_pod("protected", ns).status.phase == "Running"
                      and policy.read_namespaced_pod_disruption_budget("protected", ns).status.observed_generation),
             60, "the protected pod running under its budget")
    # gpu-h100-0 will miss a GPU after its upgrade: its validation fails.
    fault = labctl("fault", "gpu-h100-0", "--missing-gpu", "7")
    assert fault.returncode == 0, fault.stdout
    before = {name: node_driver(name) for name in NODES}
    # Two at a time, one failure allowed.
    settings = {"gpu_driver_upgrade_branch": "595", "gpu_driver_upgrade_max_unavailable": 2,
                "gpu_driver_upgrade_max_failed_nodes": 1, "gpu_driver_upgrade_eviction_timeout": 10,
                "gpu_driver_upgrade_validation_timeout": 10}
    try:
        rc, output, report = upgrade(lab, hosts, settings)
        assert rc != 0, output[-4000:]
        # The first batch (gpu-a100-0, gpu-h100-0) fails twice, beyond the budget of one: gpu-h100-1 is never touched.
        assert report["failed_now"] == ["gpu-a100-0", "gpu-h100-0"] and report["not_reached"] == ["gpu-h100-1"], report
        assert "the failure budget is spent (2 failed, 1 allowed): gpu-h100-1" in output
        assert "eviction refused" in report["nodes"]["gpu-a100-0"]["failure"], report["nodes"]
        assert "expected 8 GPU(s), found 7" in report["nodes"]["gpu-h100-0"]["failure"], report["nodes"]
        assert lab.core.read_namespaced_pod("protected", ns).metadata.deletion_timestamp is None  # never forced
        listed = {n.metadata.name: n for n in lab.core.list_node().items}
        for name in ("gpu-a100-0", "gpu-h100-0"):
            assert listed[name].spec.unschedulable and listed[name].metadata.labels[STATE] == "upgrade-failed"
        untouched = listed["gpu-h100-1"]
        assert not untouched.spec.unschedulable and node_driver("gpu-h100-1") == before["gpu-h100-1"]
        assert untouched.metadata.labels[STATE] == "upgrade-required"

        # Fixed: the budget lifted, the GPU back. A re-run without retry_failed leaves the failed nodes alone, and
        # as they hold both slots it takes no other node (and says so); with it, every node is done.
        policy.delete_namespaced_pod_disruption_budget("protected", ns)
        assert labctl("fault", "gpu-h100-0", "--clear").returncode == 0
        rc, output, report = upgrade(lab, hosts, settings)
        assert rc != 0 and report["plan"]["failed_before"] == ["gpu-a100-0", "gpu-h100-0"], output[-4000:]
        assert "2 already are (gpu-a100-0, gpu-h100-0): gpu-h100-1 not taken out" in output
        rc, output, report = upgrade(lab, hosts, {**settings, "gpu_driver_upgrade_retry_failed": True})
        assert rc == 0 and report["upgraded"] == list(NODES), output[-4000:]
        listed = {n.metadata.name: n for n in lab.core.list_node().items}
        for name in NODES:
            assert node_driver(name).startswith("595.") and not listed[name].spec.unschedulable
            assert listed[name].metadata.labels[STATE] == "upgrade-done"
    finally:
        labctl("fault", "gpu-h100-0", "--clear")
