"""roles/gpu_scheduling's labels from real GPU facts (recorded nvidia-smi XML parsed by the facts module's own code)
and its checks of labels and RuntimeClass settings."""

from __future__ import annotations

from pathlib import Path

import pytest
from ansible_collections.gpu_ops.cluster.plugins.module_utils.nvidia_gpu import parse_query_xml

from conftest import load_filter_plugin

filters = load_filter_plugin("gpu_scheduling")
FIXTURES = Path(__file__).parent / "fixtures" / "nvidia_smi"


def facts(fixture: str) -> dict:
    parsed, error = parse_query_xml((FIXTURES / fixture).read_text())
    assert error is None
    return dict(parsed, gpu_count=len(parsed["gpus"]))


@pytest.mark.parametrize("fixture, product, memory, driver", [
    ("a100-sxm4-mig.xml", "NVIDIA-A100-SXM4-80GB", "81920", "535.54.03"),
    ("tesla-t4.xml", "Tesla-T4", "15360", "515.105.01"),
    ("rtx-3080.xml", "NVIDIA-GeForce-RTX-3080", "10240", "536.40"),
])
def test_labels_from_recorded_gpus_match_gpu_feature_discovery(fixture, product, memory, driver):
    labels = filters.gpu_node_labels(facts(fixture))
    assert labels == {"nvidia.com/gpu.count": str(len(facts(fixture)["gpus"])), "nvidia.com/gpu.product": product,
                      "nvidia.com/gpu.memory": memory, "nvidia.com/cuda.driver-version.full": driver}


def test_no_gpu_no_labels():
    assert filters.gpu_node_labels({}) == {}
    assert filters.gpu_node_labels({"gpu_count": 0, "gpus": []}) == {}
    assert filters.gpu_node_labels(None) == {}


def test_product_names_become_label_values():
    assert filters.label_value("NVIDIA H100 80GB HBM3") == "NVIDIA-H100-80GB-HBM3"
    assert filters.label_value("  Quadro RTX 6000/8000 (rev. a1) ") == "Quadro-RTX-60008000-rev.-a1"
    assert len(filters.label_value("x" * 100)) == 63


def test_bad_labels_and_runtime_settings_are_named():
    assert filters.gpu_scheduling_problems({"n1": {"nvidia.com/gpu.present": "true"}}, "nvidia", "nvidia") == []
    problems = filters.gpu_scheduling_problems(
        {"n1": {"gpu-cluster.dev/pool": "H100 pool", "bad key!": "x", "gpu-cluster.dev/team": 5}}, "Nvidia", "nv_rt")
    assert problems == [
        "label key 'bad key!' for node n1; allowed: [prefix/]name, name of 1-63 letters, digits, '-', '_' or '.'",
        "label gpu-cluster.dev/pool='H100 pool' for node n1; allowed: a string of at most 63 letters, digits, '-', "
        "'_' or '.', starting and ending with a letter or digit (gpu_scheduling_node_pool and "
        "gpu_scheduling_extra_labels values are strings)",
        "label gpu-cluster.dev/team=5 for node n1; allowed: a string of at most 63 letters, digits, '-', '_' or '.', "
        "starting and ending with a letter or digit (gpu_scheduling_node_pool and gpu_scheduling_extra_labels values "
        "are strings)",
        "gpu_scheduling_runtime_class_name='Nvidia'; allowed: a lower-case DNS name",
        "gpu_scheduling_runtime_handler='nv_rt'; allowed: a DNS label (the runtime name in containerd or CRI-O, e.g. "
        "nvidia)",
    ]


def test_every_nodes_labels_in_one_pass_later_sources_winning():
    hostvars = {
        "gpu-0": {"ansible_facts": {"nvidia_gpu": facts("tesla-t4.xml")}, "gpu_scheduling_node_pool": "t4"},
        "gpu-1": {"ansible_facts": {}},
        "gpu-2": {"gpu_scheduling_node_pool": 7},
    }
    labels = filters.gpu_nodes_labels(["gpu-0", "gpu-1", "gpu-2"], hostvars, True, {"example.com/rack": "r1"})
    assert labels["gpu-0"] == {"nvidia.com/gpu.present": "true", **filters.gpu_node_labels(facts("tesla-t4.xml")),
                               "gpu-cluster.dev/pool": "t4", "example.com/rack": "r1"}
    assert labels["gpu-1"] == {"nvidia.com/gpu.present": "true", "example.com/rack": "r1"}
    # A pool given as a number is passed through for gpu_scheduling_problems to name.
    assert labels["gpu-2"]["gpu-cluster.dev/pool"] == 7
    assert "nvidia.com/gpu.product" not in filters.gpu_nodes_labels(["gpu-0"], hostvars, False)["gpu-0"]
    # Extra labels win over the pool and the facts.
    assert filters.gpu_nodes_labels(["gpu-0"], hostvars, True, {"gpu-cluster.dev/pool": "x"})["gpu-0"][
        "gpu-cluster.dev/pool"] == "x"
    assert filters.gpu_nodes_labels([], hostvars) == {} and filters.gpu_nodes_labels(None, hostvars) == {}


