"""Outcome checks of the nvidia_driver role on a converged host, shared by the Molecule scenarios' testinfra tests."""

from __future__ import annotations

import json
import os
import subprocess

STATE_FILE = "/etc/ansible/facts.d/nvidia_driver.fact"
SOURCES_FILE = "/etc/apt/sources.list.d/nvidia-driver.sources"
BLACKLIST_FILE = "/etc/modprobe.d/nvidia-driver-blacklist-nouveau.conf"


def parse_deb822(text: str) -> dict[str, str]:
    """One deb822 stanza as a dict; comment lines are ignored."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    return fields


def held_packages(host) -> set[str]:
    out = host.check_output("dpkg --get-selections")
    # Multi-arch packages are listed as name:arch.
    return {fields[0].split(":")[0] for fields in (line.split() for line in out.splitlines()) if fields[1:] == ["hold"]}


def assert_driver_installed(host, packages: list[str], absent: list[str] = ()) -> None:
    for name in packages:
        assert host.package(name).is_installed, f"{name} is not installed"
    held = held_packages(host)
    assert set(packages) <= held, f"not held: {sorted(set(packages) - held)}"
    for name in absent:
        assert not host.package(name).is_installed, f"{name} should have been removed"
        assert name not in held, f"{name} is still held"


def assert_state_file(host, source: str, branch: str, kernel_modules: str, packages: list[str]) -> None:
    state = json.loads(host.file(STATE_FILE).content_string)
    assert state["source"] == source
    assert state["branch"] == branch
    assert state["kernel_modules"] == kernel_modules
    assert sorted(state["packages"]) == sorted(packages)


def assert_sources(host, expect: dict[str, str]) -> None:
    sources = host.file(SOURCES_FILE)
    assert sources.exists and sources.mode == 0o644
    fields = parse_deb822(sources.content_string)
    for key, value in expect.items():
        assert fields.get(key) == value, f"{key}: {fields.get(key)!r} != {value!r}"
    keyring = fields["Signed-By"]
    assert host.file(keyring).exists, f"Signed-By keyring {keyring} is missing"
    # apt itself must accept the repository with its signature: no warnings about it in an update.
    update = host.run("apt-get update")
    assert update.rc == 0, update.stderr
    assert "NO_PUBKEY" not in update.stderr and "not signed" not in update.stderr, update.stderr


def assert_blacklist_and_persistenced(host) -> None:
    blacklist = host.file(BLACKLIST_FILE)
    assert blacklist.exists and blacklist.mode == 0o644
    lines = [line.strip() for line in blacklist.content_string.splitlines()]
    assert "blacklist nouveau" in lines and "options nouveau modeset=0" in lines
    service = host.service("nvidia-persistenced")
    assert service.is_enabled
    # No GPU in a container: the daemon is enabled but not started (the module is not loaded).
    assert not service.is_running


def exported_facts(host_name: str) -> dict:
    """ansible_facts['nvidia_driver'] as the role's module exports them, read through Ansible from the converged host."""
    result = subprocess.run(
        ["ansible", "-i", os.environ["MOLECULE_INVENTORY_FILE"], host_name, "-m", "gpu_ops.cluster.nvidia_driver_info", "-o"],
        capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    payload = result.stdout.split("=>", 1)[1].strip()
    facts, _end = json.JSONDecoder().raw_decode(payload)
    return facts["ansible_facts"]["nvidia_driver"]


def assert_facts_exported(host_name: str, branch: str, kernel_modules: str) -> None:
    facts = exported_facts(host_name)
    assert facts["managed"]["branch"] == branch
    assert facts["managed"]["kernel_modules"] == kernel_modules
    assert facts["in_container"] is True
    # The userspace library of the branch is installed; no module can load in a container, so nothing is to be done.
    assert facts["library_version"].startswith(branch + ".")
    assert facts["module_loaded"] is False and facts["version_mismatch"] is False
    assert facts["action"] == "none" and facts["reboot_required"] is False
