"""The cluster check's logic on Kubernetes objects in their JSON form, and the module's argument handling.

Objects are shaped as the API server returns them (the integration tests run the module against the lab's real
kube-apiserver).
"""

from __future__ import annotations

from typing import Any, Dict, List

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ansible_collections.gpu_ops.cluster.plugins.module_utils.device_plugin_config import config_problems
from ansible_collections.gpu_ops.cluster.plugins.module_utils.gpu_cluster import (
    check_cluster,
    expected_resources,
    parse_selector,
    pod_gpu_requests,
    quota_rows,
)

from conftest import ModuleRunner, load_ansible_module, load_filter_plugin

DAEMONS = {
    "device_plugin": {"namespace": "nvidia-device-plugin", "selector": "app=nvidia-device-plugin", "required": False},
    "dcgm_exporter": {"namespace": "gpu-monitoring", "selector": "app=dcgm-exporter", "required": False},
}
TIME_SLICED = {"version": "v1", "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}}


def node(name: str, gpus: int | None, *, ready: bool = True, labels: Dict[str, str] | None = None,
         unschedulable: bool = False, capacity: int | None = None, extra: Dict[str, str] | None = None) -> Dict[str, Any]:
    allocatable = {"cpu": "96", "memory": "1Ti", "pods": "110"}
    if gpus is not None:
        allocatable["nvidia.com/gpu"] = str(gpus)
    allocatable.update(extra or {})
    cap = dict(allocatable)
    if capacity is not None:
        cap["nvidia.com/gpu"] = str(capacity)
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
        "spec": {"unschedulable": True} if unschedulable else {},
        "status": {"capacity": cap, "allocatable": allocatable,
                   "conditions": [{"type": "Ready", "status": "True" if ready else "Unknown"}]},
    }


