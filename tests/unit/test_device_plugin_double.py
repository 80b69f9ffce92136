"""The lab's device-plugin double: what it advertises for real device plugin configs, and how it patches nodes.

Expected values follow the NVIDIA k8s-device-plugin README and sources (v0.17-v0.20): replicas multiply the count,
renameByDefault advertises <name>.shared, GFD appends -SHARED to the product unless renamed, MIG single advertises
MIG devices as nvidia.com/gpu, MIG mixed as nvidia.com/mig-<profile>.
"""

from __future__ import annotations

import copy
import json
import signal
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes.client import V1Node, V1NodeStatus, V1ObjectMeta
from kubernetes.client.exceptions import ApiException

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "lab"))

import device_plugin_double as dpd  # noqa: E402

H100 = dpd.GpuHardware(product="NVIDIA H100 80GB HBM3", count=8, memory_mib=81559, mig_capable=True)
A100_40 = dpd.GpuHardware(product="NVIDIA A100-SXM4-40GB", count=4, memory_mib=40960, mig_capable=True)
H200 = dpd.GpuHardware(product="NVIDIA H200", count=8, memory_mib=143771, mig_capable=True)
L4 = dpd.GpuHardware(product="NVIDIA L4", count=1, memory_mib=23034, mig_capable=False)
H100_MIG_OFF = dpd.GpuHardware(product="NVIDIA H100 80GB HBM3", count=8, memory_mib=81559, mig_capable=False)

# ConfigMap data as the device plugin role would write it: config name -> config file.
CONFIG_MAP = {
    "default": """
version: v1
flags:
  migStrategy: none
""",
    "time-sliced": """
version: v1
flags:
  migStrategy: none
sharing:
  timeSlicing:
    failRequestsGreaterThanOne: true
    resources:
      - name: nvidia.com/gpu
        replicas: 4
""",
    "time-sliced-renamed": """
version: v1
sharing:
  timeSlicing:
    renameByDefault: true
    resources:
      - name: nvidia.com/gpu
        replicas: 4
""",
    "time-sliced-custom-rename": """
version: v1
sharing:
  timeSlicing:
    resources:
      - name: nvidia.com/gpu
        rename: nvidia.com/gpu-slice
        replicas: 4
        devices: [0, 1]
""",
    "mps": """
version: v1
sharing:
  mps:
    resources:
      - name: nvidia.com/gpu
        replicas: 4
""",
    "mig-single": """
version: v1
flags:
  migStrategy: single
""",
    "mig-mixed": """
version: v1
flags:
  migStrategy: mixed
""",
    "mig-single-time-sliced": """
version: v1
flags:
  migStrategy: single
sharing:
  timeSlicing:
    resources:
      - name: nvidia.com/gpu
        replicas: 2
""",
    "mig-mixed-time-sliced": """
version: v1
flags:
  migStrategy: mixed
sharing:
  timeSlicing:
    renameByDefault: true
    resources:
      - name: nvidia.com/mig-1g.10gb
        replicas: 3
""",
    "broken": "version: v1\nsharing: [unclosed\n",
}
CONFIGS = dpd.parse_configs(CONFIG_MAP)


def config(name: str) -> dict[str, Any]:
    parsed = CONFIGS[name]
    assert isinstance(parsed, dict), parsed
    return parsed


def advertise(hardware: dpd.GpuHardware, name: str | None, mig_config: str | None = None) -> dpd.Advertisement:
    labels = {dpd.MIG_CONFIG_LABEL: mig_config} if mig_config else {}
    return dpd.advertised(hardware, config(name) if name else None, labels)


def gpu_annotations(hardware: dpd.GpuHardware) -> dict[str, str]:
    return {
        dpd.KWOK_NODE_ANNOTATION: dpd.KWOK_NODE_VALUE,
        dpd.PRODUCT_ANNOTATION: hardware.product,
        dpd.COUNT_ANNOTATION: str(hardware.count),
        dpd.MEMORY_ANNOTATION: str(hardware.memory_mib),
        dpd.MIG_CAPABLE_ANNOTATION: "true" if hardware.mig_capable else "false",
    }


def node(name: str, annotations: dict[str, str], labels: dict[str, str] | None = None,
         resources: dict[str, int] | None = None) -> dict[str, Any]:
    """A Node as the API returns it, with the kubelet-style base resources kwok sets."""
    capacity = {"cpu": "192", "memory": "2Ti", "pods": "110", "example.com/fpga": "2"}
    capacity.update({key: str(value) for key, value in (resources or {}).items()})
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})},
                     "annotations": dict(annotations)},
        "status": {"capacity": dict(capacity), "allocatable": dict(capacity)},
    }


def node_as_advertised(name: str, hardware: dpd.GpuHardware, advertisement: dpd.Advertisement,
                       labels: dict[str, str] | None = None) -> dict[str, Any]:
    return node(name, gpu_annotations(hardware), {**(labels or {}), **advertisement.labels}, advertisement.resources)


# --- Hardware annotations ---------------------------------------------------------------------------------------


def test_hardware_from_annotations_reads_the_lab_annotations():
    assert dpd.hardware_from_annotations(gpu_annotations(H100)) == H100
    assert dpd.hardware_from_annotations(gpu_annotations(L4)) == L4


@pytest.mark.parametrize("annotations", [None, {}, {dpd.KWOK_NODE_ANNOTATION: "fake", "other": "x"}])
def test_a_cpu_node_has_no_gpu_hardware(annotations):
    assert dpd.hardware_from_annotations(annotations) is None


@pytest.mark.parametrize(("key", "value"), [
    (dpd.COUNT_ANNOTATION, "eight"),
    (dpd.COUNT_ANNOTATION, "0"),
    (dpd.MEMORY_ANNOTATION, "80GB"),
    (dpd.MIG_CAPABLE_ANNOTATION, "yes"),
    (dpd.PRODUCT_ANNOTATION, " "),
])
def test_malformed_annotation_is_named_with_its_value(key, value):
    annotations = gpu_annotations(H100) | {key: value}
    with pytest.raises(ValueError) as raised:
        dpd.hardware_from_annotations(annotations)
    assert key in str(raised.value) and repr(value) in str(raised.value)


