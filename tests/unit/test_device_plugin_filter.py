"""The device plugin role's input checks: every problem named with its config, key, value and what is allowed."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from ansible.errors import AnsibleFilterError

from conftest import load_filter_plugin

ROOT = Path(__file__).resolve().parents[2]
filters = load_filter_plugin("device_plugin")
problems = filters.device_plugin_config_problems

LAB_CONFIGS = yaml.safe_load((ROOT / "inventories" / "lab" / "group_vars" / "cluster_control" / "device_plugin.yml")
                             .read_text())["nvidia_device_plugin_configs"]
ROLE_DEFAULTS = yaml.safe_load((ROOT / "roles" / "nvidia_device_plugin" / "defaults" / "main.yml").read_text())


def ts(replicas, **extra):
    return {"version": "v1", "sharing": {"timeSlicing": {**extra, "resources": [
        {"name": "nvidia.com/gpu", "replicas": replicas}]}}}


def test_the_shipped_configs_are_valid():
    assert problems(LAB_CONFIGS, "default", {"gpu-a100-0": "time-sliced", "gpu-h100-0": ""}) == []
    assert problems(ROLE_DEFAULTS["nvidia_device_plugin_configs"], ROLE_DEFAULTS["nvidia_device_plugin_default_config"]) == []


@pytest.mark.parametrize(("configs", "expected"), [
    ({"default": ts(1)}, "config 'default': sharing.timeSlicing.resources[0].replicas=1; allowed: an integer of at "
                         "least 2"),
    ({"default": ts("4")}, "replicas='4'"),
    ({"default": ts(True)}, "replicas=True"),
    ({"default": ts(4, renameByDefault="yes")}, "sharing.timeSlicing.renameByDefault='yes'; allowed: true or false"),
    ({"default": {"version": "v1", "flags": {"migStrategy": "all"}}}, "flags.migStrategy='all'; allowed: none, "
                                                                      "single, mixed"),
    ({"default": {"version": "v2"}}, "version='v2'; allowed: v1"),
    ({"default": {"version": "v1", "sharing": {"mps": {"resources": [{"name": "nvidia.com/mig-1g.10gb",
                                                                       "replicas": 2}]}}}},
     "allowed: nvidia.com/gpu only (MPS shares full GPUs)"),
    ({"default": {"version": "v1", "flags": {"migStrategy": "single"},
                  "sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}}}},
     "sharing.mps with flags.migStrategy='single'"),
    ({"default": {"version": "v1", "sharing": {"timeSlicing": {"resources": []}}}}, "resources=[]"),
    ({"default": {"version": "v1", "sharing": {"timeSlicing": {"resources": [{"name": "gpu", "replicas": 2}]}}}},
     "name='gpu'; allowed: an nvidia.com/ resource name"),
    ({"default": {"version": "v1", "sharing": {"slicing": {}}}}, "unknown sharing kinds ['slicing']"),
    ({"default": {"version": "v1", "flag": {}}}, "unknown keys ['flag']"),
    ({"bad name!": {"version": "v1"}, "default": {"version": "v1"}}, "config name 'bad name!'"),
    ({}, "nvidia_device_plugin_configs={}; allowed: a non-empty mapping"),
])
def test_each_bad_config_is_named(configs, expected):
    found = problems(configs, "default")
    assert any(expected in problem for problem in found), found


def test_default_and_node_choices_must_name_configs():
    found = problems({"default": {"version": "v1"}}, "shared", {"gpu-0": "shared", "gpu-1": ""})
    assert found == ["nvidia_device_plugin_default_config='shared' names no config; allowed: default",
                     "gpu-0: nvidia_device_plugin_config='shared' names no config; allowed: default"]
    with pytest.raises(AnsibleFilterError, match="node_choices must be a mapping"):
        problems({"default": {}}, "default", ["gpu-0"])
