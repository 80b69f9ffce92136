"""The validation report filter: the verdict, the problems it gathers and the readable summary."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from conftest import load_filter_plugin

from ansible_collections.gpu_ops.cluster.plugins.module_utils import support_matrix

filters = load_filter_plugin("gpu_validation")
report = filters.gpu_validation_report

HEALTHY_HOST = {"healthy": True, "gpu_count": 4, "driver_version": "580.95.05", "problems": [],
                "gpus": [{"name": "NVIDIA A100-SXM4-40GB"}] * 4, "error_kind": None}
CLUSTER = {"healthy": True, "problems": [], "warnings": ["gpu-0: cordoned (unschedulable)"],
           "nodes": {"gpu-0": {"present": True, "ready": True, "unschedulable": True,
                               "allocatable": {"nvidia.com/gpu": 4}, "expected": {"nvidia.com/gpu": 4}}},
           "quotas": [{"namespace": "team-a", "quota": "gpus", "resource": "requests.nvidia.com/gpu", "hard": 8,
                       "used": 2}], "pending_gpu_pods": []}
SMOKE = {"ran": True, "succeeded": True, "failed": False, "node": "gpu-0", "image": "cuda:vectoradd", "conditions": []}


def test_everything_healthy_passes_with_a_readable_summary():
    result = report({"gpu-0": HEALTHY_HOST}, CLUSTER, SMOKE, "2026-12-06")
    assert result["passed"] and result["problems"] == []
    assert result["warnings"] == ["gpu-0: cordoned (unschedulable)"]
    text = result["summary"]
    assert "gpu-0: 4 GPU(s) NVIDIA A100-SXM4-40GB, driver 580.95.05 (healthy)" in text
    assert "gpu-0: Ready, allocatable nvidia.com/gpu=4 (expected nvidia.com/gpu=4), cordoned" in text
    assert "quota team-a/gpus: requests.nvidia.com/gpu used 2 of 8" in text
    assert "succeeded on gpu-0 (cuda:vectoradd)" in text and text.rstrip().endswith("cordoned (unschedulable)")
    assert "Verdict: PASSED" in text


def test_problems_from_every_part_fail_the_verdict():
    host_error = {"error_kind": "version_mismatch", "error": "Failed to initialize NVML:  Driver/library version "
                  "mismatch", "advice": "reboot or reload the nvidia kernel module"}
    unhealthy = dict(HEALTHY_HOST, healthy=False, problems=["expected 8 GPUs, found 4"])
    cluster = dict(CLUSTER, healthy=False, problems=["gpu-0: allocatable nvidia.com/gpu is 4, expected 16"])
    smoke = {"ran": True, "succeeded": False, "failed": True,
             "conditions": [{"type": "Failed", "reason": "BackoffLimitExceeded", "message": "Job has reached the "
                             "specified backoff limit"}]}
    result = report({"gpu-0": host_error, "gpu-1": unhealthy, "gpu-2": {}}, cluster, smoke)
    assert not result["passed"]
    assert result["problems"] == [
        "gpu-0: version_mismatch: Failed to initialize NVML: Driver/library version mismatch "
        "(reboot or reload the nvidia kernel module)",
        "gpu-1: expected 8 GPUs, found 4",
        "gpu-0: allocatable nvidia.com/gpu is 4, expected 16",
        "CUDA smoke Job failed: Job has reached the specified backoff limit",
    ]
    assert "gpu-2: not checked" in result["summary"] and "FAILED (4 problem(s))" in result["summary"]


def test_a_smoke_job_that_never_finishes_is_a_problem_and_one_not_run_is_not():
    assert report({}, {}, {"ran": True, "succeeded": False, "failed": False})["problems"] == [
        "CUDA smoke Job did not finish in time"]
    result = report({}, {}, {"ran": False, "reason": "check mode (the Job would be created)"})
    assert result["passed"] and "not run: check mode" in result["summary"]


def test_bad_input_names_the_argument():
    with pytest.raises(AnsibleFilterError, match="hosts must be a mapping"):
        report(["gpu-0"], {}, {})


def test_expected_counts_prefer_the_inventory_then_the_facts():
    hostvars = {
        "a": {"gpu_validation_expected_gpu_count": 8, "ansible_facts": {"nvidia_gpu": {"gpu_count": 7}}},
        "b": {"ansible_facts": {"nvidia_gpu": {"gpu_count": 4}}},
        "c": {"ansible_facts": {}},
        "d": {"gpu_validation_expected_gpu_count": 0, "ansible_facts": {"nvidia_gpu": {"gpu_count": 2}}},
        "e": {"gpu_validation_expected_gpu_count": "2"},
    }
    assert filters.gpu_expected_counts(["a", "b", "c", "d", "e"], hostvars) == {
        "a": 8, "b": 4, "c": None, "d": 0, "e": 2}
    assert filters.gpu_expected_counts(None, hostvars) == {}
    assert filters.gpu_expected_counts(["unknown"], hostvars) == {"unknown": None}


def test_expected_counts_refuse_a_count_that_is_not_a_number():
    with pytest.raises(AnsibleFilterError, match=r"hostvars\['a'\].gpu_validation_expected_gpu_count='eight'"):
        filters.gpu_expected_counts(["a"], {"a": {"gpu_validation_expected_gpu_count": "eight"}})


def test_a_dra_node_and_pending_claims_in_the_summary():
    dra_node = {"present": True, "ready": True, "unschedulable": False, "allocatable": {}, "expected": {},
                "allocation_mode": "dra",
                "dra": {"driver": "gpu.nvidia.com", "found": {"devices": {"gpu": 8}, "total": 8, "gpus": 8, "slices": 1},
                        "expected": None, "expected_gpus": 8, "allocated": 5}}
    message = "0/6 nodes are available: 3 cannot allocate all claims."
    cluster = dict(CLUSTER, nodes={"dra-0": dra_node}, pending_claims=[
        {"namespace": "t", "pod": "nine", "claim": "nine", "template": None, "exists": True, "requests": [],
         "reason": "Unschedulable", "message": message}])
    text = report({}, cluster, SMOKE)["summary"]
    assert "dra-0: Ready, dra mode, ResourceSlice devices gpu=8 on 8 GPUs (expected 8 GPUs), 5 allocated" in text
    assert "pending ResourceClaims: 1" in text
    assert "t/nine waits for claim nine: " + message in text


def test_a_driver_past_its_branchs_end_is_a_warning_not_a_problem():
    ended = dict(HEALTHY_HOST, driver_version="535.261.03")
    result = report({"gpu-1": ended, "gpu-0": HEALTHY_HOST, "gpu-2": {}}, CLUSTER, SMOKE, "2026-12-06")
    line = support_matrix.driver_branch_eol_warning("535.261.03", support_matrix.parse_day("2026-12-06"))
    assert result["passed"] and result["problems"] == []
    assert result["warnings"] == ["gpu-1: driver 535.261.03: " + line, "gpu-0: cordoned (unschedulable)"]
    assert line.startswith("driver branch 535 (long-term) reached its end of life in June 2026")
    assert "  - gpu-1: driver 535.261.03: " + line in result["summary"]
    # Before the branch's last month is over there is nothing to warn about.
    assert report({"gpu-1": ended}, {}, {}, "2026-06-30")["warnings"] == []


def test_without_a_day_the_report_judges_on_the_controllers_clock_and_refuses_a_bad_day():
    assert report({"gpu-0": dict(HEALTHY_HOST, driver_version="470.256.02")}, {}, {})["warnings"] != []
    with pytest.raises(AnsibleFilterError, match="today='6/12/2026' is not a YYYY-MM-DD date"):
        report({}, {}, {}, "6/12/2026")
