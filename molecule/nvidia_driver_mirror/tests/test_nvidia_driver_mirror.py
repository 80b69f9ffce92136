"""After the side effect: branch 535 (open) from the signed mirror, and nothing of branch 470 left or held."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests" / "molecule"))

import driver_checks  # noqa: E402

PACKAGES = ["nvidia-driver", "nvidia-open-kernel-dkms", "nvidia-smi", "libnvidia-cfg1", "nvidia-persistenced"]
BRANCH_470 = ["nvidia-tesla-470-driver", "nvidia-tesla-470-kernel-dkms", "nvidia-tesla-470-smi", "libnvidia-tesla-470-cfg1"]


def test_branch_changed_and_holds_moved(host):
    driver_checks.assert_driver_installed(host, PACKAGES, absent=BRANCH_470)
    assert host.package("nvidia-driver").version.startswith("535.")


def test_no_package_of_the_old_branch_remains(host):
    leftovers = host.run("dpkg-query -W -f '${Package} ${Status}\\n' '*tesla-470*'").stdout
    assert "install ok installed" not in leftovers, leftovers


def test_mirror_repository_signed_by_its_key(host):
    driver_checks.assert_sources(host, {
        "URIs": "http://127.0.0.1:8080/",
        "Suites": "bookworm",
        "Components": "main",
        "Signed-By": "/etc/apt/keyrings/nvidia-driver.asc",
    })
    # The driver came from the mirror: Debian's own sources in this image carry main only.
    policy = host.check_output("apt-cache policy nvidia-driver")
    assert "http://127.0.0.1:8080 bookworm/main" in policy, policy


def test_selection_recorded(host):
    driver_checks.assert_state_file(host, "mirror", "535", "open", PACKAGES)


def test_blacklist_and_persistence_daemon(host):
    driver_checks.assert_blacklist_and_persistenced(host)


def test_facts_exported():
    driver_checks.assert_facts_exported("nvd-mirror", "535", "open")
