"""Debian 12's real nvidia-cuda-toolkit 11.8 from contrib/non-free: installed, held, nvcc 11.8, environment set."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests" / "molecule"))

import cuda_checks  # noqa: E402


def test_package_installed_and_held(host):
    cuda_checks.assert_installed_and_held(host, ["nvidia-cuda-toolkit"])
    assert host.package("nvidia-cuda-toolkit").version.startswith("11.8."), host.package("nvidia-cuda-toolkit").version


def test_real_nvcc_reports_11_8(host):
    assert cuda_checks.nvcc_release(host.check_output("/usr/bin/nvcc --version")) == "11.8"
    # A login shell finds the same nvcc (Debian's is on the default PATH) and CUDA_HOME from the role's profile file.
    assert login_shell_nvcc(host) == "11.8"
    cuda_home = cuda_checks.login_shell(host, "echo $CUDA_HOME")
    assert cuda_home == "/usr/lib/nvidia-cuda-toolkit"
    assert host.file(cuda_home).is_directory


def login_shell_nvcc(host) -> str:
    assert cuda_checks.login_shell(host, "command -v nvcc") == "/usr/bin/nvcc"
    return cuda_checks.nvcc_release(cuda_checks.login_shell(host, "nvcc --version"))


def test_environment_files(host):
    profile = host.file(cuda_checks.PROFILE_FILE)
    assert profile.exists and profile.mode == 0o644 and profile.user == "root"
    assert host.run(f"sh -n {cuda_checks.PROFILE_FILE}").rc == 0
    # Debian's libraries are on the linker's default path: no library path file for this layout.
    assert not host.file(cuda_checks.LD_CONF_FILE).exists
    assert "libcudart.so.11" in host.check_output("ldconfig -p")


def test_distribution_repository(host):
    cuda_checks.assert_sources(host, {
        "URIs": "http://deb.debian.org/debian",
        "Suites": "bookworm bookworm-updates",
        "Components": "contrib non-free",
        "Signed-By": "/usr/share/keyrings/debian-archive-keyring.gpg",
    })
    # No NVIDIA key and no cuda alternative with this source.
    assert not host.file("/etc/apt/keyrings/cuda-toolkit.asc").exists
    assert not host.file("/usr/local/cuda").exists


def test_selection_recorded(host):
    cuda_checks.assert_state(host, source="distribution", layout="distribution", versions=["11.8"],
                             default_version="11.8", nvcc="/usr/bin/nvcc", packages=["nvidia-cuda-toolkit"], held=True)
