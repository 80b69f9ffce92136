"""Outcome of the nvidia_driver role on Debian 12 with Debian's packages (branch 535, open modules)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests" / "molecule"))

import driver_checks  # noqa: E402

PACKAGES = ["nvidia-driver", "nvidia-open-kernel-dkms", "nvidia-smi", "libnvidia-cfg1", "nvidia-persistenced"]


def test_driver_packages_installed_and_held(host):
    driver_checks.assert_driver_installed(host, PACKAGES, absent=["nvidia-kernel-dkms"])
    assert host.package("nvidia-driver").version.startswith("535.")


def test_distribution_repository_signed_by_debian_keyring(host):
    driver_checks.assert_sources(host, {
        "URIs": "http://deb.debian.org/debian",
        "Suites": "bookworm bookworm-updates",
        "Components": "contrib non-free non-free-firmware",
        "Signed-By": "/usr/share/keyrings/debian-archive-keyring.gpg",
    })


def test_blacklist_and_persistence_daemon(host):
    driver_checks.assert_blacklist_and_persistenced(host)


def test_selection_recorded(host):
    driver_checks.assert_state_file(host, "distribution", "535", "open", PACKAGES)


def test_facts_exported():
    driver_checks.assert_facts_exported("nvd-debian12", "535", "open")
