"""Per-OS data of the cuda_toolkit role, rendered by Ansible's own templar: versions, packages, layout, repositories.

Debian 12 (distribution) and Debian 13 (mirror of NVIDIA's layout) also run end to end in Molecule; Ubuntu and
RHEL/Rocky are proven here, as data, because no image of them can be built on this machine.
"""

from __future__ import annotations

import configparser
import subprocess

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template
from test_role_data import OS_FACTS, ROLES, parse_deb822

ROLE = ROLES / "cuda_toolkit"


def os_vars_file(os_name: str):
    facts = OS_FACTS[os_name]
    for name in (f"{facts['distribution']}-{facts['distribution_major_version']}",
                 f"{facts['os_family']}-{facts['distribution_major_version']}"):
        if (ROLE / "vars" / f"{name}.yml").exists():
            return ROLE / "vars" / f"{name}.yml"
    raise AssertionError(f"no vars file for {os_name}")


def templar(os_name: str, arch: str = "x86_64", **overrides) -> Templar:
    loader = DataLoader()
    variables: dict = {}
    for path in (ROLE / "defaults" / "main.yml", ROLE / "vars" / "main.yml", os_vars_file(os_name)):
        variables.update(loader.load_from_file(str(path), trusted_as_template=True))
    variables.update(ansible_facts=dict(OS_FACTS[os_name], architecture=arch), ansible_managed="Ansible managed",
                     role_path=str(ROLE))
    variables.update(overrides)
    return Templar(loader=loader, variables=variables)


def resolve(tmpl: Templar, name: str):
    return tmpl.template(tmpl.available_variables[name])


def render(tmpl: Templar, template: str) -> str:
    return tmpl.template(trust_as_template((ROLE / "templates" / template).read_text(encoding="utf-8")))


def version_key(version: str) -> tuple[int, int]:
    major, minor = version.split(".")
    return int(major), int(minor)


def test_every_supported_os_has_a_catalog_with_the_default_version():
    supported = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())["_cuda_toolkit_supported_os"]
    assert sorted(supported) == sorted(OS_FACTS)
    default_versions = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())["cuda_toolkit_versions"]
    for os_name in supported:
        catalogs = resolve(templar(os_name), "_cuda_toolkit_catalogs")
        # The role's defaults must work on every supported OS with the default source (lesson of upstream users
        # whose new OS release had no default).
        assert set(default_versions) <= set(catalogs["cuda_repo"]["versions"]), os_name
        for source, catalog in catalogs.items():
            versions = catalog["versions"]
            assert catalog["layout"] in ("versioned", "distribution"), (os_name, source)
            assert all(isinstance(v, str) and len(v.split(".")) == 2 for v in versions), (os_name, source, versions)
            assert versions == sorted(versions, key=version_key), f"{os_name} {source}: keep versions in order"
            assert len(set(versions)) == len(versions), (os_name, source)
            if catalog["layout"] == "distribution":
                assert len(versions) == 1, f"{os_name}: a distribution ships one toolkit version"


def test_lab_doubles_are_versions_nvidia_offers():
    """The lab mirror's cuda-toolkit-X-Y doubles must be versions the real repository of that OS has."""
    for os_name, doubles in {"Debian-12": ["12.6", "12.8"], "Debian-13": ["12.8", "13.0"]}.items():
        assert set(doubles) <= set(resolve(templar(os_name), "_cuda_toolkit_catalogs")["cuda_repo"]["versions"])


