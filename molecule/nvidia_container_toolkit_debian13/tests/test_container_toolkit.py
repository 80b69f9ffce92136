"""Outcome of nvidia_container_toolkit on Debian 13 (containerd 1.7, Docker 26), on containerd 2.2 (config v3) and on
containerd 2.4 (config v4)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests" / "molecule"))

import container_toolkit_checks as checks  # noqa: E402
import pytest  # noqa: E402


def test_toolkit_installed_pinned_and_held(host):
    checks.assert_toolkit_installed(host)


# containerd release (as `containerd --version` prints it) -> (config version, nvidia made the default runtime).
CONTAINERD_HOSTS = {"1.7.": (2, False), "v2.2.": (3, True), "v2.4.": (4, False)}


def test_containerd_keeps_the_operators_config_and_runs_nvidia(host):
    release = host.check_output("containerd --version").split()[2]
    found = [expected for prefix, expected in CONTAINERD_HOSTS.items() if release.startswith(prefix)]
    assert len(found) == 1, f"containerd {release} is none of this scenario's: {sorted(CONTAINERD_HOSTS)}"
    # The lab's builds replace Debian's package on the 2.x hosts.
    assert host.file("/usr/local/bin/containerd").exists is release.startswith("v2.")
    version, as_default = found[0]
    checks.assert_containerd_keeps_user_and_adds_nvidia(host, version=version, as_default=as_default)


def test_docker_keeps_the_operators_keys(host):
    if not host.exists("dockerd"):
        pytest.skip("this host runs containerd 2.x alone")
    checks.assert_docker_keeps_user_and_adds_nvidia(host, as_default=False)
    # Docker 26 judged the merged file before it landed, and judges it again now.
    host.run_expect([0], "dockerd --validate --config-file /etc/docker/daemon.json")


def test_no_cdi_spec_without_gpus(host):
    checks.assert_no_cdi_without_gpus(host)
