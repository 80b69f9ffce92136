"""playbooks/validate.yml's cluster part against the lab's real API server: the cluster check module, the CUDA smoke
Job (completed by kwok: it proves admission and scheduling onto a GPU node, not CUDA), the report and the verdict."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import Lab, run_playbook, wait_for

GPU = "nvidia.com/gpu"


def validate(lab: Lab, report_dir: Path, *extra: str) -> tuple[int, dict, str]:
    rc, output = run_playbook(lab, "validate.yml", "--limit", "cluster_control",
                              "-e", f"gpu_validation_report_dir={report_dir}", *extra)
    report = json.loads((report_dir / "validation.json").read_text()) if (report_dir / "validation.json").exists() \
        else {}
    return rc, report, output


def test_validation_passes_on_the_lab_and_reports_pending_pods_and_quota(lab: Lab, namespace, tmp_path):
    ns = namespace()
    lab.core.create_namespaced_resource_quota(ns, {"metadata": {"name": "gpus"},
                                                   "spec": {"hard": {f"requests.{GPU}": "32"}}})
    # The quota controller's first count of a new quota races a pod created before it lands: a count from a cache
    # that has not seen the pod yet overwrites what admission added, until the next full resync (minutes). Create
    # the pod once the controller has counted the empty namespace; admission then adds the pod's 16 itself.
    wait_for(lambda: (lab.core.read_namespaced_resource_quota("gpus", ns).status.used or {}).get(f"requests.{GPU}")
             == "0", 120, "the quota controller's first count")
    lab.core.create_namespaced_pod(ns, {"metadata": {"name": "too-big"}, "spec": {"containers": [
        {"name": "main", "image": "registry.k8s.io/pause:3.10", "resources": {"limits": {GPU: "16"}}}]}})
    wait_for(lambda: lab.core.read_namespaced_pod("too-big", ns).status.conditions, 60, "the scheduler's verdict")
    # The check reports what the server says, so wait until the server says it.
    wait_for(lambda: (lab.core.read_namespaced_resource_quota("gpus", ns).status.used or {}).get(f"requests.{GPU}")
             == "16", 120, "the quota's status to count the pod")

    rc, report, output = validate(lab, tmp_path)

    assert rc == 0, output[-3000:]
    assert report["passed"] and report["problems"] == []
    nodes = report["cluster"]["nodes"]
    assert {name: node["allocatable"].get(GPU) for name, node in nodes.items()} == {
        "gpu-h100-0": 8, "gpu-h100-1": 8, "gpu-a100-0": 4}
    assert nodes["gpu-a100-0"]["expected"] == {GPU: 4}
    assert report["smoke"]["succeeded"] and report["smoke"]["node"] in lab.config.gpu_nodes()
    (pending,) = [p for p in report["cluster"]["pending_gpu_pods"] if p["namespace"] == ns]
    assert pending["requests"] == {GPU: 16} and "Insufficient nvidia.com/gpu" in pending["message"]
    assert {"namespace": ns, "quota": "gpus", "resource": f"requests.{GPU}", "hard": 32, "used": 16} in \
        report["cluster"]["quotas"]
    assert "Verdict: PASSED" in (tmp_path / "validation.txt").read_text()


def test_a_node_whose_allocatable_falls_short_fails_validation(lab: Lab, tmp_path):
    """The classic: a time-slicing config was asked for a node but never applied (the plugin has no such config)."""
    node = "gpu-a100-0"
    sharing = {"it-time-sliced": {"version": "v1", "sharing": {"timeSlicing": {"resources": [
        {"name": GPU, "replicas": 4}]}}}}
    lab.core.patch_node(node, {"metadata": {"labels": {"nvidia.com/device-plugin.config": "it-time-sliced"}}})
    try:
        # The double has no such config either (no ConfigMap in the lab), so the node keeps advertising 4 GPUs.
        rc, report, output = validate(lab, tmp_path, "-e", json.dumps({"gpu_validation_sharing_configs": sharing}))
    finally:
        lab.core.patch_node(node, {"metadata": {"labels": {"nvidia.com/device-plugin.config": None}}})
    assert rc != 0, output[-3000:]
    assert "GPU validation failed" in output
    assert report["passed"] is False
    assert f"{node}: allocatable nvidia.com/gpu is 4, expected 16 (4 GPUs, config it-time-sliced)" in report["problems"]
    assert [p for p in report["problems"] if not p.startswith(node)] == []
