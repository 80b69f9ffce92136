"""After the converge: branch 590 in NVIDIA's naming from 590 (unversioned nvidia-open, held to the branch by
nvidia-driver-pinning-590), from the lab mirror's copy of the CUDA repository layout, and nothing of branch 580 left
or held. The repository also serves 595: the pinning package is what keeps apt on 590."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests" / "molecule"))

import driver_checks  # noqa: E402

PINNING = "nvidia-driver-pinning-590"
PACKAGES = [PINNING, "nvidia-open", "nvidia-persistenced"]
BRANCH_580 = ["nvidia-open-580"]
VERSION = "590.48.01"
NEWER = "595.71.05"
LIBDIR = "/usr/lib/x86_64-linux-gnu"


def test_new_scheme_installed_and_held_and_old_branch_gone(host):
    driver_checks.assert_driver_installed(host, PACKAGES, absent=BRANCH_580)
    assert host.package("nvidia-open").version == f"{VERSION}-1"


def test_the_pinning_package_keeps_apt_on_the_branch(host):
    preferences = host.file(f"/etc/apt/preferences.d/{PINNING}")
    assert preferences.exists
    assert PINNING in host.check_output(f"dpkg -S /etc/apt/preferences.d/{PINNING}")
    policy = host.check_output("apt-cache policy nvidia-open")
    # 595 is offered, 590 is the candidate: the pinning package's preferences, not the repository, chose the branch.
    assert f"{NEWER}-1" in policy, policy
    assert f"Candidate: {VERSION}-1" in policy, policy
    # Nor would an upgrade move the driver (held, and pinned below the newer branch).
    upgrade = host.check_output("apt-get -s dist-upgrade")
    assert "Inst nvidia-open " not in upgrade, upgrade


def test_the_library_of_the_branch_replaced_the_old_one(host):
    assert host.file(f"{LIBDIR}/libnvidia-ml.so.{VERSION}").exists
    assert not host.file(f"{LIBDIR}/libnvidia-ml.so.580.105.08").exists


def test_flat_mirror_repository_signed_by_its_key(host):
    driver_checks.assert_sources(host, {
        "URIs": "http://127.0.0.1:8080/cuda/repos/debian12/x86_64/",
        "Suites": "/",
        "Signed-By": "/etc/apt/keyrings/nvidia-driver.asc",
    })


def test_selection_recorded(host):
    driver_checks.assert_state_file(host, "mirror", "590", "open", PACKAGES)


def test_blacklist_and_persistence_daemon(host):
    driver_checks.assert_blacklist_and_persistenced(host)


def test_facts_exported():
    driver_checks.assert_facts_exported("nvd-cuda-mirror", "590", "open")
