"""The nvidia_driver role's two package naming schemes, resolved as data on every supported OS, source and flavour.

NVIDIA's CUDA repository names its Debian and Ubuntu driver metapackages after the branch up to 580
(`cuda-drivers-580`, `nvidia-open-580`); from 590 the names carry no branch (`cuda-drivers`, `nvidia-open`) and
`nvidia-driver-pinning-<branch>`, installed first, keeps apt on the branch. RHEL 9 keeps its dnf module streams on
both sides. The per-OS catalogs (roles/nvidia_driver/vars/<OS>.yml) say which; these tests read them through Ansible's
own templar, as test_role_data.py does.
"""

from __future__ import annotations

import pytest

from test_role_data import OS_FACTS, driver_templar, resolve

APT_OS = ["Debian-12", "Debian-13", "Ubuntu-22", "Ubuntu-24"]
DNF_OS = ["RedHat-9", "Rocky-9"]
FLAVOURS = ["open", "proprietary"]
OLD_NAMES = {"open": "nvidia-open-{branch}", "proprietary": "cuda-drivers-{branch}"}
NEW_NAMES = {"open": "nvidia-open", "proprietary": "cuda-drivers"}
DNF_STREAMS = {"open": "@nvidia-driver:{branch}-open", "proprietary": "@nvidia-driver:{branch}-dkms"}


def selection(os_name: str, **overrides) -> dict:
    """What the role resolves for these inputs: packages, pinning, pinned version and the install list."""
    templar = driver_templar(os_name, **overrides)
    return {name.strip("_").removeprefix("nvidia_driver_"): resolve(templar, name) for name in (
        "_nvidia_driver_series_key", "_nvidia_driver_packages", "_nvidia_driver_pinning_packages",
        "_nvidia_driver_pinned_packages", "_nvidia_driver_apt_version", "_nvidia_driver_apt_version_regex")}


@pytest.mark.parametrize("modules", FLAVOURS)
@pytest.mark.parametrize("branch", ["535", "570", "580", "589"])
@pytest.mark.parametrize("source", ["cuda_repo", "mirror"])
@pytest.mark.parametrize("os_name", APT_OS)
def test_branches_before_590_name_the_branch_and_need_no_pinning(os_name, source, branch, modules):
    found = selection(os_name, nvidia_driver_source=source, nvidia_driver_mirror_packages="cuda_repo",
                      nvidia_driver_branch=branch, nvidia_driver_kernel_modules=modules)
    assert found["series_key"] == "*"
    assert found["packages"] == [OLD_NAMES[modules].format(branch=branch), "nvidia-persistenced"]
    assert found["pinning_packages"] == []
    # The name holds the branch: any version of it will do.
    assert found["apt_version"] == "" and found["apt_version_regex"] == ""


@pytest.mark.parametrize("modules", FLAVOURS)
@pytest.mark.parametrize("branch", ["590", "595", "610"])
@pytest.mark.parametrize("source", ["cuda_repo", "mirror"])
@pytest.mark.parametrize("os_name", APT_OS)
def test_branches_from_590_install_the_pinning_package_first(os_name, source, branch, modules):
    found = selection(os_name, nvidia_driver_source=source, nvidia_driver_mirror_packages="cuda_repo",
                      nvidia_driver_branch=branch, nvidia_driver_kernel_modules=modules)
    assert found["series_key"] == ">=590"
    pinning = f"nvidia-driver-pinning-{branch}"
    assert found["pinning_packages"] == [pinning]
    # First in the list: installed (alone) and held with the others, recorded for the next branch change.
    assert found["packages"] == [pinning, NEW_NAMES[modules], "nvidia-persistenced"]
    # The unversioned name is asked for at the branch, so a branch change moves it.
    assert found["pinned_packages"] == [NEW_NAMES[modules]]
    assert found["apt_version"] == f"{branch}.*"
    assert found["apt_version_regex"] == f"([0-9]+:)?{branch}[.]"


@pytest.mark.parametrize("os_name", APT_OS)
def test_exact_version_pins_the_package_in_both_schemes(os_name):
    old = selection(os_name, nvidia_driver_branch="580", nvidia_driver_version="580.105.08")
    assert old["apt_version"] == "580.105.08-*"
    new = selection(os_name, nvidia_driver_branch="590", nvidia_driver_version="590.48.01")
    assert new["apt_version"] == "590.48.01-*"
    assert new["apt_version_regex"] == r"([0-9]+:)?590\.48\.01-"
    assert new["pinning_packages"] == ["nvidia-driver-pinning-590"]


@pytest.mark.parametrize("modules", FLAVOURS)
@pytest.mark.parametrize("branch", ["580", "590", "595"])
@pytest.mark.parametrize("os_name", DNF_OS)
def test_rhel9_keeps_module_streams_on_both_sides_of_590(os_name, branch, modules):
    """NVIDIA's RHEL 8/9 instructions select a branch by module stream also from 590 (dnf versionlock is RHEL 10's)."""
    found = selection(os_name, nvidia_driver_source="cuda_repo", nvidia_driver_branch=branch,
                      nvidia_driver_kernel_modules=modules)
    assert found["packages"] == [DNF_STREAMS[modules].format(branch=branch), "nvidia-persistenced"]
    assert found["pinning_packages"] == []


