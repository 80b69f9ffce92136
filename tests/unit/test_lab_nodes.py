"""The lab's node container helpers: inventory parsing and the main job's summary table."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "lab"))

import nodes  # noqa: E402


def test_node_names_come_from_the_gpu_nodes_group():
    inventory = {"gpu_nodes": {"hosts": ["gpu-h100-0", "gpu-a100-0"]}, "all": {"children": ["gpu_nodes", "ungrouped"]}}
    assert nodes.node_names(inventory) == ["gpu-h100-0", "gpu-a100-0"]
    assert nodes.node_names({"all": {}}) == []


def test_lab_inventory_lists_the_node_containers():
    text = nodes.INVENTORY.read_text(encoding="utf-8")
    for name in ("gpu-h100-0", "gpu-h100-1", "gpu-a100-0"):
        assert f"{name}:" in text
    assert "containers.podman.podman" in text


def test_summary_table_rows():
    report = {
        "gpu-h100-0": {
            "nvidia_driver": {"managed": {"source": "distribution", "branch": "535", "kernel_modules": "open",
                                          "packages": ["a", "b", "c"], "held": True},
                              "in_container": True, "loaded_version": None, "action": "none"},
            "nvidia_gpu": {"error_kind": "driver_not_loaded", "error": "NVIDIA-SMI has failed", "healthy": False},
        },
        "gpu-a100-0": {
            "nvidia_driver": {"managed": {"source": "cuda_repo", "branch": "580", "kernel_modules": "open",
                                          "packages": ["a"], "held": False},
                              "in_container": False, "loaded_version": "570.1", "action": "reboot",
                              "action_reason": "loaded 570.1, installed 580.2"},
            "nvidia_gpu": {"error_kind": None, "healthy": True, "gpu_count": 4},
            "cuda_toolkit": {"versions": ["12.6", "12.8"], "default_version": "12.8"},
            "nvidia_container_toolkit": {"version": "1.18.1", "runtimes": ["containerd", "docker"],
                                         "default_for": ["docker"]},
        },
    }
    lines = nodes.summary_table(report).splitlines()
    assert lines[0].split()[0] == "node" and lines[0].rstrip().endswith("GPU check")
    assert lines[2].startswith("gpu-a100-0") and "cuda_repo/580 (open)" in lines[2] and " no " in lines[2]
    assert "reboot: loaded 570.1, installed 580.2" in lines[2] and lines[2].endswith("healthy, 4 GPUs")
    assert "12.6, 12.8*" in lines[2] and "1.18.1: containerd, docker (default)" in lines[2]
    assert lines[3].startswith("gpu-h100-0") and "distribution/535 (open)" in lines[3]
    assert "not loaded (container)" in lines[3]
    assert lines[3].endswith("driver_not_loaded: NVIDIA-SMI has failed")


def test_gpu_check_column():
    assert nodes.gpu_check({}) == "not run"
    assert nodes.gpu_check({"healthy": False, "error_kind": None, "problems": ["expected 8 GPUs, found 7"]}) == (
        "expected 8 GPUs, found 7")


def test_share_debs_links_every_package_into_every_directory(tmp_path):
    first, second, third = (tmp_path / name for name in ("shared", "node-a", "node-b"))
    for directory in (first, second, third):
        directory.mkdir()
    (first / "a.deb").write_bytes(b"a")
    (second / "b.deb").write_bytes(b"b")
    (second / "lock").write_bytes(b"")
    assert nodes.share_debs([first, second, third]) == 4
    for directory in (first, second, third):
        assert sorted(p.name for p in directory.glob("*.deb")) == ["a.deb", "b.deb"]
    assert (third / "a.deb").stat().st_ino == (first / "a.deb").stat().st_ino
    assert not (first / "lock").exists()
    assert nodes.share_debs([first, second, third]) == 0


def test_summary_merges_the_cluster_view_and_the_validation_verdict():
    report = nodes.merge_reports({"gpu-a100-0": {"nvidia_driver": {}}},
                                 {"hosts": {"gpu-a100-0": {"healthy": True, "gpu_count": 4, "error_kind": None}}})
    rows = [{"name": "gpu-a100-0", "ready": "Ready", "gpus": "nvidia.com/gpu=4"},
            {"name": "cpu-0", "ready": "Ready", "gpus": "-"}]
    lines = nodes.summary_table(report, rows).splitlines()
    assert lines[2].startswith("cpu-0") and lines[2].endswith("no host (simulated only)")
    assert "nvidia.com/gpu=4" in lines[3] and lines[3].endswith("healthy, 4 GPUs")
    assert nodes.verdict_lines({"passed": True, "smoke": {"ran": True, "succeeded": True, "node": "gpu-h100-0"}}) == [
        "validation: PASSED (hosts, cluster, CUDA smoke Job succeeded on gpu-h100-0; details in "
        "reports/validation.txt)"]
    failed = nodes.verdict_lines({"passed": False, "problems": ["gpu-a100-0: node is not Ready"], "smoke": {}})
    assert failed == ["validation: FAILED, 1 problem(s) (reports/validation.txt):", "  - gpu-a100-0: node is not Ready"]
    assert nodes.verdict_lines({}) == ["validation: not run (reports/validation.json is missing)"]
