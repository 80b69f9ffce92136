"""Per-OS data of the roles, rendered by Ansible's own templar: what each supported OS would install and configure.

Debian 12 and 13 also run end to end in Molecule; Ubuntu and RHEL/Rocky are proven here, as data, because no image of
them can be built on this machine.
"""

from __future__ import annotations

import configparser
import sys
from pathlib import Path

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "molecule"))

from driver_checks import parse_deb822  # noqa: E402  (the same deb822 reader the Molecule verifiers use)
ROLES = ROOT / "roles"
DRIVER = ROLES / "nvidia_driver"

OS_FACTS = {
    "Debian-12": {"distribution": "Debian", "distribution_major_version": "12", "os_family": "Debian", "codename": "bookworm"},
    "Debian-13": {"distribution": "Debian", "distribution_major_version": "13", "os_family": "Debian", "codename": "trixie"},
    "Ubuntu-22": {"distribution": "Ubuntu", "distribution_major_version": "22", "os_family": "Debian", "codename": "jammy"},
    "Ubuntu-24": {"distribution": "Ubuntu", "distribution_major_version": "24", "os_family": "Debian", "codename": "noble"},
    "RedHat-9": {"distribution": "RedHat", "distribution_major_version": "9", "os_family": "RedHat", "codename": ""},
    "Rocky-9": {"distribution": "Rocky", "distribution_major_version": "9", "os_family": "RedHat", "codename": ""},
}


def os_vars_file(os_name: str) -> Path:
    facts = OS_FACTS[os_name]
    for name in (f"{facts['distribution']}-{facts['distribution_major_version']}",
                 f"{facts['os_family']}-{facts['distribution_major_version']}"):
        if (DRIVER / "vars" / f"{name}.yml").exists():
            return DRIVER / "vars" / f"{name}.yml"
    raise AssertionError(f"no vars file for {os_name}")


def driver_templar(os_name: str, arch: str = "x86_64", **overrides) -> Templar:
    loader = DataLoader()
    variables: dict = {}
    for path in (DRIVER / "defaults" / "main.yml", DRIVER / "vars" / "main.yml", os_vars_file(os_name)):
        variables.update(loader.load_from_file(str(path), trusted_as_template=True))
    facts = dict(OS_FACTS[os_name], architecture=arch, kernel="6.1.0-28-amd64")
    variables.update(ansible_facts=facts, ansible_managed="Ansible managed", role_path=str(DRIVER))
    variables.update(overrides)
    return Templar(loader=loader, variables=variables)


def resolve(templar: Templar, name: str):
    return templar.template(templar.available_variables[name])


def render(templar: Templar, template: str) -> str:
    source = (DRIVER / "templates" / template).read_text(encoding="utf-8")
    return templar.template(trust_as_template(source))


def test_every_supported_os_has_data_and_defaults():
    supported = yaml.safe_load((DRIVER / "vars" / "main.yml").read_text())["_nvidia_driver_supported_os"]
    assert sorted(supported) == sorted(OS_FACTS)
    for os_name in supported:
        templar = driver_templar(os_name)
        for source, catalog in resolve(templar, "_nvidia_driver_catalogs").items():
            # A default branch must exist on every supported OS (an OS release without one broke upstream users).
            assert str(catalog["default_branch"]).isdigit(), (os_name, source)
            assert catalog["default_branch"] in catalog["series"] or "*" in catalog["series"], (os_name, source)


@pytest.mark.parametrize(
    ("os_name", "source", "modules", "branch", "packages"),
    [
        ("Debian-12", "distribution", "open", "",
         ["nvidia-driver", "nvidia-open-kernel-dkms", "nvidia-smi", "libnvidia-cfg1", "nvidia-persistenced"]),
        ("Debian-12", "distribution", "proprietary", "470",
         ["nvidia-tesla-470-driver", "nvidia-tesla-470-kernel-dkms", "nvidia-tesla-470-smi", "libnvidia-tesla-470-cfg1",
          "nvidia-persistenced"]),
        ("Debian-13", "distribution", "proprietary", "",
         ["nvidia-driver", "nvidia-kernel-dkms", "nvidia-smi", "libnvidia-cfg1", "nvidia-persistenced"]),
        ("Debian-13", "distribution", "proprietary", "535",
         ["nvidia-tesla-535-driver", "nvidia-tesla-535-kernel-dkms", "nvidia-tesla-535-smi", "libnvidia-tesla-535-cfg1",
          "nvidia-persistenced"]),
        ("Debian-12", "cuda_repo", "open", "", ["nvidia-open-580", "nvidia-persistenced"]),
        ("Debian-13", "cuda_repo", "proprietary", "570", ["cuda-drivers-570", "nvidia-persistenced"]),
        ("Ubuntu-22", "distribution", "open", "", ["nvidia-headless-580-server-open", "nvidia-utils-580-server"]),
        ("Ubuntu-24", "distribution", "proprietary", "550", ["nvidia-headless-550-server", "nvidia-utils-550-server"]),
        ("Ubuntu-24", "cuda_repo", "open", "", ["nvidia-open-580", "nvidia-persistenced"]),
        ("RedHat-9", "cuda_repo", "open", "", ["@nvidia-driver:580-open", "nvidia-persistenced"]),
        ("Rocky-9", "cuda_repo", "proprietary", "570", ["@nvidia-driver:570-dkms", "nvidia-persistenced"]),
    ],
)
def test_packages_per_os_source_and_flavour(os_name, source, modules, branch, packages):
    templar = driver_templar(os_name, nvidia_driver_source=source, nvidia_driver_kernel_modules=modules,
                             nvidia_driver_branch=branch)
    assert resolve(templar, "_nvidia_driver_packages") == packages


