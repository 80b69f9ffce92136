"""Every bad input stops nvidia_container_toolkit in preflight, names the variable and its value, and changes nothing.

Each case is a real ansible-playbook run with extra vars against the converged host; the files the role and the
operator own must be byte for byte as they were.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests" / "molecule"))

from playbook_run import flat_output, run_playbook  # noqa: E402

CONVERGE = Path(__file__).resolve().parents[2] / "_shared" / "container_toolkit" / "converge.yml"
WATCHED = [
    "/etc/containerd/config.toml", "/etc/containerd/conf.d/99-nvidia.toml", "/etc/docker/daemon.json",
    "/etc/apt/sources.list.d/nvidia-container-toolkit.sources", "/etc/ansible/facts.d/nvidia_container_toolkit.fact",
]

CASES = [
    ("unknown runtime", {"nvidia_container_toolkit_runtimes": ["containerd", "podman"]},
     ["nvidia_container_toolkit_runtimes=[\"containerd\", \"podman\"]", "allowed: containerd, docker, crio"]),
    ("default for a runtime not installed",
     {"nvidia_container_toolkit_runtimes": ["containerd", "crio"], "nvidia_container_toolkit_default_for": ["crio"]},
     ["includes crio", "as the default runtime", "CRI-O is not installed", "no crio in PATH"]),
    ("default for a runtime not configured", {"nvidia_container_toolkit_default_for": ["containerd", "crio"]},
     ["nvidia_container_toolkit_default_for=[\"containerd\", \"crio\"] names crio",
      "not in nvidia_container_toolkit_runtimes"]),
    ("malformed mirror URL", {"nvidia_container_toolkit_mirror_url": "127.0.0.1:8080/libnvidia-container"},
     ['nvidia_container_toolkit_mirror_url="127.0.0.1:8080/libnvidia-container" is not a URL', "http://host/path"]),
    ("mirror without a key", {"nvidia_container_toolkit_mirror_key_url": ""},
     ['nvidia_container_toolkit_mirror_key_url="" is not a URL']),
    ("version is not a version", {"nvidia_container_toolkit_version": "latest"},
     ["nvidia_container_toolkit_version=\"latest\"", "such as \"1.20.2\""]),
    ("runtime name is not a DNS label", {"nvidia_container_toolkit_runtime_name": "NVIDIA_GPU"},
     ["nvidia_container_toolkit_runtime_name=\"NVIDIA_GPU\"", "DNS label"]),
    ("unknown source", {"nvidia_container_toolkit_source": "github"},
     ["nvidia_container_toolkit_source", "github", "nvidia_repo, mirror"]),
    ("boolean given as a string", {"nvidia_container_toolkit_hold_packages": "maybe"},
     ["nvidia_container_toolkit_hold_packages", "maybe", "bool"]),
    # "false" passes the argument spec as a bool but stays a string, which would read as true: refused too.
    ("boolean false given as a string", {"nvidia_container_toolkit_restart_runtimes": "false"},
     ["nvidia_container_toolkit_restart_runtimes=\"false\" is not a boolean (str)"]),
]


def run_role(extra_vars: dict) -> subprocess.CompletedProcess:
    return run_playbook(CONVERGE, extra_vars)


def snapshot(host) -> dict[str, str]:
    return {path: host.check_output(f"sha256sum {path} 2>/dev/null || echo absent") for path in WATCHED}


@pytest.mark.parametrize(("extra_vars", "expected"), [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_bad_input_fails_in_preflight(host, extra_vars, expected):
    before = snapshot(host)
    result = run_role(extra_vars)
    output = flat_output(result)
    assert result.returncode != 0, f"the role accepted {extra_vars}"
    for fragment in expected:
        assert fragment in output, f"{fragment!r} not in the failure output:\n{output[-3000:]}"
    assert "changed: [" not in result.stdout, result.stdout[-3000:]
    assert snapshot(host) == before


def test_unreadable_containerd_config_is_refused_and_kept(host):
    """A config.toml the role cannot keep (version 1, which containerd reads when `version` is missing) stops it."""
    host.run_expect([0], "cp -p /etc/containerd/config.toml /root/config.toml.keep && "
                         "sed -i '/^version = 2$/d' /etc/containerd/config.toml")
    try:
        before = snapshot(host)
        result = run_role({})
        after = snapshot(host)
    finally:
        host.run_expect([0], "mv /root/config.toml.keep /etc/containerd/config.toml")
    output = flat_output(result)
    assert result.returncode != 0
    assert "has no `version` line" in output and "containerd config migrate" in output, output[-3000:]
    assert "changed: [" not in result.stdout
    assert after == before


def test_invalid_daemon_json_is_refused_and_kept(host):
    host.run_expect([0], "cp -p /etc/docker/daemon.json /root/daemon.json.keep && "
                         "printf '{\"log-driver\": \"json-file\",}' > /etc/docker/daemon.json")
    try:
        before = snapshot(host)
        result = run_role({})
        after = snapshot(host)
    finally:
        host.run_expect([0], "mv /root/daemon.json.keep /etc/docker/daemon.json")
    output = flat_output(result)
    assert result.returncode != 0
    assert "/etc/docker/daemon.json is not a JSON object" in output and "never overwrites it" in output, output[-3000:]
    assert after == before
