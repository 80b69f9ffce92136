"""Outcome checks of the cuda_toolkit role on a converged host, shared by the Molecule scenarios' testinfra tests."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from driver_checks import held_packages, parse_deb822
from playbook_run import flat_output, run_playbook  # noqa: F401 (flat_output is part of this module's interface)

STATE_FILE = "/etc/ansible/facts.d/cuda_toolkit.fact"
SOURCES_FILE = "/etc/apt/sources.list.d/cuda-toolkit.sources"
PROFILE_FILE = "/etc/profile.d/cuda-toolkit.sh"
LD_CONF_FILE = "/etc/ld.so.conf.d/cuda-toolkit.conf"
CONVERGE = Path(__file__).resolve().parents[2] / "molecule" / "_shared" / "cuda_toolkit" / "converge.yml"
RELEASE = re.compile(r"Cuda compilation tools, release (\d+\.\d+), V(\d+\.\d+\.\d+)")


def nvcc_release(output: str) -> str:
    """The "X.Y" of `nvcc --version` output (its last line names release and full version)."""
    match = RELEASE.search(output)
    assert match, f"not nvcc --version output: {output!r}"
    assert match.group(2).startswith(match.group(1) + "."), output
    return match.group(1)


def login_shell(host, command: str) -> str:
    """Run a command in a login shell, so /etc/profile.d is read as a user's session reads it."""
    return host.check_output(f"env -i HOME=/root TERM=dumb bash -lc {command!r}")


def assert_installed_and_held(host, packages: list[str]) -> None:
    held = held_packages(host)
    for name in packages:
        assert host.package(name).is_installed, f"{name} is not installed"
        assert name in held, f"{name} is not held"


def assert_state(host, **expected) -> dict:
    state_file = host.file(STATE_FILE)
    assert state_file.exists and state_file.mode == 0o644
    state = json.loads(state_file.content_string)
    for key, value in expected.items():
        assert state[key] == value, f"{key}: {state[key]!r} != {value!r}"
    return state


def assert_sources(host, expect: dict[str, str]) -> None:
    sources = host.file(SOURCES_FILE)
    assert sources.exists and sources.mode == 0o644
    fields = parse_deb822(sources.content_string)
    for key, value in expect.items():
        assert fields.get(key) == value, f"{key}: {fields.get(key)!r} != {value!r}"
    if "Components" not in expect:
        assert "Components" not in fields
    assert host.file(fields["Signed-By"]).exists
    update = host.run("apt-get update")
    assert update.rc == 0, update.stderr
    assert "NO_PUBKEY" not in update.stderr and "not signed" not in update.stderr, update.stderr


def run_role(extra_vars: dict) -> subprocess.CompletedProcess:
    """The scenario's converge playbook against its host, with extra vars."""
    return run_playbook(CONVERGE, extra_vars)