@pytest.mark.parametrize(
    ("os_name", "source", "branch", "modules"),
    [
        ("Debian-12", "distribution", "550", "open"),  # Debian 12 has 535 and 470 only
        ("Debian-12", "distribution", "470", "open"),  # no open modules for the Tesla 470 series
        ("Debian-13", "distribution", "470", "proprietary"),
        ("RedHat-9", "distribution", "", "open"),  # RHEL ships no NVIDIA driver
    ],
)
def test_unavailable_combinations_are_detectable(os_name, source, branch, modules):
    """Preflight refuses these: the catalog has no series, no flavour or no source for them."""
    templar = driver_templar(os_name, nvidia_driver_source=source, nvidia_driver_branch=branch,
                             nvidia_driver_kernel_modules=modules)
    catalog = resolve(templar, "_nvidia_driver_catalog")
    series = resolve(templar, "_nvidia_driver_series") if catalog else {}
    assert not catalog or not series or modules not in series


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
    templar = driver_templar(os_name, arch=arch, nvidia_driver_source="cuda_repo")
    assert resolve(templar, "_nvidia_driver_repo")["url"] == url
    assert resolve(templar, "_nvidia_driver_key_url") == url + key


def test_cuda_repository_urls_are_overridable():
    templar = driver_templar("Ubuntu-22", nvidia_driver_source="cuda_repo",
                             nvidia_driver_cuda_repo_base_url="http://mirror.example/cuda")
    assert resolve(templar, "_nvidia_driver_key_url") == "http://mirror.example/cuda/ubuntu2204/x86_64/3bf863cc.pub"


@pytest.mark.parametrize(
    ("os_name", "overrides", "expected"),
    [
        ("Ubuntu-24", {"nvidia_driver_source": "cuda_repo"},
         {"URIs": "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/x86_64/", "Suites": "/",
          "Signed-By": "/etc/apt/keyrings/nvidia-driver.asc"}),
        ("Debian-13", {"nvidia_driver_source": "distribution"},
         {"URIs": "http://deb.debian.org/debian", "Suites": "trixie trixie-updates",
          "Components": "contrib non-free non-free-firmware", "Signed-By": "/usr/share/keyrings/debian-archive-keyring.gpg"}),
        ("Ubuntu-22", {"nvidia_driver_source": "mirror", "nvidia_driver_mirror_url": "http://10.0.0.5/cuda/",
                       "nvidia_driver_mirror_key_url": "http://10.0.0.5/key.asc"},
         {"URIs": "http://10.0.0.5/cuda/", "Suites": "/", "Signed-By": "/etc/apt/keyrings/nvidia-driver.asc"}),
        ("Debian-12", {"nvidia_driver_source": "mirror", "nvidia_driver_mirror_url": "http://127.0.0.1:8080/",
                       "nvidia_driver_mirror_key_url": "http://127.0.0.1:8080/k.asc", "nvidia_driver_mirror_suite": "bookworm",
                       "nvidia_driver_mirror_packages": "distribution"},
         {"URIs": "http://127.0.0.1:8080/", "Suites": "bookworm", "Components": "main"}),
    ],
)
def test_apt_sources_render_as_deb822(os_name, overrides, expected):
    fields = parse_deb822(render(driver_templar(os_name, **overrides), "nvidia-driver.sources.j2"))
    assert fields["Types"] == "deb"
    for key, value in expected.items():
        assert fields[key] == value
    if "Components" not in expected:
        assert "Components" not in fields  # a flat repository has none


def test_ubuntu_distribution_needs_no_repository():
    assert resolve(driver_templar("Ubuntu-22", nvidia_driver_source="distribution"), "_nvidia_driver_repo") == {}


@pytest.mark.parametrize("os_name", ["RedHat-9", "Rocky-9"])
def test_dnf_repository_renders(os_name):
    text = render(driver_templar(os_name, nvidia_driver_source="cuda_repo"), "nvidia-driver.repo.j2")
    parser = configparser.ConfigParser()
    parser.read_string(text)
    repo = parser["nvidia-driver"]
    assert repo["baseurl"] == "https://developer.download.nvidia.com/compute/cuda/repos/rhel9/x86_64/"
    assert repo["gpgcheck"] == "1"
    assert repo["gpgkey"] == "file:///etc/pki/rpm-gpg/RPM-GPG-KEY-nvidia-driver"


def test_headers_package_names_the_running_kernel():
    assert resolve(driver_templar("Debian-12"), "_nvidia_driver_headers_package") == "linux-headers-6.1.0-28-amd64"
    assert resolve(driver_templar("Rocky-9"), "_nvidia_driver_headers_package") == "kernel-devel-6.1.0-28-amd64"


@pytest.mark.parametrize("role", sorted(p.name for p in ROLES.iterdir() if (p / "defaults" / "main.yml").exists()))
def test_argument_specs_mirror_defaults(role):
    """Every public input is documented and checked: the spec's options equal defaults/main.yml, with equal defaults."""
    defaults = yaml.safe_load((ROLES / role / "defaults" / "main.yml").read_text()) or {}
    entry_points = yaml.safe_load((ROLES / role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    spec = {name: option for entry in entry_points.values() for name, option in entry["options"].items()}
    assert sorted(spec) == sorted(defaults)
    for name, option in spec.items():
        assert name.startswith(f"{role}_"), name
        assert option.get("description"), f"{name} has no description"
        if isinstance(defaults[name], str) and "{{" in defaults[name]:
            # A templated default is resolved at run time; the spec must not carry a literal copy of it.
            assert "default" not in option, f"{name}: templated default must not be repeated in the spec"
            continue
        assert option.get("default") == defaults[name], f"{name}: spec default {option.get('default')!r} != {defaults[name]!r}"
