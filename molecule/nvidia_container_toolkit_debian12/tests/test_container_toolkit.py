"""Outcome of nvidia_container_toolkit on Debian 12: containerd 1.6 and Docker 20.10 configured by hand first."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests" / "molecule"))

import container_toolkit_checks as checks  # noqa: E402


def test_toolkit_installed_pinned_and_held(host):
    checks.assert_toolkit_installed(host)


def test_containerd_keeps_the_operators_config_and_runs_nvidia(host):
    assert host.check_output("containerd --version").split()[2].startswith("1.6.")
    checks.assert_containerd_keeps_user_and_adds_nvidia(host, version=2, as_default=False)


def test_docker_keeps_the_operators_keys_and_defaults_to_nvidia(host):
    checks.assert_docker_keeps_user_and_adds_nvidia(host, as_default=True)


def test_no_cdi_spec_without_gpus(host):
    checks.assert_no_cdi_without_gpus(host)