def test_incomplete_gpu_annotations_name_the_missing_one():
    annotations = gpu_annotations(H100)
    del annotations[dpd.MEMORY_ANNOTATION]
    with pytest.raises(ValueError, match=dpd.MEMORY_ANNOTATION):
        dpd.hardware_from_annotations(annotations)


# --- Whole GPUs and sharing ---------------------------------------------------------------------------------------


def test_plain_h100_node_advertises_its_eight_gpus():
    advertisement = advertise(H100, "default")
    assert advertisement.error is None
    assert advertisement.resources == {"nvidia.com/gpu": 8}
    assert advertisement.labels == {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/mig.capable": "true",
        "nvidia.com/mps.capable": "false",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/gpu.count": "8",
        "nvidia.com/gpu.replicas": "1",
        "nvidia.com/gpu.sharing-strategy": "none",
        "nvidia.com/gpu.memory": "81559",
        "nvidia.com/gpu.family": "hopper",
        "nvidia.com/gpu.compute.major": "9",
        "nvidia.com/gpu.compute.minor": "0",
    }


def test_no_config_at_all_is_the_same_as_plain():
    assert dpd.advertised(H100, None, {}) == advertise(H100, "default")


def test_time_slicing_multiplies_the_count_and_marks_the_product_shared():
    advertisement = advertise(H100, "time-sliced")
    assert advertisement.resources == {"nvidia.com/gpu": 32}
    assert advertisement.labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3-SHARED"
    assert advertisement.labels["nvidia.com/gpu.count"] == "8"
    assert advertisement.labels["nvidia.com/gpu.replicas"] == "4"
    assert advertisement.labels["nvidia.com/gpu.sharing-strategy"] == "time-slicing"


def test_rename_by_default_advertises_gpu_shared_only():
    advertisement = advertise(H100, "time-sliced-renamed")
    assert advertisement.resources == {"nvidia.com/gpu.shared": 32}
    # The resource name already says "shared": GFD leaves the product alone.
    assert advertisement.labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert advertisement.labels["nvidia.com/gpu.replicas"] == "4"
    assert advertisement.labels["nvidia.com/gpu.sharing-strategy"] == "time-slicing"


def test_custom_rename_and_devices_are_ignored_like_the_real_plugin_does():
    advertisement = advertise(H100, "time-sliced-custom-rename")
    assert advertisement.resources == {"nvidia.com/gpu": 32}
    assert advertisement.labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3-SHARED"
    assert any("'rename' field" in warning for warning in advertisement.warnings)
    assert any("'devices' field" in warning for warning in advertisement.warnings)


def test_rename_by_default_wins_over_a_custom_rename():
    shared = {"version": "v1", "sharing": {"timeSlicing": {"renameByDefault": True, "resources": [
        {"name": "gpu", "rename": "nvidia.com/other", "replicas": 2}]}}}
    advertisement = dpd.advertised(H100, shared, {})
    assert advertisement.resources == {"nvidia.com/gpu.shared": 16}
    assert advertisement.warnings


def test_mps_replicas_multiply_and_mark_the_node_mps_capable():
    advertisement = advertise(H100, "mps")
    assert advertisement.resources == {"nvidia.com/gpu": 32}
    assert advertisement.labels["nvidia.com/gpu.sharing-strategy"] == "mps"
    assert advertisement.labels["nvidia.com/gpu.replicas"] == "4"
    assert advertisement.labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3-SHARED"
    assert advertisement.labels["nvidia.com/mps.capable"] == "true"


def test_mps_rename_by_default_advertises_gpu_shared():
    mps = {"version": "v1", "sharing": {"mps": {"renameByDefault": True, "resources": [
        {"name": "nvidia.com/gpu", "replicas": 10}]}}}
    assert dpd.advertised(A100_40, mps, {}).resources == {"nvidia.com/gpu.shared": 40}


# --- MIG ----------------------------------------------------------------------------------------------------------


def test_mig_single_all_1g_10gb_on_h100_advertises_56_gpus():
    advertisement = advertise(H100, "mig-single", "all-1g.10gb")
    assert advertisement.error is None
    assert advertisement.resources == {"nvidia.com/gpu": 56}
    labels = advertisement.labels
    assert labels["nvidia.com/mig.strategy"] == "single"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb"
    assert labels["nvidia.com/gpu.count"] == "56"
    assert labels["nvidia.com/gpu.replicas"] == "1"
    assert labels["nvidia.com/gpu.memory"] == "10240"
    assert labels["nvidia.com/gpu.slices.gi"] == "1"
    assert labels["nvidia.com/gpu.slices.ci"] == "1"
    assert labels["nvidia.com/mig.capable"] == "true"


def test_mig_mixed_all_1g_10gb_on_h100_advertises_mig_resources_and_no_whole_gpus():
    advertisement = advertise(H100, "mig-mixed", "all-1g.10gb")
    assert advertisement.resources == {"nvidia.com/mig-1g.10gb": 56}
    labels = advertisement.labels
    assert labels["nvidia.com/mig.strategy"] == "mixed"
    assert labels["nvidia.com/mig-1g.10gb.count"] == "56"
    assert labels["nvidia.com/mig-1g.10gb.product"] == "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb"
    assert labels["nvidia.com/mig-1g.10gb.memory"] == "10240"
    # GFD still describes the MIG-enabled parents, without sharing.
    assert labels["nvidia.com/gpu.count"] == "8"
    assert labels["nvidia.com/gpu.replicas"] == "0"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"


