"""After the converge (580 -> 590) and the side effect (590 -> 595): branch 595 in NVIDIA's naming from 590
(unversioned nvidia-open, held to the branch by nvidia-driver-pinning-595), from the lab mirror's copy of the CUDA
repository layout, and nothing of branches 580 or 590 left or held. The repository also serves 610: the pinning
package is what keeps apt on 595. CUDA came from the same repository first, so the driver used the cuda_toolkit role's
entry throughout. (The converge's own result, 590, is checked by check mode and idempotence.)"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests" / "molecule"))

import driver_checks  # noqa: E402

BRANCH = "595"
VERSION = "595.71.05"
NEWER = "610.43.02"
PINNING = f"nvidia-driver-pinning-{BRANCH}"
PACKAGES = [PINNING, "nvidia-open", "nvidia-persistenced"]
EARLIER = ["nvidia-open-580", "nvidia-driver-pinning-590"]
LIBDIR = "/usr/lib/x86_64-linux-gnu"
REPOSITORY = "http://127.0.0.1:8080/cuda/repos/debian12/x86_64/"
CUDA_SOURCES = "/etc/apt/sources.list.d/cuda-toolkit.sources"
CUDA_KEY = "/etc/apt/keyrings/cuda-toolkit.asc"


def test_branch_595_installed_and_held_and_earlier_branches_gone(host):
    driver_checks.assert_driver_installed(host, PACKAGES, absent=EARLIER)
    # Same name as 590's package: the role moved its version (and its hold) with the branch.
    assert host.package("nvidia-open").version == f"{VERSION}-1"


def test_the_pinning_package_keeps_apt_on_the_branch(host):
    assert not host.file("/etc/apt/preferences.d/nvidia-driver-pinning-590").exists
    assert PINNING in host.check_output(f"dpkg -S /etc/apt/preferences.d/{PINNING}")
    policy = host.check_output("apt-cache policy nvidia-open")
    # 610 is offered, 595 is the candidate: the pinning package's preferences, not the repository, chose the branch.
    assert f"{NEWER}-1" in policy, policy
    assert f"Candidate: {VERSION}-1" in policy, policy
    # Nor would an upgrade move the driver (held, and pinned below the newer branch).
    upgrade = host.check_output("apt-get -s dist-upgrade")
    assert "Inst nvidia-open " not in upgrade, upgrade


def test_only_the_library_of_the_branch_is_left(host):
    assert host.file(f"{LIBDIR}/libnvidia-ml.so.{VERSION}").exists
    for old in ("580.105.08", "590.48.01"):
        assert not host.file(f"{LIBDIR}/libnvidia-ml.so.{old}").exists, old


def entries_listing(host, url: str) -> list[str]:
    """The apt sources files with a line, not commented out, that lists the URL (trailing slashes aside)."""
    paths = ["/etc/apt/sources.list"] + [f"/etc/apt/sources.list.d/{name}"
                                         for name in host.file("/etc/apt/sources.list.d").listdir()
                                         if name.endswith((".list", ".sources"))]
    bare = url.rstrip("/")
    return [path for path in paths if host.file(path).exists
            and any(bare in line.split("#", 1)[0] for line in host.file(path).content_string.splitlines())]


def test_the_driver_uses_the_cuda_toolkits_entry_of_the_repository(host):
    """CUDA came from the repository first (prepare): every driver run (580, 590, 595) used the cuda_toolkit role's
    entry and keyring and added none of its own, so one entry lists the URL and apt accepts every source."""
    assert entries_listing(host, REPOSITORY) == [CUDA_SOURCES]
    assert not host.file(driver_checks.SOURCES_FILE).exists
    assert not host.file("/etc/apt/keyrings/nvidia-driver.asc").exists
    fields = driver_checks.parse_deb822(host.file(CUDA_SOURCES).content_string)
    assert (fields["URIs"], fields["Suites"], fields["Signed-By"]) == (REPOSITORY, "/", CUDA_KEY)
    assert "managed by the cuda_toolkit role" in host.file(CUDA_SOURCES).content_string
    assert host.file(CUDA_KEY).exists
    update = host.run("apt-get update")
    assert update.rc == 0, update.stdout + update.stderr
    assert "Conflicting values" not in update.stderr and "NO_PUBKEY" not in update.stderr, update.stderr
    assert "E:" not in update.stdout + update.stderr, update.stdout + update.stderr
    # The toolkit installed from the entry stays.
    assert host.package("cuda-toolkit-12-8").is_installed


def test_selection_recorded(host):
    driver_checks.assert_state_file(host, "mirror", BRANCH, "open", PACKAGES)
    assert '"version": "595.71.05"' in host.file(driver_checks.STATE_FILE).content_string


def test_blacklist_and_persistence_daemon(host):
    driver_checks.assert_blacklist_and_persistenced(host)


def test_facts_exported():
    driver_checks.assert_facts_exported("nvd-cuda-mirror", BRANCH, "open")
