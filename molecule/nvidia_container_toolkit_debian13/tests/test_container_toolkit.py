"""Outcome of nvidia_container_toolkit on Debian 13 (containerd 1.7, Docker 26) and on containerd 2.x (config v3)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests" / "molecule"))

import container_toolkit_checks as checks  # noqa: E402
import pytest  # noqa: E402


def test_toolkit_installed_pinned_and_held(host):
    checks.assert_toolkit_installed(host)


def test_containerd_keeps_the_operators_config_and_runs_nvidia(host):
    major = host.check_output("containerd --version").split()[2].lstrip("v").split(".")[0]
    if host.file("/usr/local/bin/containerd").exists:
        # containerd 2.x, config version 3: nvidia becomes the default runtime there.
        assert major == "2"
        checks.assert_containerd_keeps_user_and_adds_nvidia(host, version=3, as_default=True)
    else:
        assert host.check_output("containerd --version").split()[2].startswith("1.7.")
        checks.assert_containerd_keeps_user_and_adds_nvidia(host, version=2, as_default=False)


def test_docker_keeps_the_operators_keys(host):
    if not host.exists("dockerd"):
        pytest.skip("this host runs containerd 2.x alone")
    checks.assert_docker_keeps_user_and_adds_nvidia(host, as_default=False)
    # Docker 26 judged the merged file before it landed, and judges it again now.
    host.run_expect([0], "dockerd --validate --config-file /etc/docker/daemon.json")


def test_no_cdi_spec_without_gpus(host):
    checks.assert_no_cdi_without_gpus(host)
