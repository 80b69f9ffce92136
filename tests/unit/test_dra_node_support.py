"""nvidia_dra_driver's preflight on the nodes in dra mode: a container runtime without CDI and a driver branch older
than the DRA driver supports are refused before any change, with the node, the variable, its value and what is
allowed; what the inventory leaves unset is the node roles' default (kept equal to their defaults here)."""

from __future__ import annotations

import json

import pytest
import yaml

from conftest import REPO_ROOT, load_filter_plugin

dra = load_filter_plugin("dra")
ROLE_VARS = yaml.safe_load((REPO_ROOT / "roles" / "nvidia_dra_driver" / "vars" / "main.yml").read_text())
DEFAULTS = ROLE_VARS["_nvidia_dra_driver_node_role_defaults"]
MIN = ROLE_VARS["_nvidia_dra_driver_min_driver_branch"]


def problems(hostvars, nodes=None):
    return dra.dra_node_support_problems(list(hostvars) if nodes is None else nodes, hostvars, DEFAULTS, MIN)


def test_the_node_role_defaults_are_the_node_roles_own():
    toolkit = yaml.safe_load((REPO_ROOT / "roles" / "nvidia_container_toolkit" / "defaults" / "main.yml").read_text())
    driver = yaml.safe_load((REPO_ROOT / "roles" / "nvidia_driver" / "defaults" / "main.yml").read_text())
    assert DEFAULTS == {"nvidia_container_toolkit_cdi": toolkit["nvidia_container_toolkit_cdi"],
                        "nvidia_driver_branch": driver["nvidia_driver_branch"]}


def test_the_minimum_branch_is_the_dra_drivers_documented_one():
    # kubernetes-sigs/dra-driver-nvidia-gpu docs/prerequisites.md: "v565 or later for GPU allocation".
    assert MIN == 565


def test_defaults_and_supported_settings_pass():
    assert problems({"a": {}, "b": {"nvidia_driver_branch": "565"}, "c": {"nvidia_driver_branch": "590",
                                                                           "nvidia_container_toolkit_cdi": "auto"}}) == []


def test_a_runtime_without_cdi_is_refused_naming_node_variable_value_and_allowed():
    assert problems({"gpu-h100-0": {"nvidia_container_toolkit_cdi": "never"}}) == [
        'nvidia_container_toolkit_cdi="never" on gpu-h100-0: dra mode needs CDI in the node\'s container runtime (the '
        'DRA driver hands GPUs to containers as CDI devices); allowed: "auto" (the container toolkit generates the '
        'CDI spec), or leave gpu-h100-0 in device-plugin mode']


@pytest.mark.parametrize("branch", ["550", "535", 470, "560"])
def test_an_older_branch_is_refused(branch):
    assert problems({"gpu-a100-0": {"nvidia_driver_branch": branch}}) == [
        f"nvidia_driver_branch={json.dumps(branch)} on gpu-a100-0: the DRA driver for GPUs supports driver branch 565 or newer; allowed: \"565\" or a newer "
        "branch, or leave gpu-a100-0 in device-plugin mode"]


def test_without_a_branch_the_facts_driver_version_is_judged():
    old = {"ansible_facts": {"nvidia_gpu": {"driver_version": "550.90.07"}}}
    new = {"ansible_facts": {"nvidia_gpu": {"driver_version": "565.57.01"}}}
    assert problems({"gpu-l4-0": old}) == [
        'nvidia_driver_branch="" on gpu-l4-0 (the OS\'s default branch) and its facts report driver 550.90.07: the DRA '
        'driver for GPUs supports driver branch 565 or newer; allowed: nvidia_driver_branch "565" or newer, or leave '
        'gpu-l4-0 in device-plugin mode']
    assert problems({"gpu-h100-0": new}) == []
    # The inventory's branch is what the node will run: it wins over older facts.
    assert problems({"gpu-l4-0": dict(old, nvidia_driver_branch="580")}) == []


def test_only_the_nodes_in_dra_mode_are_judged_and_every_problem_is_named():
    hostvars = {"a": {"nvidia_container_toolkit_cdi": "never", "nvidia_driver_branch": "550"},
                "b": {"nvidia_container_toolkit_cdi": "never"}}
    assert [p.split(":")[0] for p in problems(hostvars, ["a"])] == [
        'nvidia_container_toolkit_cdi="never" on a', 'nvidia_driver_branch="550" on a']
    assert problems(hostvars, []) == []
