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


def test_the_plugins_own_sections_and_forms_are_accepted():
    """What the plugin's loader accepts (tests/unit/test_device_plugin_oracle.py runs it): a top-level imex section,
    a resource name without its nvidia.com/ prefix, and a rename that only repeats renameByDefault's."""
    config = {"version": "v1", "imex": {"channelIDs": [0], "required": True}, "sharing": {"timeSlicing": {
        "renameByDefault": True, "resources": [{"name": "gpu", "replicas": 2, "rename": "nvidia.com/gpu.shared",
                                                "devices": "all"}]}}}
    assert problems({"default": config}, "default") == []


def test_what_the_pinned_v0_20_adds_is_judged_as_v0_20_does():
    """The oracle (v0.18.0) has neither: flags.plugin.sharedDevicesAllocationPolicy and a GFD sleepInterval of
    "infinite" are v0.20's, the pinned image's release (docs/device_plugin.md)."""
    def config(policy, interval="infinite"):
        return {"default": {"version": "v1", "flags": {"plugin": {"sharedDevicesAllocationPolicy": policy},
                                                       "gfd": {"sleepInterval": interval}}}}
    assert problems(config("packed"), "default") == []
    assert problems(config("distributed", "30s"), "default") == []
    assert problems(config("spread", "forever"), "default") == [
        "config 'default': flags.plugin.sharedDevicesAllocationPolicy='spread'; allowed: distributed, packed",
        "config 'default': flags.gfd.sleepInterval='forever'; allowed: a duration such as 60s or 1m30s, infinite, or "
        "nanoseconds as a number"]


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
     "allowed: nvidia.com/gpu only (project rule: the plugin accepts it, but MPS shares only full GPUs"),
    ({"default": {"version": "v1", "flags": {"migStrategy": "single"},
                  "sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}}}},
     "sharing.mps with flags.migStrategy='single'"),
    ({"default": {"version": "v1", "sharing": {"timeSlicing": {"resources": []}}}}, "resources=[]"),
    ({"default": {"version": "v1", "sharing": {"timeSlicing": {"resources": [{"name": "example.com/gpu",
                                                                               "replicas": 2}]}}}},
     "name='example.com/gpu'; allowed: a resource name such as nvidia.com/gpu (nvidia.com/ added when missing"),
    ({"default": {"version": "v1", "imex": {"channelIDs": [1]}}},
     "config 'default': imex.channelIDs=[1]; allowed: [] or [0]"),
    ({"default": {"version": "v1", "sharing": {"timeSlicing": {"resources": [
        {"name": "nvidia.com/gpu", "replicas": 4, "devices": ["A100"]}]}}}},
     "sharing.timeSlicing.resources[0].devices=['A100']; allowed: 'all', a count above 0, or a list of GPU indexes"),
    ({"default": {"version": "v1", "sharing": {"timeSlicing": {"resources": [
        {"name": "nvidia.com/gpu", "replicas": 4, "rename": "Shared"}]}}}},
     "sharing.timeSlicing.resources[0].rename='Shared'; allowed: a resource name"),
    ({"default": {"version": "v1", "sharing": {"timeSlicing": {"resources": [
        {"name": "nvidia.com/gpu", "replicas": 4, "rename": "gpu-shared"}]}}}},
     "rename='gpu-shared'; allowed: no rename, or renameByDefault: true (which advertises nvidia.com/gpu.shared) "
     "(project rule: the plugin accepts it but ignores it"),
    ({"default": {"version": "v1", "flags": {"mpsRoot": "/var/lib/mps"},
                  "sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}}}},
     "config 'default': flags.mpsRoot='/var/lib/mps'; allowed: unset, or '/run/nvidia/mps' (project rule: the plugin "
     "takes MPS_ROOT from its environment over the file"),
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


MPS = {"version": "v1", "sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}}


def test_mps_is_accepted_with_the_mps_root_the_daemonset_gives():
    """Before the role gave the plugin MPS_ROOT, every MPS config without flags.mpsRoot (all of NVIDIA's published
    ones) was refused; now it goes in unchanged, judged with the role's root."""
    assert problems({"default": MPS}, "default") == []
    assert problems({"default": MPS}, "default", None, "/srv/mps") == []
    with_root = {**MPS, "flags": {"mpsRoot": "/srv/mps"}}
    assert problems({"default": with_root}, "default", None, "/srv/mps") == []
    assert problems({"default": MPS}, "default", None, "") == [
        "config 'default': sharing.mps without flags.mpsRoot; allowed: MPS with flags.mpsRoot set, or an MPS_ROOT in "
        "the plugin's environment (the plugin refuses MPS without an MPS root)"]


def test_node_labels_place_the_mps_daemon_on_the_nodes_whose_config_uses_mps():
    labels = filters.device_plugin_node_labels
    configs = {"default": {"version": "v1"}, "mps": MPS, "ts": ts(4), "mps-null": {"version": "v1", "sharing": {
        "mps": None}}}
    found = labels({"a": "mps", "b": "", "c": None, "d": "ts", "e": "mps-null", "f": "missing"}, configs, "default",
                   "deploy", "mps-label")
    assert found == {
        "a": {"deploy": "true", "nvidia.com/device-plugin.config": "mps", "mps-label": "true"},
        "b": {"deploy": "true", "nvidia.com/device-plugin.config": None, "mps-label": None},
        "c": {"deploy": "true", "nvidia.com/device-plugin.config": None, "mps-label": None},
        "d": {"deploy": "true", "nvidia.com/device-plugin.config": "ts", "mps-label": None},
        "e": {"deploy": "true", "nvidia.com/device-plugin.config": "mps-null", "mps-label": None},
        "f": {"deploy": "true", "nvidia.com/device-plugin.config": "missing", "mps-label": None}}
    # The default config counts for the nodes that choose none.
    assert labels({"b": ""}, configs, "mps", "deploy", "mps-label")["b"]["mps-label"] == "true"
    with pytest.raises(AnsibleFilterError, match="node_choices must be a mapping"):
        labels(["a"], configs, "default", "deploy", "mps-label")
