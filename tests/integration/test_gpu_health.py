"""playbooks/health.yml on the lab (issue 17, docs/gpu_health.md): faults injected into the node containers' GPU
doubles (`labctl fault`: an Xid in the kernel log double, uncorrected ECC errors, a GPU fallen off the bus) make the
nodes' facts unhealthy; the control host taints those nodes, the real kube-scheduler stops placing GPU pods there,
a person's cordon stays, the circuit breaker holds when every node reports a fault, and clearing the faults releases
the nodes. The node containers are started here when the main job's test has not left them running."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

import nodes
from conftest import ROOT, Lab, recap_changed, run_playbook, wait_for
from dcgm_exporter_double import ExporterDouble, LocalPrometheus, Series

LAB_INVENTORY = "inventories/lab/hosts.yml"
NODES = ("gpu-a100-0", "gpu-h100-0", "gpu-h100-1")
TAINT = "gpu-cluster.dev/gpu-unhealthy"
ANNOTATION = "gpu-cluster.dev/gpu-health"


def labctl(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{ROOT / '.venv' / 'bin'}:{os.environ['PATH']}"}
    return subprocess.run([str(ROOT / ".venv" / "bin" / "python"), "lab/labctl.py", *args], cwd=ROOT, env=env,
                          text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=1800, check=False)


def fault(*args: str) -> None:
    result = labctl("fault", *args)
    assert result.returncode == 0, result.stdout


def health(lab: Lab, report_dir: Path, *extra: str) -> tuple[int, str, dict]:
    rc, output = run_playbook(lab, "health.yml", "-i", LAB_INVENTORY, "-e", f"gpu_health_report_dir={report_dir}",
                              *extra)
    report = report_dir / "health.json"
    return rc, output, json.loads(report.read_text()) if report.exists() else {}


def quarantined(lab: Lab) -> dict[str, list[str]]:
    """Node -> the problems its annotation names, for every node with the quarantine taint."""
    found = {}
    for node in lab.core.list_node().items:
        if any(taint.key == TAINT for taint in node.spec.taints or []):
            note = (node.metadata.annotations or {}).get(ANNOTATION)
            found[node.metadata.name] = json.loads(note)["problems"] if note else []
    return found


@pytest.fixture(scope="module")
def hosts(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    had = set(nodes.container_states())
    if not set(NODES) <= had:
        up = labctl("up")
        assert up.returncode == 0, up.stdout[-3000:]
    report_dir = tmp_path_factory.mktemp("health")
    yield report_dir
    for name in NODES:
        labctl("fault", name, "--clear")
    health(lab, report_dir, "-e", '{"gpu_health_max_unhealthy_percent": 100}')
    if not set(NODES) <= had and not os.environ.get("GPU_LAB_KEEP"):
        nodes.down()


def test_unhealthy_gpus_are_quarantined_away_from_gpu_pods_and_released_once_fixed(lab: Lab, hosts: Path, namespace):
    rc, output, report = health(lab, hosts)
    assert rc == 0, output[-3000:]
    assert {name: verdict["healthy"] for name, verdict in report["nodes"].items()} == dict.fromkeys(NODES, True)
    assert quarantined(lab) == {}
    # A person cordons a node for their own reasons; the quarantine never undoes it.
    lab.core.patch_node("gpu-a100-0", {"spec": {"unschedulable": True}})
    try:
        fault("gpu-h100-0", "--xid", "3=79")
        fault("gpu-a100-0", "--ecc-uncorrected", "0=2")
        # Check mode predicts the quarantine and changes nothing.
        rc, output, report = health(lab, hosts, "--check", "-e", '{"gpu_health_max_unhealthy_percent": 100}')
        assert rc == 0 and recap_changed(output) >= 1, output[-3000:]
        assert report["check_mode"] is True and report["quarantined"] == ["gpu-a100-0", "gpu-h100-0"], report
        assert quarantined(lab) == {}

        rc, output, report = health(lab, hosts, "-e", '{"gpu_health_max_unhealthy_percent": 100}')
        assert rc == 0, output[-3000:]
        held = quarantined(lab)
        assert sorted(held) == ["gpu-a100-0", "gpu-h100-0"] and report["quarantined"] == sorted(held)
        assert any("Xid 79 (GPU has fallen off the bus)" in problem and problem.startswith("GPU 3 ")
                   for problem in held["gpu-h100-0"]), held
        assert any("uncorrected ECC errors" in problem and problem.startswith("GPU 0 ")
                   for problem in held["gpu-a100-0"]), held
        assert lab.core.read_node("gpu-a100-0").spec.unschedulable is True
        # The same faults again: nothing changes.
        rc, output, _ = health(lab, hosts, "-e", '{"gpu_health_max_unhealthy_percent": 100}')
        assert rc == 0 and recap_changed(output) == 0, output[-3000:]

        # The real scheduler keeps GPU pods off the quarantined H100: a whole-node job fits only gpu-h100-1.
        ns = namespace()
        for index in range(2):
            lab.core.create_namespaced_pod(ns, {"metadata": {"name": f"eight-{index}"}, "spec": {
                "nodeSelector": {"gpu-lab.dev/pool": "gpu-h100"}, "containers": [{
                    "name": "main", "image": "registry.k8s.io/pause:3.10",
                    "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}})

        def placed() -> dict[str, str]:
            pods = {pod.metadata.name: pod for pod in lab.core.list_namespaced_pod(ns).items}
            return {name: pod.spec.node_name or "" for name, pod in pods.items()}

        wait_for(lambda: sorted(placed().values()) == ["", "gpu-h100-1"], 60, "one pod on gpu-h100-1, one Pending")
        # The scheduler says why: one H100 node has a taint the pod does not tolerate (1.37's message no longer names
        # the key; the quarantine's is the only taint in that pool). Its event may follow the pod's status a moment.
        wait_for(lambda: any(event.reason == "FailedScheduling"
                             and "1 node(s) had untolerated taint(s)" in (event.message or "")
                             for event in lab.core.list_namespaced_event(ns).items),
                 30, "a FailedScheduling event naming one node with an untolerated taint")

        # Fixed (the GPU replaced, the node rebooted): released, the person's cordon still there.
        fault("gpu-h100-0", "--clear")
        fault("gpu-a100-0", "--clear")
        rc, output, report = health(lab, hosts)
        assert rc == 0, output[-3000:]
        assert quarantined(lab) == {} and sorted(report["released"]) == ["gpu-a100-0", "gpu-h100-0"]
        node = lab.core.read_node("gpu-a100-0")
        assert node.spec.unschedulable is True and ANNOTATION not in (node.metadata.annotations or {})
    finally:
        lab.core.patch_node("gpu-a100-0", {"spec": {"unschedulable": None}})


def test_the_circuit_breaker_holds_when_every_node_reports_a_fault(lab: Lab, hosts: Path):
    fault("gpu-a100-0", "--missing-gpu", "1")
    fault("gpu-h100-0", "--xid", "0=48")
    fault("gpu-h100-1", "--xid", "5=95")
    # A third of the three GPU nodes: one may be quarantined; the other two are reported, not tainted.
    rc, output, report = health(lab, hosts, "-e", '{"gpu_health_max_unhealthy_percent": 34}')
    assert rc == 0, output[-3000:]
    assert list(quarantined(lab)) == ["gpu-a100-0"]
    assert quarantined(lab)["gpu-a100-0"] == ["expected 4 GPU(s), found 3"]
    assert report["held_back"] == ["gpu-h100-0", "gpu-h100-1"] and report["limit"] == 1
    assert "held back by the circuit breaker (at most 1 of 3 GPU nodes quarantined): gpu-h100-0, gpu-h100-1" in output
    for name in NODES:
        fault(name, "--clear")
    rc, output, report = health(lab, hosts)
    assert rc == 0 and quarantined(lab) == {} and report["released"] == ["gpu-a100-0"], output[-3000:]


def test_the_dcgm_exporters_series_through_prometheus_quarantine_even_an_unreached_node(lab: Lab, hosts: Path):
    """A real Prometheus scrapes the lab's DOUBLE of the DCGM exporter: a GPU it reports with Xid 79 gets its node
    quarantined though the run does not reach that node; only the node's own check, healthy again, releases it."""
    with ExporterDouble() as exporter, LocalPrometheus(exporter.target) as prometheus:
        exporter.set_series([Series("DCGM_FI_DEV_XID_ERRORS", "gpu-h100-1", 2, 79),
                             Series("DCGM_FI_DEV_XID_ERRORS", "gpu-h100-0", 0, 13)])  # the application's Xid
        prometheus.wait_for("DCGM_FI_DEV_XID_ERRORS == 79")
        settings = json.dumps({"gpu_health_max_unhealthy_percent": 100, "gpu_health_prometheus_url": prometheus.url})
        rc, output, report = health(lab, hosts, "-e", settings, "--limit", "cluster_control,gpu-h100-0")
        assert rc == 0, output[-3000:]
        assert quarantined(lab) == {"gpu-h100-1": [
            "GPU 2 (GPU-gpu-h100-1-2): the DCGM exporter reports Xid 79 (GPU has fallen off the bus)"]}
        assert report["prometheus"]["error"] == "" and list(report["prometheus"]["problems"]) == ["gpu-h100-1"]
        # The exporter reports the GPU healthy again, but the node itself has not been checked: it stays.
        exporter.set_series([Series("DCGM_FI_DEV_XID_ERRORS", "gpu-h100-1", 2, 0)])
        prometheus.wait_for("DCGM_FI_DEV_XID_ERRORS == 0")
        rc, output, report = health(lab, hosts, "-e", settings, "--limit", "cluster_control,gpu-h100-0")
        assert rc == 0 and list(quarantined(lab)) == ["gpu-h100-1"], output[-3000:]
        rc, output, report = health(lab, hosts, "-e", settings)
        assert rc == 0 and quarantined(lab) == {} and report["released"] == ["gpu-h100-1"], output[-3000:]
    # A Prometheus that cannot be asked is reported; the nodes' own checks still decide.
    rc, output, report = health(lab, hosts, "-e", json.dumps({"gpu_health_prometheus_url": "http://127.0.0.1:9"}))
    assert rc == 0 and report["prometheus"]["error"].startswith("cannot ask http://127.0.0.1:9"), output[-3000:]
