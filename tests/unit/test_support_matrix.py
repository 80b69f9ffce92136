"""plugins/module_utils/support_matrix.py and its filters: combinations that cannot work are refused naming both sides
(CUDA against the driver branch, the API server's Kubernetes version against the range, a device plugin MIG strategy
against the node's GPUs and driver), and the preflight tasks that call them."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

import pytest
import yaml

from conftest import REPO_ROOT, install_collection_loader, load_filter_plugin

from ansible_collections.gpu_ops.cluster.plugins.module_utils import support_matrix as matrix

filters = load_filter_plugin("support_matrix")


# ---- CUDA and the driver --------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("driver", "minimum", "ok"), [
    ("580", "580.65.06", True),  # a branch is taken at its newest release
    ("580.65.06", "580.65.06", True), ("580.65.05", "580.65.06", False), ("580.95.05", "580.65.06", True),
    ("575", "580", False), ("590", "580", True), ("535", "525.60.13", True), ("470", "525.60.13", False),
    ("", "525.60.13", False), ("latest", "525.60.13", False),
])
def test_driver_satisfies(driver, minimum, ok):
    assert matrix.driver_satisfies(driver, minimum) is ok


def test_cuda_newer_than_the_branch_runs_is_refused_naming_both_sides():
    problems = filters.cuda_driver_problems(["12.8", "13.0"], "535")
    assert problems == [
        "cuda_toolkit_versions names CUDA 13.0, which needs driver 580 or newer (580.65.06 for all its features), but "
        "nvidia_driver_branch=535: install a newer driver branch or an older CUDA (source " + matrix.CUDA_SOURCE + ")"]


@pytest.mark.parametrize(("versions", "driver"), [
    (["12.8"], "535"),  # minor version compatibility: 12.x runs from 525.60.13
    (["11.8", "12.9", "13.0"], "580"), (["13.0"], "590"), (["11.5"], "470"),
    (["13.0"], ""),  # the driver is unknown: nothing to judge
])
def test_combinations_that_run_pass(versions, driver):
    assert filters.cuda_driver_problems(versions, driver) == []


def test_an_exact_driver_version_and_the_setting_names_come_through():
    assert filters.cuda_driver_problems(["12.0"], "525.60.11", "cuda_toolkit_versions", "nvidia_driver_version") == [
        "cuda_toolkit_versions names CUDA 12.0, which needs driver 525.60.13 or newer (525.60.13 for all its "
        "features), but nvidia_driver_version=525.60.11: install a newer driver branch or an older CUDA (source "
        + matrix.CUDA_SOURCE + ")"]
    assert filters.cuda_driver_problems(["11.8"], "418") != []


def test_an_unknown_cuda_line_is_named():
    problems = filters.cuda_driver_problems(["14.0"], "590")
    assert len(problems) == 1 and "CUDA 14.0, which this project's driver table does not know" in problems[0]


def test_every_cuda_version_has_a_major_minimum_at_or_below_its_full_minimum():
    for version, full in matrix.CUDA_TOOLKIT_DRIVER.items():
        major = matrix.CUDA_MAJOR_DRIVER[version.split(".")[0]]
        assert matrix.driver_satisfies(full, major), version


# ---- Kubernetes -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("version", "minor"), [
    ("v1.37.2", (1, 37)), ("v1.34.1-eks-1234", (1, 34)), ("v1.33.5+k3s1", (1, 33)), ("1.35", (1, 35)),
    ("", None), ("latest", None), (None, None),
])
def test_kubernetes_minor(version, minor):
    assert matrix.kubernetes_minor(version) == minor


def test_kubernetes_inside_the_range_passes_and_outside_is_refused():
    assert filters.kubernetes_version_problems("v1.37.2") == []
    assert filters.kubernetes_version_problems("v1.33.0") == []
    assert filters.kubernetes_version_problems("v1.32.9") == [
        "the API server runs Kubernetes v1.32.9; this project needs 1.33 or newer (supported: 1.33 to 1.37): upgrade "
        "the cluster"]
    assert filters.kubernetes_version_problems("v1.38.0") == [
        "the API server runs Kubernetes v1.38.0; this project supports 1.33 to 1.37, proven on the lab's 1.37 "
        "(docs/versions.md): use a release of this collection that supports it, or set "
        "gpu_cluster_kubernetes_accept_untested: \"1.38\" to run on it knowingly, untested"]
    # The override takes the one minor it names, never a newer one.
    assert filters.kubernetes_version_problems("v1.38.0", "", "", "1.38") == []
    assert filters.kubernetes_version_problems("v1.39.1", "", "", "1.38")[0].endswith(
        'gpu_cluster_kubernetes_accept_untested: "1.39" to run on it knowingly, untested')
    assert filters.kubernetes_version_problems("garbage") == [
        "the API server reports version 'garbage', which names no Kubernetes version; supported: 1.33 to 1.37"]


def test_a_feature_minimum_is_named():
    assert filters.kubernetes_version_problems("v1.33.5", "1.34", "dra mode") == [
        "the API server runs Kubernetes v1.33.5; dra mode needs 1.34 or newer (supported: 1.33 to 1.37): upgrade the "
        "cluster"]
    assert filters.kubernetes_version_problems("v1.34.0", "1.34", "dra mode") == []


# ---- MIG strategies -------------------------------------------------------------------------------------------------

CONFIGS = {"default": {"version": "v1", "flags": {"migStrategy": "none"}},
           "mig-single": {"version": "v1", "flags": {"migStrategy": "single"}},
           "mig-mixed": {"version": "v1", "flags": {"migStrategy": "mixed"}}}


def gpus(name: str, driver: str, count: int = 2) -> Dict[str, Any]:
    return {"driver_version": driver, "gpus": [{"index": i, "name": name} for i in range(count)]}


def test_mig_strategy_on_gpus_without_mig_is_refused_naming_node_config_and_product():
    problems = filters.device_plugin_mig_problems(
        {"gpu-l4-0": "mig-single", "gpu-h100-0": "mig-mixed", "gpu-l4-1": ""}, CONFIGS, "default",
        {"gpu-l4-0": gpus("NVIDIA L4", "580.95.05"), "gpu-h100-0": gpus("NVIDIA H100 80GB HBM3", "580.95.05"),
         "gpu-l4-1": gpus("NVIDIA L4", "580.95.05")})
    assert len(problems) == 1
    assert problems[0].startswith("node gpu-l4-0: nvidia_device_plugin_configs['mig-single'].flags.migStrategy=single, "
                                  "but its GPUs (NVIDIA L4) have no MIG (MIG-capable: ")


def test_mig_strategy_on_a_driver_older_than_mig_on_the_product_is_refused():
    problems = filters.device_plugin_mig_problems({"gpu-h200-0": "mig-mixed"}, CONFIGS, "default",
                                                  {"gpu-h200-0": gpus("NVIDIA H200", "535.261.03")})
    assert problems == [
        "node gpu-h200-0: nvidia_device_plugin_configs['mig-mixed'].flags.migStrategy=mixed, but its NVIDIA H200 runs "
        "driver 535.261.03 and MIG on it needs branch 550 or newer (source " + matrix.MIG_SOURCE + ")"]


def test_nodes_without_facts_and_strategy_none_are_not_judged():
    assert filters.device_plugin_mig_problems({"gpu-a": "mig-single", "gpu-b": ""}, CONFIGS, "default",
                                              {"gpu-b": gpus("NVIDIA L4", "470.256.02")}) == []
    assert filters.device_plugin_mig_problems({"gpu-a": "mig-single"}, "not configs", "default", {}) == []


def test_the_default_config_is_judged_for_nodes_without_a_choice():
    problems = filters.device_plugin_mig_problems({"gpu-a100-0": ""}, CONFIGS, "mig-single",
                                                  {"gpu-a100-0": gpus("NVIDIA A100-SXM4-40GB", "418.226.00")})
    assert len(problems) == 1 and "needs branch 450 or newer" in problems[0]


def test_every_mig_product_has_a_driver_branch():
    from ansible_collections.gpu_ops.cluster.plugins.module_utils import mig_profiles

    assert [name for name in mig_profiles.PRODUCTS if matrix.mig_driver_branch(name) is None] == []
    assert matrix.mig_driver_branch("NVIDIA H100 NVL") == 535
    assert matrix.mig_driver_branch("NVIDIA GeForce RTX 4090") is None


# ---- the preflight tasks that call them ---------------------------------------------------------------------------

def _task(path: Path, name: str) -> Dict[str, Any]:
    return next(task for task in yaml.safe_load(path.read_text()) if task["name"] == name)


def _render_assert(task: Dict[str, Any], variables: Dict[str, Any]) -> List[str]:
    """The assert's *_problems variable as Ansible renders it."""
    install_collection_loader()
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    def trusted(value: Any) -> Any:  # role data is trusted as templates, as Ansible trusts a role's files
        if isinstance(value, str):
            return trust_as_template(value)
        if isinstance(value, list):
            return [trusted(item) for item in value]
        return value

    all_vars = {key: trusted(value) if key.startswith("_") else value for key, value in variables.items()}
    all_vars.update({key: trust_as_template(value) for key, value in task["vars"].items()})
    templar = Templar(loader=DataLoader(), variables=all_vars)
    name = next(key for key in task["vars"] if key.endswith("_problems"))
    return templar.template(trust_as_template("{{ " + name + " }}"))