@pytest.mark.parametrize("os_name", ["Ubuntu-22", "Ubuntu-24"])
def test_ubuntu_distribution_packages_keep_the_branch_from_590(os_name):
    """Canonical's restricted archive still names its driver series after the branch."""
    found = selection(os_name, nvidia_driver_source="distribution", nvidia_driver_branch="590")
    assert found["packages"] == ["nvidia-headless-590-server-open", "nvidia-utils-590-server"]
    assert found["pinning_packages"] == []


@pytest.mark.parametrize("os_name", APT_OS)
def test_the_default_branch_is_still_the_old_scheme(os_name):
    found = selection(os_name, nvidia_driver_source="cuda_repo")
    assert found["packages"] == ["nvidia-open-580", "nvidia-persistenced"]


def test_every_os_is_covered():
    assert sorted(APT_OS + DNF_OS) == sorted(OS_FACTS)


def install_plan(os_name: str, installed: dict[str, list[str]], held: list[str], **overrides) -> dict:
    """The apt decisions of the role for a host with these packages (name -> versions) and holds."""
    facts = dict(OS_FACTS[os_name], architecture="x86_64", kernel="6.1.0-28-amd64", packages={
        name: [{"name": name, "version": version} for version in versions] for name, versions in installed.items()},
        nvidia_driver={"in_container": True, "managed": {"packages": overrides.pop("recorded", [])}})
    templar = driver_templar(os_name, **overrides)
    templar.available_variables = dict(templar.available_variables, ansible_facts=facts,
                                       __nvidia_driver_probe={"apt": {"held": held}})
    return {name: resolve(templar, f"__nvidia_driver_{name}") for name in (
        "retired", "moved", "released", "install", "packages_differ", "holds_differ")}


def test_branch_change_580_to_590_retires_the_branch_named_package():
    plan = install_plan("Debian-12", {"nvidia-open-580": ["580.105.08-1"], "nvidia-persistenced": ["580.105.08-1"]},
                        ["nvidia-open-580", "nvidia-persistenced"], recorded=["nvidia-open-580", "nvidia-persistenced"],
                        nvidia_driver_branch="590")
    assert plan["retired"] == ["nvidia-open-580"]
    assert plan["released"] == ["nvidia-open-580"]
    assert plan["install"] == ["nvidia-driver-pinning-590", "nvidia-persistenced", "nvidia-open=590.*"]
    assert plan["packages_differ"] is True


def test_branch_change_590_to_595_moves_the_unversioned_package_and_replaces_the_pinning_package():
    installed = {"nvidia-driver-pinning-590": ["590-1"], "nvidia-open": ["590.48.01-1"],
                 "nvidia-persistenced": ["580.105.08-1"]}
    plan = install_plan("Ubuntu-24", installed, list(installed), recorded=list(installed), nvidia_driver_branch="595")
    assert plan["retired"] == ["nvidia-driver-pinning-590"]
    # Same name, other branch: its hold goes before apt installs 595, then comes back.
    assert plan["moved"] == ["nvidia-open"]
    assert sorted(plan["released"]) == ["nvidia-driver-pinning-590", "nvidia-open"]
    assert plan["install"] == ["nvidia-driver-pinning-595", "nvidia-persistenced", "nvidia-open=595.*"]
    assert plan["packages_differ"] is True


def test_a_converged_590_host_needs_nothing():
    installed = {"nvidia-driver-pinning-590": ["590-1"], "nvidia-open": ["590.48.01-1"],
                 "nvidia-persistenced": ["580.105.08-1"]}
    plan = install_plan("Debian-13", installed, list(installed), recorded=list(installed), nvidia_driver_branch="590")
    assert plan["retired"] == [] and plan["moved"] == [] and plan["released"] == []
    assert plan["packages_differ"] is False and plan["holds_differ"] is False


def test_exact_version_change_inside_590_moves_the_package():
    installed = {"nvidia-driver-pinning-590": ["590-1"], "cuda-drivers": ["590.44.01-1"],
                 "nvidia-persistenced": ["580.105.08-1"]}
    plan = install_plan("Debian-12", installed, list(installed), recorded=list(installed), nvidia_driver_branch="590",
                        nvidia_driver_kernel_modules="proprietary", nvidia_driver_version="590.48.01")
    assert plan["moved"] == ["cuda-drivers"]
    assert "cuda-drivers=590.48.01-*" in plan["install"]


def selection_problems(os_name: str, **overrides) -> list[str]:
    templar = driver_templar(os_name, **overrides)
    return resolve(templar, "__nvidia_driver_selection_problems")


def test_a_branch_the_source_cannot_serve_is_refused_naming_variable_value_and_choices():
    problems = selection_problems("Debian-12", nvidia_driver_source="distribution", nvidia_driver_branch="590")
    assert len(problems) == 1
    assert 'nvidia_driver_branch="590"' in problems[0]
    assert "allowed: 535, 470" in problems[0]


def test_a_version_outside_the_default_branch_is_refused_on_both_sides():
    problems = selection_problems("Ubuntu-24", nvidia_driver_version="590.48.01")
    assert len(problems) == 1
    assert 'nvidia_driver_version="590.48.01"' in problems[0] and "branch 580" in problems[0]
    assert selection_problems("Ubuntu-24", nvidia_driver_branch="590", nvidia_driver_version="590.48.01") == []


def test_the_pinning_package_is_not_offered_as_a_module_flavour():
    problems = selection_problems("Debian-13", nvidia_driver_branch="590", nvidia_driver_kernel_modules="pinning")
    assert len(problems) == 1
    assert "allowed: proprietary, open." in problems[0]