def pod(namespace: str, name: str, node_name: str | None, gpus: int = 0, *, phase: str = "Running",
        labels: Dict[str, str] | None = None, unscheduled: str | None = None) -> Dict[str, Any]:
    container: Dict[str, Any] = {"name": "main", "image": "x"}
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    conditions = [{"type": "Ready", "status": "True" if phase == "Running" else "False"}]
    if unscheduled:
        conditions.append({"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                           "message": unscheduled})
    spec: Dict[str, Any] = {"containers": [container]}
    if node_name:
        spec["nodeName"] = node_name
    return {"metadata": {"namespace": namespace, "name": name, "labels": labels or {}}, "spec": spec,
            "status": {"phase": phase, "conditions": conditions}}


def check(nodes: List[Dict[str, Any]], pods: List[Dict[str, Any]] = (), quotas: List[Dict[str, Any]] = (), *,
          expected: List[Dict[str, Any]] | None = None, configs: Dict[str, Any] | None = None,
          daemons: Dict[str, Any] | None = None) -> Dict[str, Any]:
    return check_cluster(nodes, list(pods), list(quotas), expected_nodes=expected or [],
                         sharing_configs=configs or {}, default_config="default",
                         gpu_node_selector="nvidia.com/gpu.present=true", daemons=daemons or DAEMONS)


GPU_LABELS = {"nvidia.com/gpu.present": "true"}


def test_a_healthy_lab_shaped_cluster():
    nodes = [node("gpu-h100-0", 8, labels=GPU_LABELS), node("gpu-a100-0", 4, labels=GPU_LABELS), node("cpu-0", None)]
    pods = [pod("team-a", "train", "gpu-h100-0", 2)]
    result = check(nodes, pods, expected=[{"name": "gpu-h100-0", "gpus": 8}, {"name": "gpu-a100-0", "gpus": 4}])
    assert result["healthy"] and result["problems"] == []
    assert result["node_count"] == 3 and result["gpu_node_count"] == 2
    assert result["nodes"]["gpu-h100-0"]["free"] == {"nvidia.com/gpu": 6}
    assert result["totals"] == {"nvidia.com/gpu": {"allocatable": 12, "requested": 2}}
    assert "cpu-0" not in result["nodes"]


def test_allocatable_short_of_gpus_times_replicas_names_both_numbers():
    nodes = [node("gpu-a100-0", 4, labels={**GPU_LABELS, "nvidia.com/device-plugin.config": "time-sliced"})]
    result = check(nodes, expected=[{"name": "gpu-a100-0", "gpus": 4}], configs={"time-sliced": TIME_SLICED})
    assert not result["healthy"]
    assert result["problems"] == ["gpu-a100-0: allocatable nvidia.com/gpu is 4, expected 16 (4 GPUs, config "
                                  "time-sliced)"]
    assert result["nodes"]["gpu-a100-0"]["expected"] == {"nvidia.com/gpu": 16}


def test_the_default_config_applies_to_unlabelled_nodes_and_rename_changes_the_resource():
    renamed = {"version": "v1", "sharing": {"timeSlicing": {"renameByDefault": True, "resources": [
        {"name": "nvidia.com/gpu", "replicas": 2}]}}}
    nodes = [node("gpu-0", None, labels=GPU_LABELS, extra={"nvidia.com/gpu.shared": "16"})]
    result = check(nodes, expected=[{"name": "gpu-0", "gpus": 8}], configs={"default": renamed})
    assert result["healthy"], result["problems"]
    assert result["nodes"]["gpu-0"]["sharing_config"] == "default"


def test_missing_node_not_ready_and_a_label_naming_no_config_are_problems():
    nodes = [node("gpu-1", 8, ready=False, labels={**GPU_LABELS, "nvidia.com/device-plugin.config": "nope"})]
    result = check(nodes, expected=[{"name": "gpu-0", "gpus": 8}, {"name": "gpu-1", "gpus": 8}])
    assert "gpu-0: expected GPU node is not in the cluster" in result["problems"]
    assert "gpu-1: node is not Ready" in result["problems"]
    assert any("nvidia.com/device-plugin.config=nope names no sharing config" in p for p in result["problems"])


def test_cordon_and_allocatable_below_capacity_are_warnings_not_problems():
    nodes = [node("gpu-0", 7, capacity=8, unschedulable=True, labels=GPU_LABELS)]
    result = check(nodes, expected=[{"name": "gpu-0", "gpus": 7}])
    assert result["healthy"]
    assert "gpu-0: cordoned (unschedulable)" in result["warnings"]
    assert "gpu-0: nvidia.com/gpu allocatable 7 differs from capacity 8" in result["warnings"]


def test_required_daemons_must_run_ready_on_every_gpu_node():
    daemons = {name: {**spec, "required": True} for name, spec in DAEMONS.items()}
    nodes = [node("gpu-0", 8, labels=GPU_LABELS), node("gpu-1", 8, labels=GPU_LABELS)]
    pods = [pod("nvidia-device-plugin", "dp-a", "gpu-0", labels={"app": "nvidia-device-plugin"}),
            pod("nvidia-device-plugin", "dp-b", "gpu-1", labels={"app": "nvidia-device-plugin"}, phase="Pending"),
            pod("other", "dp-c", "gpu-1", labels={"app": "nvidia-device-plugin"}),
            pod("gpu-monitoring", "dcgm-a", "gpu-0", labels={"app": "dcgm-exporter"})]
    result = check(nodes, pods, daemons=daemons)
    assert result["nodes"]["gpu-0"]["daemons"] == {"dcgm_exporter": "running", "device_plugin": "running"}
    assert result["nodes"]["gpu-1"]["daemons"] == {"dcgm_exporter": "missing", "device_plugin": "not_ready"}
    assert sorted(result["problems"]) == ["gpu-1: dcgm exporter pod missing", "gpu-1: device plugin pod not ready"]
    assert check(nodes, pods)["nodes"]["gpu-1"]["daemons"]["dcgm_exporter"] == "not_deployed"


def test_pending_gpu_pods_carry_the_schedulers_reason():
    message = "0/4 nodes are available: 3 Insufficient nvidia.com/gpu, 1 node(s) didn't match node affinity."
    pods = [pod("team-a", "big", None, 16, phase="Pending", unscheduled=message), pod("team-a", "cpu", None)]
    result = check([node("gpu-0", 8, labels=GPU_LABELS)], pods)
    assert result["pending_gpu_pods"] == [{"namespace": "team-a", "name": "big", "requests": {"nvidia.com/gpu": 16},
                                           "reason": "Unschedulable", "message": message}]
    assert any("team-a/big: Pending, asks nvidia.com/gpu=16: 0/4 nodes" in w for w in result["warnings"])


def test_quota_rows_keep_gpu_resources_only():
    quota = {"metadata": {"namespace": "team-a", "name": "gpus"},
             "spec": {"hard": {"requests.nvidia.com/gpu": "8", "pods": "10"}},
             "status": {"hard": {"requests.nvidia.com/gpu": "8", "pods": "10"},
                        "used": {"requests.nvidia.com/gpu": "3", "pods": "2"}}}
    assert quota_rows([quota]) == [{"namespace": "team-a", "quota": "gpus", "resource": "requests.nvidia.com/gpu",
                                    "hard": 8, "used": 3}]


def test_requests_sum_over_containers_and_limits_win():
    item = {"spec": {"containers": [
        {"resources": {"limits": {"nvidia.com/gpu": "2"}, "requests": {"nvidia.com/gpu": "2", "cpu": "1"}}},
        {"resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}}}, {}]}}
    assert pod_gpu_requests(item) == {"nvidia.com/gpu": 2, "nvidia.com/mig-1g.10gb": 1}


def test_expected_resources_per_config():
    assert expected_resources(8, None) == {"nvidia.com/gpu": 8}
    assert expected_resources(8, TIME_SLICED) == {"nvidia.com/gpu": 32}
    assert expected_resources(8, {"sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 3}]}}}) \
        == {"nvidia.com/gpu": 24}
    assert expected_resources(8, {"flags": {"migStrategy": "mixed"}}) == {}
    # The plugin reads a name without its prefix as the prefixed one (and the config check accepts it).
    assert expected_resources(8, {"sharing": {"timeSlicing": {"renameByDefault": True, "resources": [
        {"name": "gpu", "replicas": 4}]}}}) == {"nvidia.com/gpu.shared": 32}


@given(gpus=st.integers(1, 16), replicas=st.integers(1, 64), rename=st.booleans())
def test_expected_count_is_gpus_times_replicas(gpus, replicas, rename):
    config = {"sharing": {"timeSlicing": {"renameByDefault": rename, "resources": [
        {"name": "nvidia.com/gpu", "replicas": replicas}]}}}
    ((name, count),) = expected_resources(gpus, config).items()
    assert count == gpus * replicas and name.endswith(".shared") == rename


@pytest.mark.parametrize(("config", "message"), [
    ({"sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 0}]}}}, "replicas=0"),
    ({"sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": "4"}]}}}, "replicas='4'"),
    # The plugin refuses 1 replica: the cluster check used to accept it while the role's preflight refused it.
    ({"sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 1}]}}}, "at least 2"),
    ({"version": "v1", "sharing": {"timeSlicing": {"resources": []}}}, "non-empty list"),
    ({"version": "v1", "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}}, None),
    ({"sharing": {"timeSlicing": {"resources": [{"replicas": 2}]}, "mps": {"resources": [{"replicas": 2}]}}},
     "both set"),
    ("time-slicing", "allowed: a mapping"),
])
def test_the_cluster_check_and_the_role_judge_a_config_alike(config, message):
    """One validator (module_utils/device_plugin_config.py) for the cluster check and the role's preflight filter."""
    problems = config_problems("ts", config)
    if message is None:
        assert problems == []
    else:
        assert any(message in p for p in problems), problems
    role_filter = load_filter_plugin("device_plugin").device_plugin_config_problems
    assert role_filter({"ts": config}, "ts") == problems


def test_selectors():
    assert parse_selector("a=b, c!=d,e==f") == [("a", "=", "b"), ("c", "!=", "d"), ("e", "=", "f")]
    assert parse_selector("") == []
    with pytest.raises(ValueError, match="term 'a in \\(b\\)'"):
        parse_selector("a in (b)")


@pytest.fixture
def module(patched_ansible_module) -> ModuleRunner:
    return ModuleRunner(load_ansible_module("gpu_cluster_check"), patched_ansible_module)


def test_module_refuses_a_bad_selector_before_reading_the_cluster(module):
    result = module.fail({"gpu_node_selector": "gpu in (yes)"})
    assert result["msg"].startswith("gpu_node_selector: label selector 'gpu in (yes)'")


def test_module_reports_an_unreachable_cluster_as_data(module, tmp_path):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: https://127.0.0.1:1}}]\n"
                          "users: [{name: u, user: {}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\n"
                          "current-context: c\n")
    result = module.exit({"kubeconfig": str(kubeconfig)})
    facts = result["ansible_facts"]["gpu_cluster"]
    assert facts["healthy"] is False and facts["problems"][0].startswith("cannot read the cluster")
    assert module.fail({"kubeconfig": str(kubeconfig), "fail_on_unmet": True})["msg"].startswith("cannot read")


def test_mps_configs_are_judged_with_the_mps_root_the_plugin_runs_with():
    """validate.yml hands the check the device plugin role's nvidia_device_plugin_mps_root: a config repeating that
    root in flags.mpsRoot is what the role deployed, and another root is the role's project rule in both."""
    config = {"version": "v1", "flags": {"mpsRoot": "/srv/mps"},
              "sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}}
    nodes: List[Dict[str, Any]] = []

    def problems(root: str) -> List[str]:
        return check_cluster(nodes, [], [], expected_nodes=[], sharing_configs={"mps": config}, default_config="mps",
                             sharing_mps_root=root, gpu_node_selector="nvidia.com/gpu.present=true",
                             daemons=DAEMONS)["problems"]

    assert problems("/srv/mps") == []
    assert any("flags.mpsRoot='/srv/mps'; allowed: unset, or '/run/nvidia/mps' (project rule" in p
               for p in problems("/run/nvidia/mps"))
    role_filter = load_filter_plugin("device_plugin").device_plugin_config_problems
    assert role_filter({"mps": config}, "mps", None, "/srv/mps") == []
