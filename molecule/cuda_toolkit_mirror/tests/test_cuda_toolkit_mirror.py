"""CUDA toolkit from the signed lab mirror in NVIDIA's repository layout (Debian 13, lab doubles of cuda-toolkit-X-Y).

Converged: 12.8 and 13.0 side by side, 13.0 the default (checked on the snapshot side_effect.yml took before changing
anything). After the side effect: 12.8 the default, 13.0 removed explicitly, and a second run changes nothing.
"""

import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests" / "molecule"))

import cuda_checks  # noqa: E402

HOST = "cuda-mirror"
AFTER_SIDE_EFFECT = {"cuda_toolkit_versions": ["12.8"], "cuda_toolkit_default_version": "12.8",
                     "cuda_toolkit_remove_versions": ["13.0"]}


@pytest.fixture(scope="module")
def converged() -> dict:
    path = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / f"converged-{HOST}.json"
    return json.loads(path.read_text(encoding="utf-8"))


def test_converge_installed_both_versions_side_by_side(converged):
    assert converged["directories"].split() == ["/usr/local/cuda-12.8", "/usr/local/cuda-13.0"]


def test_converge_selected_13_0_through_the_alternative(converged):
    assert converged["link"] == "/usr/local/cuda-13.0"
    query = converged["alternative"]
    # Selected in manual mode: a higher version installed later cannot take /usr/local/cuda over.
    assert "Status: manual" in query and "Value: /usr/local/cuda-13.0" in query, query
    assert "Alternative: /usr/local/cuda-12.8" in query and "Alternative: /usr/local/cuda-13.0" in query, query


def test_converge_login_shell_finds_nvcc_13_0(converged):
    path, _, version = converged["login_nvcc"].partition("\n")
    assert path == "/usr/local/cuda/bin/nvcc"
    assert cuda_checks.nvcc_release(version) == "13.0"


def test_converge_library_path(converged):
    assert "/usr/local/cuda/lib64" in converged["ld_conf"].splitlines()
    assert any(line.startswith("/usr/local/cuda/lib64:") for line in converged["ld_dirs"].splitlines()), converged["ld_dirs"]


def test_default_is_12_8_and_13_0_is_gone(host):
    assert host.file("/usr/local/cuda-12.8/bin/nvcc").is_file
    assert not host.file("/usr/local/cuda-13.0").exists
    assert not host.package("cuda-toolkit-13-0").is_installed
    assert host.check_output("readlink -f /usr/local/cuda") == "/usr/local/cuda-12.8"
    query = host.check_output("update-alternatives --query cuda")
    assert "Status: manual" in query and "Value: /usr/local/cuda-12.8" in query, query
    assert "/usr/local/cuda-13.0" not in query, query


def test_login_shell_finds_nvcc_12_8(host):
    assert cuda_checks.login_shell(host, "command -v nvcc") == "/usr/local/cuda/bin/nvcc"
    assert cuda_checks.nvcc_release(cuda_checks.login_shell(host, "nvcc --version")) == "12.8"
    assert cuda_checks.login_shell(host, "echo $CUDA_HOME") == "/usr/local/cuda"


def test_library_path_follows_the_default(host):
    conf = host.file(cuda_checks.LD_CONF_FILE)
    assert conf.exists and conf.mode == 0o644
    # The directory ldconfig reads (the lab doubles ship no libraries, so the cache itself has nothing of CUDA).
    dirs = host.check_output("ldconfig -N -v 2>/dev/null | grep -v '^[[:space:]]'").splitlines()
    assert any(line.startswith("/usr/local/cuda/lib64:") for line in dirs), dirs
    assert host.check_output("readlink -f /usr/local/cuda/lib64") == "/usr/local/cuda-12.8/lib64"


def test_packages_held_and_removed_version_released(host):
    cuda_checks.assert_installed_and_held(host, ["cuda-toolkit-12-8"])
    assert "cuda-toolkit-13-0" not in host.check_output("dpkg --get-selections")


def test_mirror_repository_signed_by_its_key(host):
    cuda_checks.assert_sources(host, {
        "URIs": "http://127.0.0.1:8080/cuda/repos/debian13/x86_64/",
        "Suites": "/",
        "Signed-By": "/etc/apt/keyrings/cuda-toolkit.asc",
    })
    policy = host.check_output("apt-cache policy cuda-toolkit-12-8")
    assert "http://127.0.0.1:8080/cuda/repos/debian13/x86_64  Packages" in policy, policy


def test_selection_recorded(host):
    cuda_checks.assert_state(host, source="mirror", layout="versioned", versions=["12.8"], default_version="12.8",
                             home="/usr/local/cuda", packages=["cuda-toolkit-12-8"], held=True)


def test_second_run_after_the_change_changes_nothing():
    result = cuda_checks.run_role(AFTER_SIDE_EFFECT)
    assert result.returncode == 0, cuda_checks.flat_output(result)[-3000:]
    assert "changed: [" not in result.stdout, result.stdout[-3000:]
    assert "/usr/local/cuda/bin/nvcc reports CUDA release 12.8" in result.stdout


def test_entry_of_another_owner_for_the_same_repository_is_used(host):
    """nvidia_driver with the same mirror writes its own entry with its own key: apt refuses one repository signed by
    two keyrings, so with cuda_toolkit_repository=auto the role gives up its entry and key and uses the other one."""
    other = "/etc/apt/sources.list.d/other-owner.sources"
    host.run_expect([0], "install -m 0644 /etc/apt/keyrings/cuda-toolkit.asc /etc/apt/keyrings/other-owner.asc")
    host.run_expect([0], f"printf 'Types: deb\\nURIs: http://127.0.0.1:8080/cuda/repos/debian13/x86_64/\\nSuites: /\\n"
                         f"Signed-By: /etc/apt/keyrings/other-owner.asc\\n' > {other}")
    try:
        result = cuda_checks.run_role(AFTER_SIDE_EFFECT)
        output = cuda_checks.flat_output(result)
        assert result.returncode == 0, output[-3000:]
        assert f"is configured in {other}; cuda_toolkit uses that entry and adds none of its own" in output, output[-3000:]
        assert not host.file(cuda_checks.SOURCES_FILE).exists
        assert not host.file("/etc/apt/keyrings/cuda-toolkit.asc").exists
        update = host.run("apt-get update")
        assert update.rc == 0 and "Conflicting values" not in update.stderr, update.stderr
        assert "http://127.0.0.1:8080/cuda/repos/debian13/x86_64" in host.check_output("apt-cache policy cuda-toolkit-12-8")
    finally:
        host.run_expect([0], f"rm -f {other} /etc/apt/keyrings/other-owner.asc")
    # Without the other entry the role's own comes back.
    result = cuda_checks.run_role(AFTER_SIDE_EFFECT)
    assert result.returncode == 0, cuda_checks.flat_output(result)[-3000:]
    assert host.file(cuda_checks.SOURCES_FILE).exists and host.file("/etc/apt/keyrings/cuda-toolkit.asc").exists