def test_common_refuses_an_api_server_outside_the_range_naming_the_server():
    task = _task(REPO_ROOT / "roles" / "_common" / "tasks" / "k8s_access.yml",
                 "Check that the API server runs a supported Kubernetes version")
    answers = {"results": [{"server": "https://127.0.0.1:16443", "server_version": "v1.37.2"},
                           {"server": "https://old.example:6443", "server_version": "v1.31.4"},
                           {"skipped": True}]}
    assert _render_assert(task, {"__common_k8s_access_checked": answers}) == [
        "https://old.example:6443: the API server runs Kubernetes v1.31.4; this project needs 1.33 or newer "
        "(supported: 1.33 to 1.37): upgrade the cluster"]
    assert _render_assert(task, {"__common_k8s_access_checked": {"results": answers["results"][:1]}}) == []


def test_device_plugin_preflight_reads_the_nodes_gpu_facts():
    task = _task(REPO_ROOT / "roles" / "nvidia_device_plugin" / "tasks" / "preflight.yml",
                 "Check that each node's GPUs and driver serve its MIG strategy")
    variables = {"groups": {"gpu_nodes": ["gpu-l4-0", "gpu-h100-0"]},
                 "hostvars": {"gpu-l4-0": {"ansible_facts": {"nvidia_gpu": gpus("NVIDIA L4", "580.95.05")}},
                              "gpu-h100-0": {}},
                 "__nvidia_device_plugin_node_configs": {"gpu-l4-0": "mig-single", "gpu-h100-0": "mig-mixed"},
                 "nvidia_device_plugin_configs": CONFIGS, "nvidia_device_plugin_default_config": "default"}
    problems = _render_assert(task, variables)
    assert len(problems) == 1 and problems[0].startswith("node gpu-l4-0: ")


