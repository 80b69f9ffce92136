"""Every bad input stops the cuda_toolkit role in preflight, naming the variable, its value and what is allowed, and
changes nothing; a wrong nvcc fails the verification with both versions named; a disabled role changes nothing.

Each case is a real ansible-playbook run with extra vars against this scenario's converged host (Debian 12,
distribution source, 11.8).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests" / "molecule"))

import cuda_checks  # noqa: E402

MIRROR = {"cuda_toolkit_source": "mirror", "cuda_toolkit_versions": ["12.8"]}

CASES = [
    ("version the source does not offer", {"cuda_toolkit_versions": ["12.8"]},
     ['cuda_toolkit_versions=["12.8"]', "12.8 is not offered by the distribution packages on Debian-12", "allowed: 11.8"]),
    ("two versions from the distribution", {"cuda_toolkit_versions": ["11.8", "12.4"]},
     ['cuda_toolkit_versions=["11.8", "12.4"] asks for 2 versions', "install one version only", "allowed: one of 11.8"]),
    ("default not in the list", {"cuda_toolkit_default_version": "12.0"},
     ['cuda_toolkit_default_version="12.0" is not one of cuda_toolkit_versions=["11.8"]']),
    ("removing a version that is installed", {"cuda_toolkit_remove_versions": ["11.8"]},
     ['cuda_toolkit_remove_versions=["11.8"] and cuda_toolkit_versions=["11.8"] both name 11.8']),
    ("version not X.Y", {"cuda_toolkit_versions": ["11"]},
     ['cuda_toolkit_versions=["11"]', 'quoted "X.Y" versions']),
    ("unquoted version", {"cuda_toolkit_versions": [12.1]},
     ["cuda_toolkit_versions=[12.1]", 'quoted "X.Y" versions']),
    ("malformed mirror URL",
     {**MIRROR, "cuda_toolkit_mirror_url": "127.0.0.1:8080/cuda/repos/debian12/x86_64/",
      "cuda_toolkit_mirror_key_url": "http://127.0.0.1:8080/gpu-lab-mirror.asc"},
     ['cuda_toolkit_mirror_url="127.0.0.1:8080/cuda/repos/debian12/x86_64/" is not a URL', "http://host/path"]),
    ("malformed CUDA repository base URL", {"cuda_toolkit_source": "cuda_repo", "cuda_toolkit_versions": ["12.8"],
                                            "cuda_toolkit_cuda_repo_base_url": "ftp://mirror.example/cuda"},
     ['cuda_toolkit_cuda_repo_base_url="ftp://mirror.example/cuda" is not a URL']),
    ("mirror without a key", {**MIRROR, "cuda_toolkit_mirror_url": "http://127.0.0.1:8080/cuda/repos/debian12/x86_64/"},
     ['cuda_toolkit_mirror_key_url (now "")']),
    ("boolean given as a string", {"cuda_toolkit_hold_packages": "yes"},
     ['cuda_toolkit_hold_packages="yes" is not a boolean']),
    ("switch given as a string", {"cuda_toolkit_enabled": "false"},
     ['cuda_toolkit_enabled="false" is not a boolean']),
    ("boolean that is no boolean at all", {"cuda_toolkit_hold_packages": "maybe"},
     ["cuda_toolkit_hold_packages", "maybe", "bool"]),
    ("CUDA newer than the driver branch runs", {"cuda_toolkit_driver_branch": "418"},
     ["cuda_toolkit_versions names CUDA 11.8, which needs driver 450.80.02 or newer", "cuda_toolkit_driver_branch=418"]),
    ("CUDA newer than the inventory's driver branch runs", {"nvidia_driver_branch": "440"},
     ["cuda_toolkit_versions names CUDA 11.8", "nvidia_driver_branch=440"]),
    ("driver branch that is no branch", {"cuda_toolkit_driver_branch": "latest"},
     ['cuda_toolkit_driver_branch="latest" is not a driver branch or version']),
    ("unknown source", {"cuda_toolkit_source": "nvidia-website"},
     ["cuda_toolkit_source", "nvidia-website", "cuda_repo, distribution, mirror"]),
    ("unknown repository owner", {"cuda_toolkit_repository": "mine"},
     ["cuda_toolkit_repository", "mine", "auto, own, external"]),
    # This image is a supported OS; narrowing the internal list is how the unsupported-OS path is reached here.
    ("unsupported operating system", {"_cuda_toolkit_supported_os": ["Ubuntu-24"]},
     ["cuda_toolkit supports Ubuntu-24", "this host runs Debian 12"]),
]


@pytest.mark.parametrize(("extra_vars", "expected"), [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_bad_input_fails_in_preflight(extra_vars, expected):
    result = cuda_checks.run_role(extra_vars)
    output = cuda_checks.flat_output(result)
    assert result.returncode != 0, f"the role accepted {extra_vars}"
    for fragment in expected:
        assert fragment in output, f"{fragment!r} not in the failure output:\n{output[-3000:]}"
    assert "changed: [" not in result.stdout, result.stdout[-3000:]
    # It stopped in preflight: no repository, package or file task ran.
    assert "Configure the CUDA toolkit repository" not in result.stdout, result.stdout[-3000:]


def test_nvcc_of_another_version_fails_with_both_versions_named(host):
    """A foreign nvcc where the default's should be: the verification names what it found and what was asked for."""
    host.run_expect([0], "mv /usr/bin/nvcc /usr/bin/nvcc.moved-by-test")
    try:
        host.run_expect([0], "printf '#!/bin/sh\\necho \"Cuda compilation tools, release 11.5, V11.5.119\"\\n' > /usr/bin/nvcc"
                             " && chmod 0755 /usr/bin/nvcc")
        result = cuda_checks.run_role({})
    finally:
        host.run_expect([0], "mv -f /usr/bin/nvcc.moved-by-test /usr/bin/nvcc")
    output = cuda_checks.flat_output(result)
    assert result.returncode != 0
    assert "/usr/bin/nvcc reports CUDA release 11.5, but the requested default version is 11.8" in output, output[-3000:]
    assert "changed: [" not in result.stdout, result.stdout[-3000:]


def test_disabled_role_changes_nothing_and_says_so():
    # Even input that preflight would refuse: a disabled role reads none of it.
    result = cuda_checks.run_role({"cuda_toolkit_enabled": False, "cuda_toolkit_versions": ["99.9"]})
    output = cuda_checks.flat_output(result)
    assert result.returncode == 0, output[-3000:]
    assert "cuda_toolkit_enabled=false: the cuda_toolkit role changes nothing on this host" in output
    assert "changed: [" not in result.stdout and "99.9 is not offered" not in output, result.stdout[-3000:]


def test_host_is_unchanged_after_all_refusals(host):
    assert cuda_checks.nvcc_release(host.check_output("/usr/bin/nvcc --version")) == "11.8"
    assert not host.file("/etc/apt/keyrings/cuda-toolkit.asc").exists
    cuda_checks.assert_state(host, source="distribution", versions=["11.8"], default_version="11.8", held=True)