@pytest.mark.parametrize(
    ("os_name", "overrides", "packages", "default", "directory"),
    [
        ("Debian-13", {"cuda_toolkit_versions": ["12.8", "13.0"]},
         ["cuda-toolkit-12-8", "cuda-toolkit-13-0"], "13.0", "/usr/local/cuda-13.0"),
        ("Debian-12", {"cuda_toolkit_versions": ["12.9", "12.4"]},
         ["cuda-toolkit-12-9", "cuda-toolkit-12-4"], "12.9", "/usr/local/cuda-12.9"),
        ("Ubuntu-24", {"cuda_toolkit_versions": ["12.8", "13.0"], "cuda_toolkit_default_version": "12.8"},
         ["cuda-toolkit-12-8", "cuda-toolkit-13-0"], "12.8", "/usr/local/cuda-12.8"),
        ("Debian-12", {"cuda_toolkit_source": "distribution", "cuda_toolkit_versions": ["11.8"]},
         ["nvidia-cuda-toolkit"], "11.8", "/usr/lib/nvidia-cuda-toolkit"),
        ("Debian-13", {"cuda_toolkit_source": "mirror", "cuda_toolkit_mirror_packages": "distribution",
                       "cuda_toolkit_versions": ["12.4"]},
         ["nvidia-cuda-toolkit"], "12.4", "/usr/lib/nvidia-cuda-toolkit"),
        ("Rocky-9", {"cuda_toolkit_versions": ["11.8", "12.6"]},
         ["cuda-toolkit-11-8", "cuda-toolkit-12-6"], "12.6", "/usr/local/cuda-12.6"),
    ],
)
def test_packages_default_and_directory(os_name, overrides, packages, default, directory):
    tmpl = templar(os_name, **overrides)
    assert resolve(tmpl, "_cuda_toolkit_packages") == packages
    assert resolve(tmpl, "_cuda_toolkit_default_version") == default
    assert resolve(tmpl, "_cuda_toolkit_default_directory") == directory


def test_empty_default_is_the_highest_version_not_the_last_string():
    tmpl = templar("Ubuntu-22", cuda_toolkit_versions=["12.9", "12.10", "11.8"])
    assert resolve(tmpl, "_cuda_toolkit_default_version") == "12.10"


def test_removal_names_the_versioned_packages_whatever_the_source():
    tmpl = templar("Debian-12", cuda_toolkit_source="distribution", cuda_toolkit_versions=["11.8"],
                   cuda_toolkit_remove_versions=["12.6", "13.0"])
    assert resolve(tmpl, "_cuda_toolkit_remove_packages") == ["cuda-toolkit-12-6", "cuda-toolkit-13-0"]


@pytest.mark.parametrize(
    ("os_name", "arch", "url", "key"),
    [
        ("Debian-12", "x86_64", "https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/", "3bf863cc.pub"),
        ("Debian-13", "x86_64", "https://developer.download.nvidia.com/compute/cuda/repos/debian13/x86_64/", "3bf863cc.pub"),
        ("Ubuntu-22", "aarch64", "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2204/sbsa/", "3bf863cc.pub"),
        ("Ubuntu-24", "x86_64", "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/x86_64/", "3bf863cc.pub"),
        ("RedHat-9", "x86_64", "https://developer.download.nvidia.com/compute/cuda/repos/rhel9/x86_64/", "D42D0685.pub"),
    ],
)
def test_cuda_repository_urls(os_name, arch, url, key):
    tmpl = templar(os_name, arch=arch)
    assert resolve(tmpl, "_cuda_toolkit_repo")["url"] == url
    assert resolve(tmpl, "_cuda_toolkit_key_url") == url + key


def test_cuda_repository_urls_are_overridable():
    tmpl = templar("Debian-13", cuda_toolkit_cuda_repo_base_url="http://proxy.example/cuda")
    assert resolve(tmpl, "_cuda_toolkit_key_url") == "http://proxy.example/cuda/debian13/x86_64/3bf863cc.pub"