def test_cuda_toolkit_preflight_names_where_the_driver_branch_came_from():
    role = REPO_ROOT / "roles" / "cuda_toolkit"
    task = _task(role / "tasks" / "preflight.yml", "Check that the driver branch runs every CUDA version")
    role_vars = yaml.safe_load((role / "vars" / "main.yml").read_text())
    base = {"cuda_toolkit_versions": ["12.8", "13.0"], "cuda_toolkit_driver_branch": "",
            "_cuda_toolkit_driver_sources": role_vars["_cuda_toolkit_driver_sources"],
            "_cuda_toolkit_driver": role_vars["_cuda_toolkit_driver"], "ansible_facts": {}}
    assert _render_assert(task, base) == []  # no driver known: not judged
    recorded = dict(base, ansible_facts={"ansible_local": {"nvidia_driver": {"branch": "550"}}})
    problems = _render_assert(task, recorded)
    assert len(problems) == 1 and "but the branch the nvidia_driver role recorded on this host=550" in problems[0]
    inventory = dict(recorded, nvidia_driver_branch="570")
    assert "nvidia_driver_branch=570" in _render_assert(task, inventory)[0]
    assert _render_assert(task, dict(inventory, cuda_toolkit_driver_branch="580")) == []


def test_nvidia_driver_preflight_refuses_its_branch_for_the_plays_cuda_versions():
    role = REPO_ROOT / "roles" / "nvidia_driver"
    task = _task(role / "tasks" / "preflight.yml", "Check that the driver branch runs the CUDA versions of this play")
    base = {"nvidia_driver_version": "", "nvidia_driver_branch": "", "_nvidia_driver_branch": "535",
            "_nvidia_driver_os": "Debian-12", "_nvidia_driver_catalog_name": "distribution"}
    assert _render_assert(task, base) == []  # no CUDA role in the play
    problems = _render_assert(task, dict(base, cuda_toolkit_versions=["13.0"]))
    assert len(problems) == 1 and "nvidia_driver_branch (default of Debian-12 and distribution)=535" in problems[0]
    assert _render_assert(task, dict(base, cuda_toolkit_versions=["13.0"], cuda_toolkit_enabled=False)) == []