@pytest.mark.parametrize(("hardware", "mig_config", "expected"), [
    (H100, "all-balanced", {"nvidia.com/mig-1g.10gb": 16, "nvidia.com/mig-2g.20gb": 8,
                            "nvidia.com/mig-3g.40gb": 8}),
    (H100, "all-1g.10gb.me", {"nvidia.com/mig-1g.10gb.me": 8}),
    (A100_40, "all-1g.10gb", {"nvidia.com/mig-1g.10gb": 16}),  # 4 x 1g.10gb on a 40 GB A100
    (A100_40, "all-1g.5gb", {"nvidia.com/mig-1g.5gb": 28}),
    (A100_40, "all-3g.20gb", {"nvidia.com/mig-3g.20gb": 8}),
    (H200, "all-1g.18gb", {"nvidia.com/mig-1g.18gb": 56}),
    (H200, "all-7g.141gb", {"nvidia.com/mig-7g.141gb": 8}),
    (H200, "all-balanced", {"nvidia.com/mig-1g.18gb": 16, "nvidia.com/mig-2g.35gb": 8,
                            "nvidia.com/mig-3g.71gb": 8}),
])
def test_mig_mixed_layouts_use_the_real_profile_counts(hardware, mig_config, expected):
    assert advertise(hardware, "mig-mixed", mig_config).resources == expected


def test_mig_disabled_under_single_strategy_advertises_whole_gpus():
    advertisement = advertise(H100, "mig-single", "all-disabled")
    assert advertisement.resources == {"nvidia.com/gpu": 8}
    assert advertisement.labels["nvidia.com/mig.strategy"] == "single"
    assert advertisement.labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"


def test_strategy_none_advertises_whole_gpus_even_with_mig_enabled():
    advertisement = advertise(H100, "default", "all-1g.10gb")
    assert advertisement.resources == {"nvidia.com/gpu": 8}
    assert "nvidia.com/mig.strategy" not in advertisement.labels


def test_time_slicing_mig_devices_under_single_strategy():
    advertisement = advertise(H100, "mig-single-time-sliced", "all-1g.10gb")
    assert advertisement.resources == {"nvidia.com/gpu": 112}
    assert advertisement.labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb-SHARED"
    assert advertisement.labels["nvidia.com/gpu.replicas"] == "2"


def test_time_slicing_a_mixed_mig_resource_with_rename_by_default():
    advertisement = advertise(H100, "mig-mixed-time-sliced", "all-balanced")
    assert advertisement.resources == {"nvidia.com/mig-1g.10gb.shared": 48, "nvidia.com/mig-2g.20gb": 8,
                                       "nvidia.com/mig-3g.40gb": 8}
    assert advertisement.labels["nvidia.com/mig-1g.10gb.replicas"] == "3"
    assert advertisement.labels["nvidia.com/mig-2g.20gb.replicas"] == "1"


@pytest.mark.parametrize(("hardware", "config_name", "mig_config", "fragment"), [
    (L4, "mig-single", "all-1g.10gb", "NVIDIA L4 is not MIG-capable"),
    (H100_MIG_OFF, "mig-mixed", "all-1g.10gb", "not MIG-capable"),
    (dpd.GpuHardware("NVIDIA B200", 8, 183359, True), "mig-mixed", "all-1g.23gb", "no MIG profile table"),
    (H100, "mig-mixed", "all-1g.5gb", "all-1g.5gb is not a MIG configuration for NVIDIA H100 80GB HBM3"),
    (H100, "mig-single", "all-balanced", "more than one MIG device type"),
    (H100, "mig-mixed", "all-enabled", "has no MIG devices"),
    (H100, "mps", "all-1g.10gb", "MPS sharing is not supported for MIG devices"),
])
def test_mig_layouts_the_gpus_cannot_serve_are_errors(hardware, config_name, mig_config, fragment):
    advertisement = advertise(hardware, config_name, mig_config)
    assert advertisement.error is not None and fragment in advertisement.error
    assert advertisement.resources == {} and advertisement.labels == {}


def test_unknown_mig_config_lists_the_valid_names():
    error = advertise(H100, "mig-mixed", "all-3g.20gb").error
    assert error is not None and "all-1g.10gb" in error and "all-balanced" in error


# --- Config validation ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [name for name, parsed in CONFIGS.items() if isinstance(parsed, dict)])
def test_realistic_configs_are_valid(name):
    assert dpd.validate_config(config(name)) == []


def _time_slicing(**resource: Any) -> dict[str, Any]:
    return {"version": "v1", "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", **resource}]}}}