# --- GPU bin-packing ------------------------------------------------------------------------------------------------

BINPACK = {"gpu_scheduling_binpack_mode": "second_scheduler", "gpu_scheduling_binpack_scheduler_name": "gpu-binpack",
           "gpu_scheduling_binpack_strategy": "MostAllocated",
           "gpu_scheduling_binpack_resources": [{"name": "nvidia.com/gpu", "weight": 10}, {"name": "cpu", "weight": 1}]}


def test_the_default_binpack_settings_have_no_problem():
    assert filters.gpu_binpack_problems(BINPACK) == []
    assert filters.gpu_binpack_problems({**BINPACK, "gpu_scheduling_binpack_strategy": "RequestedToCapacityRatio",
                                         "gpu_scheduling_binpack_mode": "profile"}) == []


@pytest.mark.parametrize("override, expected", [
    ({"gpu_scheduling_binpack_mode": "sidecar"}, "gpu_scheduling_binpack_mode='sidecar'; allowed: second_scheduler, profile"),
    ({"gpu_scheduling_binpack_scheduler_name": "default-scheduler"}, "gpu_scheduling_binpack_scheduler_name='default-scheduler'"),
    ({"gpu_scheduling_binpack_scheduler_name": "GPU_Pack"}, "gpu_scheduling_binpack_scheduler_name='GPU_Pack'"),
    ({"gpu_scheduling_binpack_strategy": "LeastAllocated"},
     "gpu_scheduling_binpack_strategy='LeastAllocated'; allowed: MostAllocated, RequestedToCapacityRatio"),
    ({"gpu_scheduling_binpack_resources": []}, "gpu_scheduling_binpack_resources=[]; allowed: a non-empty list"),
    ({"gpu_scheduling_binpack_resources": [{"name": "nvidia.com/gpu", "weight": 0}]},
     "gpu_scheduling_binpack_resources[0].weight=0; allowed: an integer 1-100"),
    ({"gpu_scheduling_binpack_resources": [{"name": "nvidia.com/gpu", "weight": True}]},
     "gpu_scheduling_binpack_resources[0].weight=True; allowed: an integer 1-100"),
    ({"gpu_scheduling_binpack_resources": [{"name": "nvidia.com/gpu"}, {"name": "GPU!"}]},
     "gpu_scheduling_binpack_resources[1].name='GPU!'; allowed: cpu, memory"),
    ({"gpu_scheduling_binpack_resources": [{"name": "nvidia.com/gpu"}, {"name": "nvidia.com/gpu"}]},
     "gpu_scheduling_binpack_resources[1].name='nvidia.com/gpu' is listed twice"),
    ({"gpu_scheduling_binpack_resources": [{"name": "nvidia.com/gpu", "weigth": 2}]},
     "gpu_scheduling_binpack_resources[0]={'name': 'nvidia.com/gpu', 'weigth': 2}; allowed: {name:"),
    ({"gpu_scheduling_binpack_resources": [{"name": "cpu", "weight": 1}]}, "names no GPU resource"),
])
def test_each_bad_binpack_setting_is_named_with_its_path_and_value(override, expected):
    problems = filters.gpu_binpack_problems({**BINPACK, **override})
    assert any(expected in problem for problem in problems), problems


def test_the_second_scheduler_config_packs_gpus_and_leads_on_its_own_lease():
    config = filters.gpu_binpack_scheduler_config("gpu-binpack", "MostAllocated", BINPACK["gpu_scheduling_binpack_resources"])
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1" and config["kind"] == "KubeSchedulerConfiguration"
    assert config["leaderElection"] == {"leaderElect": True, "resourceName": "gpu-binpack", "resourceNamespace": "kube-system"}
    assert "clientConnection" not in config and config["enableProfiling"] is False
    [profile] = config["profiles"]
    assert profile["schedulerName"] == "gpu-binpack"
    assert profile["plugins"] == {"score": {"disabled": [{"name": "NodeResourcesBalancedAllocation"}]}}
    assert profile["pluginConfig"] == [{"name": "NodeResourcesFit", "args": {"scoringStrategy": {
        "type": "MostAllocated", "resources": [{"name": "nvidia.com/gpu", "weight": 10}, {"name": "cpu", "weight": 1}]}}}]


def test_the_profile_mode_keeps_the_default_profile_and_uses_kubeadms_kubeconfig():
    config = filters.gpu_binpack_scheduler_config("gpu-binpack", "RequestedToCapacityRatio", [{"name": "nvidia.com/gpu"}],
                                                  mode="profile")
    assert config["clientConnection"] == {"kubeconfig": "/etc/kubernetes/scheduler.conf"}
    assert [p["schedulerName"] for p in config["profiles"]] == ["default-scheduler", "gpu-binpack"]
    assert config["profiles"][0] == {"schedulerName": "default-scheduler"}
    scoring = config["profiles"][1]["pluginConfig"][0]["args"]["scoringStrategy"]
    assert scoring["resources"] == [{"name": "nvidia.com/gpu", "weight": 1}]
    assert scoring["requestedToCapacityRatio"] == {"shape": [{"utilization": 0, "score": 0}, {"utilization": 100, "score": 10}]}