# ---- Driver branch lifecycle ----------------------------------------------------------------------------------------

DAY = matrix.parse_day("2026-12-06")


def test_a_branch_past_its_end_is_warned_about_naming_branch_end_and_alternatives():
    warning = matrix.driver_branch_eol_warning("535", DAY)
    assert warning.startswith("driver branch 535 (long-term) reached its end of life in June 2026: NVIDIA publishes "
                              "no more security or bug fixes for it. Supported data-center branches: 580 (long-term, "
                              "until June 2028), 595 (production, until March 2027), 620 (long-term, until September "
                              "2029). Choose one with nvidia_driver_branch")
    assert warning.endswith("source " + matrix.DRIVER_LIFECYCLE_SOURCE)
    assert matrix.driver_branch_eol_warning("535.261.03", DAY) == warning  # a version is judged by its branch


@pytest.mark.parametrize(("driver", "day", "warned"), [
    ("535", "2026-06-30", False), ("535", "2026-07-01", True),  # month precision: never before the month is over
    ("580.95.05", "2026-12-06", False), ("595", "2027-03-31", False), ("595", "2027-04-01", True),
    ("610", "2026-12-06", True), ("550", "2026-12-06", True), ("470.256.02", "2026-12-06", True),
    ("615", "2026-12-06", False), ("590", "2026-12-06", False),  # no published end: not judged
    ("450", "2026-12-06", True),  # unlisted and older than every supported branch
    ("600", "2026-12-06", False), ("700", "2026-12-06", False),  # unlisted and newer: not judged
    ("", "2026-12-06", False), ("latest", "2026-12-06", False), (None, "2026-12-06", False),
])
def test_which_drivers_are_past_their_end(driver, day, warned):
    assert bool(matrix.driver_branch_eol_warning(driver, matrix.parse_day(day))) is warned


def test_supported_branches_are_those_with_a_published_end_ahead():
    assert matrix.supported_driver_branches(DAY) == [580, 595, 620]
    assert matrix.supported_driver_branches(matrix.parse_day("2026-01-15")) == [535, 570, 580, 595, 610, 620]


def test_the_unlisted_old_branch_line_says_why():
    assert matrix.driver_branch_eol_warning("450.80.02", DAY).startswith(
        "driver branch 450 is older than every branch NVIDIA still supports: ")


def test_eol_filter_groups_what_is_on_one_branch_and_keeps_the_order():
    warnings = filters.driver_branch_eol_warnings(
        {"nvidia_driver_branch=535": "535", "the running driver 535.261.03": "535.261.03",
         "the installed module 580.95.05": "580.95.05", "nothing": ""}, "2026-12-06")
    assert warnings == ["nvidia_driver_branch=535 and the running driver 535.261.03: "
                        + matrix.driver_branch_eol_warning("535", DAY)]
    assert filters.driver_branch_eol_warnings({"x": "580"}, "2026-12-06") == []


