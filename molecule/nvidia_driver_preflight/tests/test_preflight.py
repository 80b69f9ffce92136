"""Every bad input stops the nvidia_driver role before it changes anything, with a message naming the variable."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests" / "molecule"))

from playbook_run import flat_output, run_playbook  # noqa: E402

SCENARIO = Path(__file__).resolve().parents[1]
CONVERGE = SCENARIO.parent / "_shared" / "converge.yml"

CASES = [
    ("unknown source", {"nvidia_driver_source": "nvidia-website"},
     ["nvidia_driver_source", "nvidia-website", "cuda_repo, distribution, mirror"]),
    ("branch is not a number", {"nvidia_driver_branch": "latest"},
     ["nvidia_driver_branch=\"latest\"", "branch number"]),
    ("version is not a version", {"nvidia_driver_version": "newest"},
     ["nvidia_driver_version=\"newest\"", "upstream driver version"]),
    ("version contradicts branch", {"nvidia_driver_branch": "535", "nvidia_driver_version": "550.163.01"},
     ["nvidia_driver_version=\"550.163.01\" contradicts nvidia_driver_branch=\"535\""]),
    ("version outside the default branch", {"nvidia_driver_source": "distribution", "nvidia_driver_version": "550.163.01"},
     ["nvidia_driver_version=\"550.163.01\"", "not in branch 535"]),
    ("mirror without a key", {"nvidia_driver_source": "mirror", "nvidia_driver_mirror_url": "http://127.0.0.1:9/"},
     ["nvidia_driver_mirror_key_url (now \"\")"]),
    ("malformed mirror URL",
     {"nvidia_driver_source": "mirror", "nvidia_driver_mirror_url": "127.0.0.1:8080/nvidia",
      "nvidia_driver_mirror_key_url": "http://127.0.0.1:8080/key.asc"},
     ["nvidia_driver_mirror_url=\"127.0.0.1:8080/nvidia\" is not a URL", "http://host/path"]),
    # "false" passes the argument spec as a bool but stays a string, which would read as true: refused too.
    ("boolean false given as a string", {"nvidia_driver_persistenced": "false"},
     ["nvidia_driver_persistenced=\"false\" is not a boolean (str)"]),
    ("CUDA of the play newer than the default branch runs",
     {"nvidia_driver_source": "distribution", "cuda_toolkit_versions": ["13.0"]},
     ["cuda_toolkit_versions names CUDA 13.0, which needs driver 580 or newer",
      "nvidia_driver_branch (default of Debian-12 and distribution)=535"]),
    ("branch Debian 12 does not ship", {"nvidia_driver_source": "distribution", "nvidia_driver_branch": "550"},
     ["nvidia_driver_branch=\"550\"", "Debian-12", "allowed: 535, 470"]),
    ("open modules for a branch without them",
     {"nvidia_driver_source": "distribution", "nvidia_driver_branch": "470", "nvidia_driver_kernel_modules": "open"},
     ["nvidia_driver_kernel_modules=open", "branch 470", "allowed: proprietary"]),
    ("boolean given as a string", {"nvidia_driver_hold_packages": "maybe"},
     ["nvidia_driver_hold_packages", "maybe", "bool"]),
    ("unknown reboot policy", {"nvidia_driver_reboot": "always"},
     ["nvidia_driver_reboot", "always", "if_needed, never"]),
    ("unknown repository owner", {"nvidia_driver_repository": "mine"},
     ["nvidia_driver_repository", "mine", "auto, own, external"]),
    # Inside a container the host's kernel has no Debian headers: requiring them must stop with the package named.
    ("headers for the running kernel missing", {"nvidia_driver_source": "distribution", "nvidia_driver_kernel_headers": "required"},
     ["The running kernel is", "headers package linux-headers-", "is not installable"]),
    # This image is a supported OS; narrowing the internal list is how the unsupported-OS path is reached here.
    ("unsupported operating system", {"_nvidia_driver_supported_os": ["Ubuntu-24"]},
     ["nvidia_driver supports Ubuntu-24", "this host runs Debian 12"]),
]


def run_role(extra_vars: dict) -> subprocess.CompletedProcess:
    return run_playbook(CONVERGE, extra_vars)


@pytest.mark.parametrize(("extra_vars", "expected"), [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_bad_input_fails_in_preflight(extra_vars, expected):
    result = run_role(extra_vars)
    # The callback folds long messages over lines: compare with whitespace collapsed.
    output = flat_output(result)
    assert result.returncode != 0, f"the role accepted {extra_vars}"
    for fragment in expected:
        assert fragment in output, f"{fragment!r} not in the failure output:\n{output[-3000:]}"
    # Nothing may have been changed before the failure.
    assert "changed: [" not in result.stdout, result.stdout[-3000:]


def test_runfile_driver_is_refused(host):
    host.run_expect([0], "install -m 0755 /dev/null /usr/bin/nvidia-uninstall")
    try:
        result = run_role({"nvidia_driver_source": "distribution"})
    finally:
        host.run_expect([0], "rm -f /usr/bin/nvidia-uninstall")
    output = flat_output(result)
    assert result.returncode != 0
    assert "installed from the NVIDIA .run installer" in output and "nvidia-uninstall" in output, output[-3000:]


def test_host_is_unchanged_after_all_refusals(host):
    for path in ("/etc/apt/sources.list.d/nvidia-driver.sources", "/etc/apt/keyrings/nvidia-driver.asc",
                 "/etc/modprobe.d/nvidia-driver-blacklist-nouveau.conf", "/etc/ansible/facts.d/nvidia_driver.fact"):
        assert not host.file(path).exists, f"{path} was written by a refused run"
    installed = host.run("dpkg-query -W -f '${Package} ${Status}\\n' 'nvidia-*' 'libnvidia-*'")
    assert "install ok installed" not in installed.stdout, installed.stdout