@pytest.mark.parametrize(
    ("os_name", "overrides", "expected"),
    [
        ("Ubuntu-24", {}, {"URIs": "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/x86_64/",
                           "Suites": "/", "Signed-By": "/etc/apt/keyrings/cuda-toolkit.asc"}),
        ("Debian-12", {"cuda_toolkit_source": "distribution"},
         {"URIs": "http://deb.debian.org/debian", "Suites": "bookworm bookworm-updates", "Components": "contrib non-free",
          "Signed-By": "/usr/share/keyrings/debian-archive-keyring.gpg"}),
        ("Debian-13", {"cuda_toolkit_source": "mirror", "cuda_toolkit_mirror_url": "http://127.0.0.1:8080/cuda/repos/debian13/x86_64/",
                       "cuda_toolkit_mirror_key_url": "http://127.0.0.1:8080/gpu-lab-mirror.asc"},
         {"URIs": "http://127.0.0.1:8080/cuda/repos/debian13/x86_64/", "Suites": "/",
          "Signed-By": "/etc/apt/keyrings/cuda-toolkit.asc"}),
        ("Debian-13", {"cuda_toolkit_source": "mirror", "cuda_toolkit_mirror_url": "http://10.0.0.5/debian",
                       "cuda_toolkit_mirror_key_url": "http://10.0.0.5/key.asc", "cuda_toolkit_mirror_suite": "trixie",
                       "cuda_toolkit_mirror_components": ["non-free"], "cuda_toolkit_mirror_packages": "distribution"},
         {"URIs": "http://10.0.0.5/debian", "Suites": "trixie", "Components": "non-free"}),
    ],
)
def test_apt_sources_render_as_deb822(os_name, overrides, expected):
    fields = parse_deb822(render(templar(os_name, **overrides), "cuda-toolkit.sources.j2"))
    assert fields["Types"] == "deb"
    for key, value in expected.items():
        assert fields[key] == value
    if "Components" not in expected:
        assert "Components" not in fields


def test_ubuntu_distribution_needs_no_repository():
    assert resolve(templar("Ubuntu-22", cuda_toolkit_source="distribution"), "_cuda_toolkit_repo") == {}


def test_rhel_has_no_distribution_source():
    assert "distribution" not in resolve(templar("RedHat-9"), "_cuda_toolkit_catalogs")


@pytest.mark.parametrize("os_name", ["RedHat-9", "Rocky-9"])
def test_dnf_repository_renders(os_name):
    parser = configparser.ConfigParser()
    parser.read_string(render(templar(os_name), "cuda-toolkit.repo.j2"))
    repo = parser["cuda-toolkit"]
    assert repo["baseurl"] == "https://developer.download.nvidia.com/compute/cuda/repos/rhel9/x86_64/"
    assert repo["gpgcheck"] == "1" and repo["gpgkey"] == "file:///etc/pki/rpm-gpg/RPM-GPG-KEY-cuda-toolkit"


@pytest.mark.parametrize(
    ("overrides", "path_before", "path_after", "cuda_home"),
    [
        ({}, "/usr/bin:/bin", "/usr/local/cuda/bin:/usr/bin:/bin", "/usr/local/cuda"),
        # Sourced twice (nested login shells): PATH gets the directory once.
        ({}, "/usr/local/cuda/bin:/usr/bin", "/usr/local/cuda/bin:/usr/bin", "/usr/local/cuda"),
        ({"cuda_toolkit_source": "distribution", "cuda_toolkit_versions": ["11.8"]}, "/usr/bin:/bin", "/usr/bin:/bin",
         "/usr/lib/nvidia-cuda-toolkit"),
    ],
)
def test_profile_script_sets_path_and_cuda_home(tmp_path, overrides, path_before, path_after, cuda_home):
    script = tmp_path / "cuda-toolkit.sh"
    script.write_text(render(templar("Debian-12", **overrides), "cuda-toolkit.sh.j2"), encoding="utf-8")
    result = subprocess.run(["sh", "-c", f'. "{script}"; echo "$PATH"; echo "$CUDA_HOME"'],
                            env={"PATH": path_before}, capture_output=True, text=True, check=True)
    assert result.stdout.splitlines() == [path_after, cuda_home]


def test_library_path_file_names_the_alternatives_link():
    lines = [line for line in render(templar("Debian-13"), "cuda-toolkit.conf.j2").splitlines() if not line.startswith("#")]
    assert lines == ["/usr/local/cuda/lib64"]