def test_eol_filter_refuses_what_is_not_a_mapping_or_a_day():
    from ansible.errors import AnsibleFilterError
    with pytest.raises(AnsibleFilterError):
        filters.driver_branch_eol_warnings(["535"], "2026-12-06")
    with pytest.raises(AnsibleFilterError):
        filters.driver_branch_eol_warnings({"x": "535"}, "06.12.2026")


def test_eol_filter_without_a_day_uses_the_controller_clock():
    assert filters.driver_branch_eol_warnings({"x": "470"}) != []  # 470 ended in 2024, whatever today is


def _render_role_var(role: str, name: str, variables: Dict[str, Any]) -> Any:
    """A role's vars/main.yml variable as Ansible renders it (the role's own variables trusted as templates)."""
    install_collection_loader()
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    role_vars = yaml.safe_load((REPO_ROOT / "roles" / role / "vars" / "main.yml").read_text())
    all_vars = {key: trust_as_template(value) if isinstance(value, str) else value for key, value in role_vars.items()}
    all_vars.update(variables)
    return Templar(loader=DataLoader(), variables=all_vars).template(trust_as_template("{{ " + name + " }}"))


def _driver_host(loaded: Any = None, installed: Any = None, **inputs: Any) -> Dict[str, Any]:
    variables = {"nvidia_driver_version": "", "nvidia_driver_branch": "", "_nvidia_driver_branch": "535",
                 "_nvidia_driver_os": "Debian-12", "_nvidia_driver_catalog_name": "distribution",
                 "ansible_facts": {"nvidia_driver": {"loaded_version": loaded, "installed_module_version": installed}}}
    variables.update(inputs)
    return variables


def test_nvidia_driver_preflight_warns_about_the_branch_it_would_install_and_the_one_the_host_runs():
    today = matrix.utc_today()  # the filter reads the controller's clock; 535 and 470 are past their end for good
    line_535 = matrix.driver_branch_eol_warning("535", today)
    assert _render_role_var("nvidia_driver", "__nvidia_driver_eol_warnings", _driver_host()) == [
        "nvidia_driver_branch (empty: 535, the default of Debian-12 and distribution): " + line_535]
    # Running and installed on the same ended branch: one line naming all three.
    assert _render_role_var("nvidia_driver", "__nvidia_driver_eol_warnings",
                            _driver_host("535.261.03", "535.261.03")) == [
        "nvidia_driver_branch (empty: 535, the default of Debian-12 and distribution) and the loaded driver "
        "535.261.03 and the installed kernel module 535.261.03: " + line_535]
    # Moving off an ended branch: the target is not warned about, the running driver still is until it changes.
    moving = _driver_host("470.256.02", None, nvidia_driver_branch="600", _nvidia_driver_branch="600")
    assert _render_role_var("nvidia_driver", "__nvidia_driver_eol_warnings", moving) == [
        "the loaded driver 470.256.02: " + matrix.driver_branch_eol_warning("470", today)]
    exact = _driver_host(nvidia_driver_version="535.261.03", nvidia_driver_branch="535")
    assert _render_role_var("nvidia_driver", "__nvidia_driver_eol_warnings", exact)[0].startswith(
        "nvidia_driver_version=535.261.03: driver branch 535 (long-term) reached its end of life in June 2026")


def test_nvidia_driver_preflight_warns_with_debug_and_never_refuses():
    tasks = yaml.safe_load((REPO_ROOT / "roles" / "nvidia_driver" / "tasks" / "preflight.yml").read_text())
    task = next(task for task in tasks if task["name"] == "Warn about a driver branch past its end of life")
    assert task["ansible.builtin.debug"] == {"msg": "{{ __nvidia_driver_eol_warnings }}"}
    assert task["when"] == "__nvidia_driver_eol_warnings | length > 0"
    assert not {"failed_when", "changed_when", "register"} & set(task)
    # After the host read: the running driver is known by then.
    names = [task["name"] for task in tasks]
    assert names.index("Warn about a driver branch past its end of life") > names.index(
        "Read the driver state, the packages and the files this role owns")