@pytest.mark.parametrize(("bad_config", "fragment"), [
    ({"version": "v1", "flags": {"migStrategy": "dual"}}, "flags.migStrategy: unknown MIG strategy 'dual'"),
    ({"version": "v2"}, "version: unknown version 'v2'"),
    (_time_slicing(replicas=0), "replicas: must be an integer >= 2, got 0"),
    (_time_slicing(replicas=-3), "replicas: must be an integer >= 2, got -3"),
    (_time_slicing(replicas=1), "replicas: must be an integer >= 2, got 1"),
    (_time_slicing(replicas="4"), "replicas: must be an integer >= 2, got '4'"),
    (_time_slicing(replicas=True), "replicas: must be an integer >= 2, got True"),
    (_time_slicing(), "replicas: must be an integer >= 2, got None"),
    (_time_slicing(replicas=2, devices="some"), "devices: must be 'all', a count or a list"),
    ({"version": "v1", "sharing": {"timeSlicing": {"resources": []}}}, "no resources specified"),
    ({"version": "v1", "sharing": {"timeSlicing": {"resources": [{"name": "Bad_Name!", "replicas": 2}]}}},
     "'Bad_Name!' is not a valid resource name"),
    ({"version": "v1", "sharing": {
        "timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]},
        "mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}}},
     "timeSlicing and mps are mutually exclusive"),
    ({"version": "v1", "flags": {"migStrategy": "mixed"},
      "sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}}},
     "MPS is not supported with flags.migStrategy=mixed"),
    ({"version": "v1", "flags": {"migStrategy": "mixed"},
      "sharing": {"mps": {"resources": [{"name": "nvidia.com/mig-1g.10gb", "replicas": 2}]}}},
     "MPS supports only nvidia.com/gpu, got nvidia.com/mig-1g.10gb"),
    ({"version": "v1", "sharing": {"timeSlicing": {"renameByDefault": "yes", "resources": [
        {"name": "nvidia.com/gpu", "replicas": 2}]}}}, "renameByDefault: must be true or false"),
])
def test_invalid_configs_name_each_problem(bad_config, fragment):
    problems = dpd.validate_config(bad_config)
    assert any(fragment in problem for problem in problems), problems
    advertisement = dpd.advertised(H100, bad_config, {})
    assert advertisement.error is not None and fragment in advertisement.error
    assert advertisement.resources == {}


def test_every_problem_of_a_config_is_reported():
    bad = {"version": "v1", "flags": {"migStrategy": "mixed"}, "sharing": {
        "timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 1}]},
        "mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}}
    assert len(dpd.validate_config(bad)) == 3


# --- Config selection -------------------------------------------------------------------------------------------


def test_node_label_chooses_the_config_and_unset_means_the_default():
    chosen = dpd.choose_config(CONFIGS, {dpd.CONFIG_LABEL: "time-sliced"}, "default")
    assert (chosen.name, chosen.error) == ("time-sliced", None) and chosen.config == config("time-sliced")
    assert dpd.choose_config(CONFIGS, {}, "default").name == "default"


def test_missing_config_map_or_default_key_means_no_config():
    assert dpd.choose_config(None, {dpd.CONFIG_LABEL: "time-sliced"}, "default") == dpd.ConfigChoice("", None)
    assert dpd.choose_config(CONFIGS, {}, "absent") == dpd.ConfigChoice("", None)


def test_label_naming_an_unknown_config_is_an_error():
    chosen = dpd.choose_config(CONFIGS, {dpd.CONFIG_LABEL: "nope"}, "default")
    assert chosen.config is None and chosen.error is not None and "nvidia.com/device-plugin.config=nope" in chosen.error


def test_config_that_is_not_yaml_is_an_error():
    chosen = dpd.choose_config(CONFIGS, {dpd.CONFIG_LABEL: "broken"}, "default")
    assert chosen.error is not None and "config broken: not YAML" in chosen.error


# --- Node patches -----------------------------------------------------------------------------------------------


def test_patch_of_a_node_that_already_matches_is_none():
    for name, mig_config in (("default", None), ("time-sliced-renamed", None), ("mig-mixed", "all-balanced")):
        advertisement = advertise(H100, name, mig_config)
        labels = {dpd.MIG_CONFIG_LABEL: mig_config} if mig_config else {}
        assert dpd.node_patch(node_as_advertised("gpu-h100-0", H100, advertisement, labels), advertisement) == (
            None, None)


def test_new_node_gets_resources_in_capacity_and_allocatable_and_labels():
    bare = node("gpu-h100-0", gpu_annotations(H100))
    status, metadata = dpd.node_patch(bare, advertise(H100, "time-sliced"))
    assert status == {"status": {"capacity": {"nvidia.com/gpu": "32"}, "allocatable": {"nvidia.com/gpu": "32"}}}
    assert metadata is not None
    assert metadata["metadata"]["labels"]["nvidia.com/gpu.replicas"] == "4"
    assert "annotations" not in metadata["metadata"]


def test_switching_from_renamed_back_to_plain_drops_gpu_shared():
    renamed = advertise(H100, "time-sliced-renamed")
    current = node_as_advertised("gpu-h100-0", H100, renamed)
    status, metadata = dpd.node_patch(current, advertise(H100, "default"))
    expected = {"nvidia.com/gpu": "8", "nvidia.com/gpu.shared": None}
    assert status == {"status": {"capacity": expected, "allocatable": expected}}
    assert metadata is not None
    assert metadata["metadata"]["labels"] == {"nvidia.com/gpu.replicas": "1",
                                              "nvidia.com/gpu.sharing-strategy": "none"}


def test_leaving_mig_mixed_removes_mig_resources_and_labels_but_not_the_users_labels():
    mixed = advertise(H100, "mig-mixed", "all-1g.10gb")
    users = {dpd.MIG_CONFIG_LABEL: "all-1g.10gb", dpd.CONFIG_LABEL: "mig-mixed", "nvidia.com/gpu.deploy.dcgm": "true"}
    current = node_as_advertised("gpu-h100-0", H100, mixed, users)
    status, metadata = dpd.node_patch(current, advertise(H100, "default"))
    assert status is not None and metadata is not None
    assert status["status"]["capacity"] == {"nvidia.com/gpu": "8", "nvidia.com/mig-1g.10gb": None}
    labels = metadata["metadata"]["labels"]
    assert labels["nvidia.com/mig-1g.10gb.count"] is None
    assert labels["nvidia.com/mig.strategy"] is None
    assert not set(users) & set(labels)


def test_cpu_memory_pods_and_other_resources_are_never_touched():
    current = node("gpu-h100-0", gpu_annotations(H100), resources={"nvidia.com/gpu.shared": 32})
    status, _ = dpd.node_patch(current, advertise(H100, "default"))
    assert status is not None
    for field in ("capacity", "allocatable"):
        assert set(status["status"][field]) == {"nvidia.com/gpu", "nvidia.com/gpu.shared"}


def test_only_the_differing_field_is_patched():
    advertisement = advertise(H100, "default")
    current = node_as_advertised("gpu-h100-0", H100, advertisement)
    current["status"]["allocatable"]["nvidia.com/gpu"] = "7"
    status, metadata = dpd.node_patch(current, advertisement)
    assert status == {"status": {"allocatable": {"nvidia.com/gpu": "8"}}} and metadata is None


def test_error_keeps_the_node_as_it_is_and_sets_the_annotation_once():
    working = advertise(H100, "time-sliced")
    current = node_as_advertised("gpu-h100-0", H100, working)
    failed = dpd.Advertisement.failed("invalid device plugin config: x")
    status, metadata = dpd.node_patch(current, failed)
    assert status is None
    assert metadata == {"metadata": {"annotations": {dpd.ERROR_ANNOTATION: "invalid device plugin config: x"}}}
    current["metadata"]["annotations"][dpd.ERROR_ANNOTATION] = "invalid device plugin config: x"
    assert dpd.node_patch(current, failed) == (None, None)
    # Fixed config: the error goes, nothing else changes.
    assert dpd.node_patch(current, working) == (None, {"metadata": {"annotations": {dpd.ERROR_ANNOTATION: None}}})


def test_node_patch_reads_client_model_nodes_too():
    advertisement = advertise(H100, "default")
    as_dict = node_as_advertised("gpu-h100-0", H100, advertisement)
    model = V1Node(metadata=V1ObjectMeta(**as_dict["metadata"]), status=V1NodeStatus(**as_dict["status"]))
    assert dpd.node_patch(model, advertisement) == (None, None)


def test_owned_previous_names_are_removed_when_no_longer_advertised():
    current = node("gpu-h100-0", gpu_annotations(H100), resources={"nvidia.com/gpu": 8})
    current["status"]["capacity"]["gpu-lab.dev/legacy"] = "1"
    status, _ = dpd.node_patch(current, advertise(H100, "default"), owned_previous={"gpu-lab.dev/legacy"})
    assert status == {"status": {"capacity": {"gpu-lab.dev/legacy": None}}}


def test_change_line_names_node_resource_and_config():
    current = node_as_advertised("gpu-h100-0", H100, advertise(H100, "default"))
    advertisement = advertise(H100, "time-sliced")
    status, metadata = dpd.node_patch(current, advertisement)
    line = dpd.describe_change(dpd.NodeView.of(current), status, metadata, "time-sliced", None)
    assert line.startswith("gpu-h100-0: nvidia.com/gpu 8 -> 32") and line.endswith("(config time-sliced)")


# --- One reconcile pass against a recording API stub ------------------------------------------------------------


def merge_patch(target: dict[str, Any], patch: dict[str, Any]) -> None:
    """RFC 7386, as the API server applies application/merge-patch+json."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict):
            merge_patch(target.setdefault(key, {}), value)
        else:
            target[key] = value


class RecordingCoreV1Api:
    """Just enough of CoreV1Api: records every call and applies patches to its nodes."""

    def __init__(self, nodes: list[dict[str, Any]], config_map: dict[str, str] | None) -> None:
        self.nodes = {item["metadata"]["name"]: copy.deepcopy(item) for item in nodes}
        self.config_map = config_map
        self.calls: list[tuple[str, str, dict[str, Any]]] = []

    def list_node(self, **kwargs: Any) -> SimpleNamespace:
        self.calls.append(("list_node", "", kwargs))
        return SimpleNamespace(data=json.dumps({"kind": "NodeList", "items": list(self.nodes.values())}).encode())

    def read_namespaced_config_map(self, name: str, namespace: str, **kwargs: Any) -> SimpleNamespace:
        self.calls.append(("read_namespaced_config_map", f"{namespace}/{name}", kwargs))
        if self.config_map is None:
            raise ApiException(status=404, reason="Not Found")
        return SimpleNamespace(data=dict(self.config_map))

    def patch_node_status(self, name: str, body: dict[str, Any], **kwargs: Any) -> None:
        self.calls.append(("patch_node_status", name, kwargs))
        merge_patch(self.nodes[name], body)

    def patch_node(self, name: str, body: dict[str, Any], **kwargs: Any) -> None:
        self.calls.append(("patch_node", name, kwargs))
        merge_patch(self.nodes[name], body)

    def count(self, method: str) -> int:
        return sum(1 for call in self.calls if call[0] == method)

    def patched(self) -> set[str]:
        return {name for method, name, _ in self.calls if method.startswith("patch_")}


def fifty_nodes() -> list[dict[str, Any]]:
    """20 H100 nodes already right, 10 asking for time-slicing, 10 new A100 nodes, 5 CPU nodes, 5 real nodes."""
    nodes = [node_as_advertised(f"gpu-h100-{i}", H100, advertise(H100, "default")) for i in range(20)]
    nodes += [node_as_advertised(f"gpu-h100-{i}", H100, advertise(H100, "default"),
                                 {dpd.CONFIG_LABEL: "time-sliced"}) for i in range(20, 30)]
    nodes += [node(f"gpu-a100-{i}", gpu_annotations(A100_40)) for i in range(10)]
    nodes += [node(f"cpu-{i}", {dpd.KWOK_NODE_ANNOTATION: dpd.KWOK_NODE_VALUE}) for i in range(5)]
    real = gpu_annotations(H100)
    del real[dpd.KWOK_NODE_ANNOTATION]
    nodes += [node(f"real-{i}", real) for i in range(5)]
    return nodes


def test_one_pass_is_one_list_one_config_read_and_patches_only_for_differing_nodes():
    api = RecordingCoreV1Api(fifty_nodes(), CONFIG_MAP)
    result = dpd.reconcile_once(api, "nvidia-device-plugin", "nvidia-device-plugin-configs", "default")
    assert api.count("list_node") == 1
    assert api.count("read_namespaced_config_map") == 1
    assert api.calls[1][1] == "nvidia-device-plugin/nvidia-device-plugin-configs"
    expected = {f"gpu-h100-{i}" for i in range(20, 30)} | {f"gpu-a100-{i}" for i in range(10)}
    assert api.patched() == expected
    assert api.count("patch_node_status") == 20 and api.count("patch_node") == 20
    assert all(call[2]["_content_type"] == "application/merge-patch+json" for call in api.calls[2:])
    assert (result.listed, result.gpu_nodes, result.status_patches, result.errors) == (50, 40, 20, {})
    assert api.nodes["gpu-h100-25"]["status"]["allocatable"]["nvidia.com/gpu"] == "32"
    assert api.nodes["gpu-a100-3"]["status"]["capacity"]["nvidia.com/gpu"] == "4"
    assert api.nodes["cpu-0"] == node("cpu-0", {dpd.KWOK_NODE_ANNOTATION: dpd.KWOK_NODE_VALUE})
    assert "nvidia.com/gpu" not in api.nodes["real-0"]["status"]["capacity"]
    assert "gpu-h100-25: nvidia.com/gpu 8 -> 32, 3 GFD label(s) updated (config time-sliced)" in result.changes

    api.calls.clear()
    again = dpd.reconcile_once(api, "nvidia-device-plugin", "nvidia-device-plugin-configs", "default")
    assert [call[0] for call in api.calls] == ["list_node", "read_namespaced_config_map"]
    assert (again.status_patches, again.metadata_patches, again.changes) == (0, 0, [])


def test_missing_config_map_means_plain_gpus():
    api = RecordingCoreV1Api([node("gpu-h100-0", gpu_annotations(H100), {dpd.CONFIG_LABEL: "time-sliced"})], None)
    dpd.reconcile_once(api, "nvidia-device-plugin", "nvidia-device-plugin-configs", "default")
    assert api.nodes["gpu-h100-0"]["status"]["capacity"]["nvidia.com/gpu"] == "8"


def test_invalid_config_keeps_the_previous_resources_and_records_the_error():
    broken = {"default": "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
                         "      - name: nvidia.com/gpu\n        replicas: 1\n"}
    before = node_as_advertised("gpu-h100-0", H100, advertise(H100, "time-sliced"))
    api = RecordingCoreV1Api([before], broken)
    result = dpd.reconcile_once(api, "nvidia-device-plugin", "nvidia-device-plugin-configs", "default")
    after = api.nodes["gpu-h100-0"]
    assert after["status"] == before["status"] and after["metadata"]["labels"] == before["metadata"]["labels"]
    assert "replicas: must be an integer >= 2, got 1" in after["metadata"]["annotations"][dpd.ERROR_ANNOTATION]
    assert api.count("patch_node_status") == 0 and "gpu-h100-0" in result.errors


def test_malformed_annotations_are_recorded_on_the_node():
    annotations = gpu_annotations(H100) | {dpd.COUNT_ANNOTATION: "many"}
    api = RecordingCoreV1Api([node("gpu-h100-0", annotations)], CONFIG_MAP)
    dpd.reconcile_once(api, "nvidia-device-plugin", "nvidia-device-plugin-configs", "default")
    assert "gpu-lab.dev/gpu-count='many'" in api.nodes["gpu-h100-0"]["metadata"]["annotations"][dpd.ERROR_ANNOTATION]


# --- Property ---------------------------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(replicas=st.integers(min_value=2, max_value=64), count=st.integers(min_value=1, max_value=8),
       rename=st.booleans(), kind=st.sampled_from(["timeSlicing", "mps"]))
def test_advertised_count_is_replicas_times_gpus_and_labels_agree(replicas, count, rename, kind):
    hardware = dpd.GpuHardware("NVIDIA H100 80GB HBM3", count, 81559, True)
    shared = {"version": "v1", "sharing": {kind: {"renameByDefault": rename, "resources": [
        {"name": "nvidia.com/gpu", "replicas": replicas}]}}}
    advertisement = dpd.advertised(hardware, shared, {})
    name = "nvidia.com/gpu.shared" if rename else "nvidia.com/gpu"
    assert advertisement.resources == {name: replicas * count}
    labels = advertisement.labels
    assert int(labels["nvidia.com/gpu.count"]) * int(labels["nvidia.com/gpu.replicas"]) == replicas * count
    assert labels["nvidia.com/gpu.sharing-strategy"] == ("mps" if kind == "mps" else "time-slicing")
    assert labels["nvidia.com/gpu.product"].endswith("-SHARED") is not rename
    bare = node("n", gpu_annotations(hardware))
    status, _ = dpd.node_patch(bare, advertisement)
    assert status is not None and status["status"]["capacity"][name] == str(replicas * count)
    merge_patch(bare, status)
    bare["metadata"]["labels"].update(labels)
    assert dpd.node_patch(bare, advertisement) == (None, None)


# --- CLI --------------------------------------------------------------------------------------------------------


def test_help_says_it_is_a_lab_double(capsys):
    with pytest.raises(SystemExit) as exited:
        dpd.main(["--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert "DOUBLE" in out and "lab only" in out
    assert "DOUBLE" in (dpd.__doc__ or "")


def test_the_loop_exits_cleanly_on_sigterm(tmp_path):
    """Against an API server that is not there: passes fail and are retried until SIGTERM ends the loop with 0."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(kubeconfig_text("https://127.0.0.1:9"), encoding="utf-8")
    script = Path(dpd.__file__)
    process = subprocess.Popen([sys.executable, str(script), "--kubeconfig", str(kubeconfig), "--interval", "0.2"],
                               stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    failed_once = threading.Event()
    output: list[str] = []

    def read() -> None:
        for line in process.stderr:  # type: ignore[union-attr]
            output.append(line)
            if "reconcile pass failed" in line:
                failed_once.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert failed_once.wait(60), "".join(output)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
    reader.join(5)
    assert any("received SIGTERM, stopping" in line for line in output), "".join(output)


def kubeconfig_text(server: str) -> str:
    return json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "lab",
        "clusters": [{"name": "lab", "cluster": {"server": server, "insecure-skip-tls-verify": True}}],
        "users": [{"name": "double", "user": {"token": "not-a-real-token"}}],
        "contexts": [{"name": "lab", "context": {"cluster": "lab", "user": "double"}}],
    })


# --- MIG layout read from a lab node container's nvidia-smi -----------------------------------------------------

NVIDIA_SMI_DOUBLE = Path(__file__).resolve().parents[2] / "lab" / "doubles" / "nvidia-smi"


def gpu_state(index: int, *profiles: str, enabled: bool = True, product: str = H100.product) -> dpd.GpuMigState:
    return dpd.GpuMigState(index, product, True, enabled, tuple(profiles))


def node_state(*gpus: dpd.GpuMigState) -> dpd.NodeMigState:
    return dpd.NodeMigState(tuple(gpus))


class FakeReader:
    """Stands for podman: which lab node containers exist (running or not) and what each one's nvidia-smi says."""

    def __init__(self, containers: dict[str, bool], states: dict[str, dpd.NodeMigState | Exception]) -> None:
        self.containers_now, self.states = containers, states
        self.reads: list[str] = []
        self.lists = 0

    def containers(self) -> dict[str, bool]:
        self.lists += 1
        if isinstance(self.containers_now, Exception):
            raise self.containers_now
        return dict(self.containers_now)

    def read(self, name: str) -> dpd.NodeMigState:
        self.reads.append(name)
        state = self.states[name]
        if isinstance(state, Exception):
            raise state
        return state


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def run_double_read(tmp_path: Path, description: dict[str, Any], *setup: list[str]) -> dpd.NodeMigState:
    """The real read script against the nvidia-smi double, after MIG commands: the two doubles must agree."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if not (bin_dir / "nvidia-smi").exists():
        (bin_dir / "nvidia-smi").symlink_to(NVIDIA_SMI_DOUBLE)
    (tmp_path / "gpus.json").write_text(json.dumps(description), encoding="utf-8")
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "GPU_LAB_GPUS": str(tmp_path / "gpus.json"),
           "GPU_LAB_STATE_ROOT": str(tmp_path / "state"), "GPU_LAB_NVML_LIBDIR": str(tmp_path / "lib"), "LC_ALL": "C"}
    for args in setup:
        subprocess.run(["nvidia-smi", *args], env=env, check=True, capture_output=True, text=True)
    result = subprocess.run(["sh", "-c", dpd.MIG_READ_SCRIPT], env=env, check=True, capture_output=True, text=True)
    return dpd.parse_node_mig(result.stdout)


def test_the_read_script_understands_the_nvidia_smi_double(tmp_path):
    description = {"product": "NVIDIA H100 80GB HBM3", "count": 3, "node": "gpu-h100-0"}
    assert run_double_read(tmp_path, description) == node_state(
        *[gpu_state(i, enabled=False) for i in range(3)])
    state = run_double_read(tmp_path, description, ["-mig", "1", "-i", "0,1"],
                            ["mig", "-i", "0", "-cgi", "19,19,1g.10gb+me,9", "-C"], ["mig", "-i", "1", "-cgi", "14"])
    assert state == node_state(gpu_state(0, "3g.40gb", "1g.10gb", "1g.10gb", "1g.10gb+me"),
                               gpu_state(1), gpu_state(2, enabled=False))
    mixed = dpd.advertised(H100, config("mig-mixed"), {}, state)
    # GPU 1 is MIG-enabled without MIG devices: the real plugin refuses that node.
    assert mixed.error is not None and "has no MIG devices" in mixed.error
    run_double_read(tmp_path, description, ["mig", "-i", "1", "-dgi"], ["-mig", "0", "-i", "1"])
    state = run_double_read(tmp_path, description)
    assert dpd.advertised(H100, config("mig-mixed"), {}, state).resources == {
        "nvidia.com/gpu": 2, "nvidia.com/mig-1g.10gb": 2, "nvidia.com/mig-1g.10gb.me": 1,
        "nvidia.com/mig-3g.40gb": 1}


def test_a_t4_node_reads_as_not_mig_capable(tmp_path):
    state = run_double_read(tmp_path, {"product": "Tesla T4", "count": 1, "node": "t4"})
    assert state == dpd.NodeMigState((dpd.GpuMigState(0, "Tesla T4", False, False, ()),))


@pytest.mark.parametrize("output, fragment", [
    ("0, NVIDIA H100 80GB HBM3, Disabled\n", "no @@gpu-lab-mig@@ line"),
    ("zero, x, Disabled\n@@gpu-lab-mig@@\n", "unexpected --query-gpu row"),
    ("0, NVIDIA H100 80GB HBM3, Disabled\n@@gpu-lab-mig@@\nsomething else\n", "unexpected nvidia-smi -L line"),
])
def test_an_unexpected_answer_is_a_read_error(output, fragment):
    with pytest.raises(dpd.MigReadError, match=fragment):
        dpd.parse_node_mig(output)


def test_node_state_mixed_strategy_counts_each_profile_and_whole_gpus():
    state = node_state(gpu_state(0, "1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"), gpu_state(1, "7g.80gb"),
                       gpu_state(2, enabled=False))
    advertisement = dpd.advertised(H100, config("mig-mixed"), {dpd.MIG_CONFIG_LABEL: "all-1g.10gb"}, state)
    # The label names another layout: the node's nvidia-smi wins, as NVML does for the real plugin.
    assert advertisement.resources == {"nvidia.com/gpu": 1, "nvidia.com/mig-1g.10gb": 2,
                                       "nvidia.com/mig-2g.20gb": 1, "nvidia.com/mig-3g.40gb": 1,
                                       "nvidia.com/mig-7g.80gb": 1}
    assert advertisement.labels["nvidia.com/gpu.count"] == "3"  # the GPUs nvidia-smi lists, not the annotation
    assert advertisement.labels["nvidia.com/mig-1g.10gb.count"] == "2"


def test_node_state_single_strategy_advertises_mig_devices_as_gpus():
    state = node_state(*[gpu_state(i, *["1g.10gb"] * 7) for i in range(2)])
    advertisement = dpd.advertised(H100, config("mig-single"), {}, state)
    assert advertisement.resources == {"nvidia.com/gpu": 14}
    assert advertisement.labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb"


@pytest.mark.parametrize("state, config_name, fragment", [
    (node_state(gpu_state(0, "1g.10gb"), gpu_state(1, "2g.20gb")), "mig-single", "more than one MIG device type"),
    (node_state(gpu_state(0, "1g.10gb"), gpu_state(1, enabled=False)), "mig-single", "same migEnabled value"),
    (node_state(gpu_state(0)), "mig-mixed", "has no MIG devices"),
    (node_state(gpu_state(0, "1g.10gb")), "mps", "MPS sharing is not supported for MIG devices"),
])
def test_node_state_layouts_the_plugin_refuses(state, config_name, fragment):
    advertisement = dpd.advertised(H100, config(config_name), {}, state)
    assert advertisement.error is not None and fragment in advertisement.error
    assert "as the node's nvidia-smi reports it" in advertisement.error


def test_node_state_without_mig_or_under_strategy_none_is_whole_gpus():
    disabled = node_state(*[gpu_state(i, enabled=False) for i in range(8)])
    assert dpd.advertised(H100, config("mig-single"), {dpd.MIG_CONFIG_LABEL: "all-1g.10gb"}, disabled).resources == {
        "nvidia.com/gpu": 8}
    enabled = node_state(*[gpu_state(i, "3g.40gb", "3g.40gb") for i in range(8)])
    assert dpd.advertised(H100, config("default"), {}, enabled).resources == {"nvidia.com/gpu": 8}


def test_states_are_read_at_most_every_refresh_interval():
    reader = FakeReader({"gpu-h100-0": True, "gpu-a100-0": True},
                        {"gpu-h100-0": node_state(gpu_state(0)), "gpu-a100-0": node_state(gpu_state(0))})
    clock = Clock()
    states = dpd.NodeMigStates(reader, refresh_s=10.0, clock=clock)
    names = ["gpu-h100-0", "gpu-a100-0", "gpu-h100-7"]  # gpu-h100-7 is kwok only
    first = states.current(names)
    assert first == {"gpu-h100-0": node_state(gpu_state(0)), "gpu-a100-0": node_state(gpu_state(0))}
    clock.now += 5
    assert states.current(names) == first and reader.lists == 1 and len(reader.reads) == 2
    clock.now += 5
    states.current(names)
    assert reader.lists == 2 and len(reader.reads) == 4


def test_a_container_that_is_down_or_unreadable_leaves_its_node_alone():
    reader = FakeReader({"gpu-h100-0": False, "gpu-h100-1": True, "gpu-a100-0": True},
                        {"gpu-h100-1": dpd.MigReadError("nvidia-smi exited 9"), "gpu-a100-0": node_state()})
    states = dpd.NodeMigStates(reader, refresh_s=0)
    assert states.current(["gpu-h100-0", "gpu-h100-1", "gpu-a100-0"]) == {
        "gpu-h100-0": None, "gpu-h100-1": None, "gpu-a100-0": node_state()}
    assert "gpu-h100-0" not in reader.reads  # a stopped container is not exec'd
    reader.containers_now = dpd.MigReadError("podman ps failed")
    assert states.current(["gpu-h100-0", "gpu-a100-0"]) == {"gpu-h100-0": None, "gpu-a100-0": None}


def test_reconcile_reads_container_nodes_from_nvidia_smi_and_keeps_a_down_one():
    mixed = {"default": CONFIG_MAP["mig-mixed"]}
    labels = {dpd.MIG_CONFIG_LABEL: "all-1g.10gb"}
    before = node_as_advertised("gpu-h100-1", H100, advertise(H100, "default"), labels)
    api = RecordingCoreV1Api([node("gpu-h100-0", gpu_annotations(H100), labels), before,
                              node("gpu-h100-2", gpu_annotations(H100), labels)], mixed)
    reader = FakeReader({"gpu-h100-0": True, "gpu-h100-1": False},
                        {"gpu-h100-0": node_state(*[gpu_state(i, "3g.40gb", "4g.40gb") for i in range(8)])})
    result = dpd.reconcile_once(api, "nvidia-device-plugin", "nvidia-device-plugin-configs", "default",
                                mig_states=dpd.NodeMigStates(reader))
    capacity = api.nodes["gpu-h100-0"]["status"]["capacity"]
    assert {k: v for k, v in capacity.items() if k.startswith("nvidia.com/")} == {
        "nvidia.com/mig-3g.40gb": "8", "nvidia.com/mig-4g.40gb": "8"}
    assert api.nodes["gpu-h100-1"] == before  # its container is down: the last advertisement stays
    # A kwok-only node still follows its mig.config label.
    assert api.nodes["gpu-h100-2"]["status"]["capacity"]["nvidia.com/mig-1g.10gb"] == "56"
    assert result.gpu_nodes == 2 and api.patched() == {"gpu-h100-0", "gpu-h100-2"}


def test_podman_reader_runs_ps_and_one_exec_per_node():
    calls: list[list[str]] = []
    ps_json = json.dumps([{"Names": ["gpu-h100-0"], "State": "running"}, {"Names": ["gpu-a100-0"], "State": "exited"}])
    answer = "0, NVIDIA A100-SXM4-40GB, Enabled\n@@gpu-lab-mig@@\nGPU 0: NVIDIA A100-SXM4-40GB (UUID: " \
             "GPU-2f46499f-c364-5968-49f5-d728006a2799)\n  MIG 1g.5gb      Device  0: (UUID: " \
             "MIG-5485b1ca-fc02-687b-abde-4cfe807ec4ef)\n"

    def runner(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess:
        calls.append(argv)
        assert kwargs["timeout"] > 0 and kwargs["check"] is False
        out = ps_json if argv[1] == "ps" else answer
        return subprocess.CompletedProcess(argv, 0, out, "")

    reader = dpd.PodmanMigReader(runner=runner)
    assert reader.containers() == {"gpu-h100-0": True, "gpu-a100-0": False}
    assert calls[0] == ["podman", "ps", "-a", "--filter", "label=gpu-lab.role=node", "--format", "json"]
    assert reader.read("gpu-a100-0") == dpd.NodeMigState(
        (dpd.GpuMigState(0, "NVIDIA A100-SXM4-40GB", True, True, ("1g.5gb",)),))
    assert calls[1] == ["podman", "exec", "gpu-a100-0", "sh", "-c", dpd.MIG_READ_SCRIPT]

    def failing(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess:
        return subprocess.CompletedProcess(argv, 125, "", "Error: no container with name gpu-x")

    with pytest.raises(dpd.MigReadError, match="exited 125"):
        dpd.PodmanMigReader(runner=failing).read("gpu-x")

    def missing(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess:
        raise FileNotFoundError(argv[0])

    assert dpd.PodmanMigReader(runner=missing).containers() == {}  # no podman: no lab containers here
