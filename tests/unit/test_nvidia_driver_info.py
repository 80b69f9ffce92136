"""Unit tests for plugins/module_utils/nvidia_driver.py and plugins/modules/nvidia_driver_info.py.

No GPU is needed: the kernel's view of the driver is rebuilt as a fake root tree in tmp_path, with /proc, /sys and
library contents copied from real hosts, and the two host commands (modinfo, mokutil) are replaced by doubles.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from ansible.module_utils import basic
from ansible_collections.gpu_ops.cluster.plugins.module_utils import host_state
from ansible_collections.gpu_ops.cluster.plugins.module_utils.nvidia_driver import (
    decide_action,
    detect_container,
    environ_declares_container,
    gather_driver_facts,
    newest_library_version,
    normalise_version,
    parse_efivar_secure_boot,
    parse_modinfo_version,
    parse_mokutil_sb_state,
    parse_proc_version,
    parse_state_file,
    version_mismatch,
)

KERNEL = "6.8.0-52-generic"
EFIVAR = "sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
STATE_FILE = "etc/ansible/facts.d/nvidia_driver.fact"

# /proc/driver/nvidia/version as real hosts print it.
PROC_PROPRIETARY_535 = (
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.261.03  Wed Jul 30 14:38:02 UTC 2025\n"
    "GCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04)\n"
)
PROC_PROPRIETARY_535_OLD = (
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.216.03  Wed Oct 30 16:47:13 UTC 2024\n"
    "GCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04)\n"
)
PROC_OPEN_550 = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.163.01  Release Build  "
    "(dvs-builder@U16-I3-B03-4-3)  Tue Apr  8 12:29:21 UTC 2025\n"
    "GCC version:  gcc version 13.3.0 (Ubuntu 13.3.0-6ubuntu2~24.04)\n"
)
PROC_OPEN_570_ARM = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  570.133.20  Release Build  "
    "(dvs-builder@U16-I1-N07-12-3)  Thu Mar 27 17:06:38 UTC 2025\n"
    "GCC version:  gcc version 11.4.1 20231218 (Red Hat 11.4.1-3) (GCC)\n"
)
PROC_PROPRIETARY_535_ARM = "NVRM version: NVIDIA UNIX aarch64 Kernel Module  535.154.05  Thu Dec 28 15:51:29 UTC 2023\n"
PROC_LEGACY_390 = (
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  390.157  Wed Oct 12 09:19:07 UTC 2022\n"
    "GCC version:  gcc version 7.5.0 (Ubuntu 7.5.0-3ubuntu1~18.04)\n"
)

# SecureBoot efivar: attributes BOOTSERVICE_ACCESS|RUNTIME_ACCESS (0x06, little endian), then the value byte.
EFIVAR_ENABLED = b"\x06\x00\x00\x00\x01"
EFIVAR_DISABLED = b"\x06\x00\x00\x00\x00"

STATE_535 = {
    "source": "packages",
    "branch": "535",
    "kernel_modules": "proprietary",
    "version": "535.261.03",
    "packages": ["nvidia-driver-535", "nvidia-dkms-535"],
}

FACT_KEYS = {
    "kernel_release",
    "in_container",
    "secure_boot",
    "module_loaded",
    "loaded_version",
    "loaded_flavor",
    "installed_module_version",
    "installed_module_present",
    "library_version",
    "nouveau_loaded",
    "runfile_installed",
    "operator_driver",
    "managed",
    "version_mismatch",
    "mismatch_message",
    "action",
    "action_reason",
    "reboot_required",
}


def make_tree(root: Path, files: Dict[str, Union[str, bytes, None]]) -> Path:
    """Create files under root; a value of None makes a directory."""
    for relative, content in files.items():
        path = root / relative
        if content is None:
            path.mkdir(parents=True, exist_ok=True)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    return root


def loaded_driver(version: str, proc_text: str) -> Dict[str, Union[str, bytes, None]]:
    return {
        "sys/module/nvidia/version": version + "\n",
        "proc/driver/nvidia/version": proc_text,
    }


def probe(output: Optional[str]):
    return lambda: output


def must_not_run():
    raise AssertionError("this probe must not run")


# --- Parsers --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(PROC_PROPRIETARY_535, ("535.261.03", "proprietary"), id="proprietary-535-x86_64"),
        pytest.param(PROC_OPEN_550, ("550.163.01", "open"), id="open-550-x86_64"),
        pytest.param(PROC_OPEN_570_ARM, ("570.133.20", "open"), id="open-570-aarch64"),
        pytest.param(PROC_PROPRIETARY_535_ARM, ("535.154.05", "proprietary"), id="proprietary-535-aarch64"),
        pytest.param(PROC_LEGACY_390, ("390.157", "proprietary"), id="legacy-390-two-part-version"),
        pytest.param("", (None, None), id="empty"),
        pytest.param(None, (None, None), id="missing"),
        pytest.param("GCC version:  gcc version 12.3.0\n", (None, None), id="no-nvrm-line"),
        pytest.param("NVRM version: NVIDIA UNIX x86_64 Kernel Module  \n", (None, None), id="truncated"),
    ],
)
def test_parse_proc_version(text: Optional[str], expected: Tuple[Optional[str], Optional[str]]) -> None:
    assert parse_proc_version(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("535.261.03\n", "535.261.03"),
        ("  390.157 ", "390.157"),
        ("", None),
        (None, None),
        ("535", None),
        ("535.261.03-1ubuntu1", None),
        ("\u0665\u0663\u0665.\u0661", None),  # Arabic-Indic digits are not a driver version
    ],
)
def test_normalise_version(text: Optional[str], expected: Optional[str]) -> None:
    assert normalise_version(text) == expected


@pytest.mark.parametrize(
    ("stdout", "expected"),
    [
        ("535.261.03\n", "535.261.03"),
        ("\n550.163.01\n", "550.163.01"),
        ("", None),
        (None, None),
        ("modinfo: ERROR: Module nvidia not found.\n", None),
    ],
)
def test_parse_modinfo_version(stdout: Optional[str], expected: Optional[str]) -> None:
    assert parse_modinfo_version(stdout) == expected


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        pytest.param(EFIVAR_ENABLED, "enabled", id="enabled"),
        pytest.param(EFIVAR_DISABLED, "disabled", id="disabled"),
        pytest.param(b"\x07\x00\x00\x00\x01", "enabled", id="non-volatile-attribute"),
        pytest.param(b"\x06\x00\x00\x00\x02", "unknown", id="out-of-range-value"),
        pytest.param(b"\x06\x00\x00\x00", "unknown", id="attributes-only"),
        pytest.param(b"", "unknown", id="empty"),
        pytest.param(None, "unknown", id="unreadable"),
    ],
)
def test_parse_efivar_secure_boot(data: Optional[bytes], expected: str) -> None:
    assert parse_efivar_secure_boot(data) == expected


@pytest.mark.parametrize(
    ("stdout", "expected"),
    [
        ("SecureBoot enabled\n", "enabled"),
        ("SecureBoot disabled\n", "disabled"),
        ("SecureBoot disabled\nPlatform is in Setup Mode\n", "disabled"),
        ("SecureBoot enabled\nSecureBoot validation is disabled in shim\n", "enabled"),
        ("This system doesn't support Secure Boot\n", "unsupported"),
        ("\nEFI variables are not supported on this system\n", "unsupported"),
        ("Failed to read SecureBoot\n", "unknown"),
        ("", "unknown"),
        (None, "unknown"),
    ],
)
def test_parse_mokutil_sb_state(stdout: Optional[str], expected: str) -> None:
    assert parse_mokutil_sb_state(stdout) == expected


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        (["libnvidia-ml.so", "libnvidia-ml.so.1", "libnvidia-ml.so.535.261.03"], "535.261.03"),
        (["libnvidia-ml.so.535.216.03", "libnvidia-ml.so.535.261.03"], "535.261.03"),
        # Numeric, not lexical: 535.86 is older than 535.104.
        (["libnvidia-ml.so.535.104.05", "libnvidia-ml.so.535.86.10"], "535.104.05"),
        (["libnvidia-ml.so.390.157", "libnvidia-ml.so.1"], "390.157"),
        (["libnvidia-ml.so.1", "libnvidia-ml.so.535.261.03.bak", "libcuda.so.535.261.03"], None),
        ([], None),
    ],
)
def test_newest_library_version(names: List[str], expected: Optional[str]) -> None:
    assert newest_library_version(names) == expected


@pytest.mark.parametrize(
    ("text", "expected_content", "warns"),
    [
        (json.dumps(STATE_535), STATE_535, False),
        (None, {}, False),
        ("{not json", {}, True),
        ("", {}, True),
        ('["535"]', {}, True),
    ],
)
def test_parse_state_file(text: Optional[str], expected_content: Dict[str, Any], warns: bool) -> None:
    content, warning = parse_state_file(text)
    assert content == expected_content
    assert (warning is not None) is warns


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        (b"PATH=/usr/bin\0container=podman\0HOME=/\0", True),
        (b"container=lxc\0", True),
        (b"PATH=/usr/bin\0HOME=/\0", False),
        (b"NOTcontainer=podman\0", False),
        (b"", False),
        (None, False),
    ],
)
def test_environ_declares_container(environ: Optional[bytes], expected: bool) -> None:
    assert environ_declares_container(environ) is expected


# --- Decisions ------------------------------------------------------------------------------------------------------


def test_version_mismatch_message() -> None:
    assert version_mismatch("535.216.03", "535.261.03") == (
        True,
        "Driver/library version mismatch: kernel module 535.216.03 is loaded but the NVML library is 535.261.03; "
        "reboot the node or reload the nvidia kernel module",
    )


@pytest.mark.parametrize(
    ("loaded", "library"),
    [("535.261.03", "535.261.03"), (None, "535.261.03"), ("535.261.03", None), (None, None)],
)
def test_no_version_mismatch(loaded: Optional[str], library: Optional[str]) -> None:
    assert version_mismatch(loaded, library) == (False, None)


@pytest.mark.parametrize(
    ("installed", "loaded", "nouveau", "container", "present", "action", "reason_contains"),
    [
        pytest.param("550.163.01", None, True, True, True, "none", "inside a container", id="container"),
        pytest.param(None, None, False, False, False, "none", "no nvidia kernel module", id="nothing-installed"),
        pytest.param("550.163.01", None, True, False, True, "reboot", "nouveau", id="nouveau-holds-gpu"),
        pytest.param("550.163.01", None, False, False, True, "load", "not loaded", id="installed-not-loaded"),
        pytest.param(None, None, False, False, True, "load", "not loaded", id="dkms-present-no-modinfo"),
        pytest.param(None, "550.163.01", False, False, True, "none", "no installed version", id="modinfo-missing"),
        pytest.param(
            "535.261.03",
            "535.216.03",
            False,
            False,
            True,
            "reboot",
            "535.216.03 is loaded but 535.261.03",
            id="upgraded-not-rebooted",
        ),
        pytest.param("535.261.03", "535.261.03", False, False, False, "none", "loaded and installed", id="current"),
    ],
)
def test_decide_action(
    installed: Optional[str],
    loaded: Optional[str],
    nouveau: bool,
    container: bool,
    present: bool,
    action: str,
    reason_contains: str,
) -> None:
    decided, reason = decide_action(installed, loaded, nouveau, container, present)
    assert decided == action
    assert reason_contains in reason


# --- Properties -----------------------------------------------------------------------------------------------------

VERSIONS = st.lists(st.integers(min_value=0, max_value=9999), min_size=2, max_size=3).map(
    lambda parts: ".".join(str(part) for part in parts)
)


@given(st.text())
def test_parse_proc_version_never_raises(text: str) -> None:
    version, flavour = parse_proc_version(text)
    assert version is None or normalise_version(version) == version
    assert flavour in (None, "open", "proprietary")
    assert (version is None) == (flavour is None)


@given(st.text(), st.text())
def test_parse_proc_version_never_raises_near_the_marker(before: str, after: str) -> None:
    version, flavour = parse_proc_version(before + "NVRM version: NVIDIA UNIX Open Kernel Module" + after)
    assert version is None or normalise_version(version) == version
    assert flavour in (None, "open", "proprietary")


@given(VERSIONS, st.booleans(), st.sampled_from(["x86_64", "aarch64"]))
def test_parse_proc_version_reads_any_version(version: str, is_open: bool, arch: str) -> None:
    if is_open:
        line = "NVRM version: NVIDIA UNIX Open Kernel Module for {0}  {1}  Release Build  (dvs-builder@x)".format(
            arch, version
        )
    else:
        line = "NVRM version: NVIDIA UNIX {0} Kernel Module  {1}  Wed Jul 30 14:38:02 UTC 2025".format(arch, version)
    assert parse_proc_version(line + "\n") == (version, "open" if is_open else "proprietary")


@given(st.text())
def test_parse_mokutil_never_raises(text: str) -> None:
    assert parse_mokutil_sb_state(text) in ("enabled", "disabled", "unsupported", "unknown")


@given(st.binary())
def test_parse_efivar_never_raises(data: bytes) -> None:
    assert parse_efivar_secure_boot(data) in ("enabled", "disabled", "unknown")


# --- End to end over a fake root ------------------------------------------------------------------------------------


def test_gather_empty_root(tmp_path: Path) -> None:
    facts, warnings = gather_driver_facts(str(tmp_path), KERNEL)
    assert warnings == []
    assert facts == {
        "kernel_release": KERNEL,
        "in_container": False,
        "secure_boot": "unsupported",
        "module_loaded": False,
        "loaded_version": None,
        "loaded_flavor": None,
        "installed_module_version": None,
        "installed_module_present": False,
        "library_version": None,
        "nouveau_loaded": False,
        "runfile_installed": False,
        "operator_driver": False,
        "managed": {},
        "version_mismatch": False,
        "mismatch_message": None,
        "action": "none",
        "action_reason": "no nvidia kernel module is installed for the running kernel",
        "reboot_required": False,
    }


def test_gather_current_proprietary_driver(tmp_path: Path) -> None:
    make_tree(
        tmp_path,
        {
            **loaded_driver("535.261.03", PROC_PROPRIETARY_535),
            "lib/modules/{0}/updates/dkms/nvidia.ko.zst".format(KERNEL): b"\x28\xb5\x2f\xfd",
            "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1": "",
            "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.535.261.03": "",
            EFIVAR: EFIVAR_ENABLED,
            STATE_FILE: json.dumps(STATE_535),
        },
    )
    facts, warnings = gather_driver_facts(str(tmp_path), KERNEL, modinfo=probe("535.261.03\n"), mokutil=must_not_run)
    assert warnings == []
    assert set(facts) == FACT_KEYS
    assert facts["module_loaded"] is True
    assert (facts["loaded_version"], facts["loaded_flavor"]) == ("535.261.03", "proprietary")
    assert facts["installed_module_version"] == "535.261.03"
    assert facts["installed_module_present"] is True
    assert facts["library_version"] == "535.261.03"
    assert facts["secure_boot"] == "enabled"
    assert facts["managed"] == STATE_535
    assert (facts["version_mismatch"], facts["action"], facts["reboot_required"]) == (False, "none", False)


def test_gather_upgraded_but_not_rebooted(tmp_path: Path) -> None:
    make_tree(
        tmp_path,
        {
            **loaded_driver("535.216.03", PROC_PROPRIETARY_535_OLD),
            "lib/modules/{0}/updates/dkms/nvidia.ko".format(KERNEL): b"\x7fELF",
            "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.535.261.03": "",
            "usr/lib64/libnvidia-ml.so.535.216.03": "",
            EFIVAR: EFIVAR_DISABLED,
        },
    )
    facts, _ = gather_driver_facts(str(tmp_path), KERNEL, modinfo=probe("535.261.03\n"))
    assert facts["library_version"] == "535.261.03"
    assert facts["secure_boot"] == "disabled"
    assert facts["version_mismatch"] is True
    assert facts["mismatch_message"] == (
        "Driver/library version mismatch: kernel module 535.216.03 is loaded but the NVML library is 535.261.03; "
        "reboot the node or reload the nvidia kernel module"
    )
    assert (facts["action"], facts["reboot_required"]) == ("reboot", True)


def test_gather_open_module_known_only_from_proc(tmp_path: Path) -> None:
    make_tree(
        tmp_path,
        {
            "sys/module/nvidia": None,
            "proc/driver/nvidia/version": PROC_OPEN_550,
            "usr/lib/x86_64-linux-gnu/nvidia/current/libnvidia-ml.so.550.163.01": "",
        },
    )
    facts, _ = gather_driver_facts(str(tmp_path), KERNEL, modinfo=probe("550.163.01\n"))
    assert (facts["module_loaded"], facts["loaded_version"], facts["loaded_flavor"]) == (True, "550.163.01", "open")
    assert facts["library_version"] == "550.163.01"
    assert facts["action"] == "none"


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        pytest.param({"sys/module/nvidia/version": "535.261.03\n"}, ("535.261.03", None), id="proc-masked"),
        pytest.param(
            {"sys/module/nvidia/version": "garbage\n", "proc/driver/nvidia/version": PROC_OPEN_570_ARM},
            ("570.133.20", "open"),
            id="sys-unparsable",
        ),
    ],
)
def test_gather_loaded_version_sources(
    tmp_path: Path, files: Dict[str, Union[str, bytes, None]], expected: Tuple[Optional[str], Optional[str]]
) -> None:
    facts, _ = gather_driver_facts(str(make_tree(tmp_path, files)), KERNEL)
    assert facts["module_loaded"] is True
    assert (facts["loaded_version"], facts["loaded_flavor"]) == expected


@pytest.mark.parametrize(("nouveau", "action"), [(True, "reboot"), (False, "load")])
def test_gather_installed_not_loaded(tmp_path: Path, nouveau: bool, action: str) -> None:
    files: Dict[str, Union[str, bytes, None]] = {
        "lib/modules/{0}/updates/dkms/nvidia.ko.xz".format(KERNEL): b"\xfd7zXZ",
        "usr/lib/aarch64-linux-gnu/libnvidia-ml.so.570.133.20": "",
    }
    if nouveau:
        files["sys/module/nouveau"] = None
    make_tree(tmp_path, files)
    facts, _ = gather_driver_facts(str(tmp_path), KERNEL, modinfo=probe(None))
    assert facts["nouveau_loaded"] is nouveau
    assert facts["installed_module_present"] is True
    assert facts["installed_module_version"] is None
    assert facts["version_mismatch"] is False  # nothing loaded, nothing to compare
    assert (facts["action"], facts["reboot_required"]) == (action, action == "reboot")


def test_gather_dkms_module_for_another_kernel_is_not_installed(tmp_path: Path) -> None:
    make_tree(tmp_path, {"lib/modules/6.8.0-40-generic/updates/dkms/nvidia.ko.zst": b""})
    facts, _ = gather_driver_facts(str(tmp_path), KERNEL)
    assert facts["installed_module_present"] is False


def test_gather_in_container(tmp_path: Path) -> None:
    make_tree(tmp_path, {".dockerenv": "", **loaded_driver("550.163.01", PROC_OPEN_550)})
    facts, _ = gather_driver_facts(str(tmp_path), KERNEL, modinfo=probe("535.261.03\n"))
    assert facts["in_container"] is True
    # /sys/firmware is masked in containers: unknown, not "legacy BIOS".
    assert facts["secure_boot"] == "unknown"
    assert (facts["action"], facts["action_reason"]) == ("none", "the host kernel owns the module inside a container")


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"run/.containerenv": ""}, True),
        ({"run/systemd/container": "podman\n"}, True),
        ({"run/systemd/container": "\n"}, False),
        ({"proc/1/environ": b"container=lxc\0PATH=/bin\0"}, True),
        ({"proc/1/environ": b"PATH=/bin\0"}, False),
        ({}, False),
    ],
)
def test_detect_container(tmp_path: Path, files: Dict[str, Union[str, bytes, None]], expected: bool) -> None:
    assert detect_container(str(make_tree(tmp_path, files))) is expected


@pytest.mark.parametrize(
    ("files", "mokutil", "expected"),
    [
        pytest.param({"sys/firmware/efi/efivars": None}, "SecureBoot disabled\n", "disabled", id="efivars-unreadable"),
        pytest.param({"sys/firmware/efi": None}, "SecureBoot enabled\n", "enabled", id="no-efivarfs"),
        pytest.param({"sys/firmware/efi": None}, None, "unknown", id="efi-no-mokutil"),
        pytest.param({}, "This system doesn't support Secure Boot\n", "unsupported", id="bios-mokutil"),
        pytest.param({}, None, "unsupported", id="bios-no-mokutil"),
        pytest.param({EFIVAR: b"\x06"}, "SecureBoot enabled\n", "enabled", id="short-efivar-falls-back"),
    ],
)
def test_gather_secure_boot_fallbacks(
    tmp_path: Path, files: Dict[str, Union[str, bytes, None]], mokutil: Optional[str], expected: str
) -> None:
    facts, _ = gather_driver_facts(str(make_tree(tmp_path, files)), KERNEL, mokutil=probe(mokutil))
    assert facts["secure_boot"] == expected


@pytest.mark.parametrize(
    ("files", "runfile", "operator"),
    [
        ({"usr/bin/nvidia-uninstall": "#!/bin/sh\n"}, True, False),
        ({"var/log/nvidia-installer.log": "nvidia-installer log file\n"}, True, False),
        ({"run/nvidia/driver/usr/bin/nvidia-smi": ""}, False, True),
        ({"run/nvidia/driver": None}, False, False),
    ],
)
def test_gather_other_driver_owners(
    tmp_path: Path, files: Dict[str, Union[str, bytes, None]], runfile: bool, operator: bool
) -> None:
    facts, _ = gather_driver_facts(str(make_tree(tmp_path, files)), KERNEL)
    assert (facts["runfile_installed"], facts["operator_driver"]) == (runfile, operator)


def test_gather_invalid_state_file_warns(tmp_path: Path) -> None:
    make_tree(tmp_path, {STATE_FILE: '{"source": "packages",'})
    facts, warnings = gather_driver_facts(str(tmp_path), KERNEL)
    assert facts["managed"] == {}
    assert len(warnings) == 1
    assert str(tmp_path / STATE_FILE) in warnings[0]
    assert "not valid JSON" in warnings[0]


def test_gather_custom_state_file(tmp_path: Path) -> None:
    make_tree(tmp_path, {"var/lib/gpu/driver.json": json.dumps(STATE_535)})
    facts, _ = gather_driver_facts(str(tmp_path), KERNEL, state_file="/var/lib/gpu/driver.json")
    assert facts["managed"] == STATE_535


# --- The Ansible module ---------------------------------------------------------------------------------------------


class FakeCommands:
    """Double for the host's modinfo and mokutil: records command lines, answers from a table."""

    def __init__(self, answers: Dict[str, Tuple[int, str, str]]) -> None:
        self.answers = answers
        self.calls: List[List[str]] = []

    def get_bin_path(self, module: basic.AnsibleModule, name: str, *args: Any, **kwargs: Any) -> Optional[str]:
        return "/usr/sbin/" + name if name in self.answers else None

    def run_command(self, module: basic.AnsibleModule, args: List[str], **kwargs: Any) -> Tuple[int, str, str]:
        self.calls.append(list(args))
        return self.answers[os.path.basename(args[0])]

    def install(self, monkeypatch: pytest.MonkeyPatch) -> "FakeCommands":
        fake = self
        monkeypatch.setattr(basic.AnsibleModule, "get_bin_path", lambda s, *a, **k: fake.get_bin_path(s, *a, **k))
        monkeypatch.setattr(basic.AnsibleModule, "run_command", lambda s, *a, **k: fake.run_command(s, *a, **k))
        return self


@pytest.fixture
def driver_host(tmp_path: Path) -> Path:
    """A host with the open 550 driver loaded and installed for the kernel this test runs on."""
    return make_tree(
        tmp_path,
        {
            **loaded_driver("550.163.01", PROC_OPEN_550),
            "lib/modules/{0}/updates/dkms/nvidia.ko".format(os.uname().release): b"\x7fELF",
            "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.163.01": "",
            STATE_FILE: json.dumps(STATE_535),
        },
    )


@pytest.mark.parametrize("check_mode", [False, True], ids=["run", "check"])
def test_main_reports_facts_unchanged(
    nvidia_driver_info, monkeypatch: pytest.MonkeyPatch, driver_host: Path, check_mode: bool
) -> None:
    commands = FakeCommands({"modinfo": (0, "550.163.01\n", ""), "mokutil": (0, "SecureBoot enabled\n", "")})
    commands.install(monkeypatch)
    before = sorted((str(path), path.stat().st_mtime_ns) for path in driver_host.rglob("*"))

    result = nvidia_driver_info.exit({"root": str(driver_host)}, check_mode=check_mode)

    assert nvidia_driver_info.ran_in_check_mode is check_mode
    assert result["changed"] is False
    facts = result["ansible_facts"]["nvidia_driver"]
    assert set(facts) == FACT_KEYS
    assert facts["kernel_release"] == os.uname().release
    assert (facts["loaded_version"], facts["loaded_flavor"]) == ("550.163.01", "open")
    assert facts["installed_module_version"] == "550.163.01"
    assert facts["managed"] == STATE_535
    assert facts["action"] == "none"
    # modinfo reads the tree under root for the running kernel; mokutil only describes the live host, so never runs.
    assert commands.calls == [
        ["/usr/sbin/modinfo", "-F", "version", "-k", os.uname().release, "-b", str(driver_host), "nvidia"]
    ]
    assert nvidia_driver_info.warnings == []
    assert sorted((str(path), path.stat().st_mtime_ns) for path in driver_host.rglob("*")) == before


def test_main_without_modinfo(nvidia_driver_info, monkeypatch: pytest.MonkeyPatch, driver_host: Path) -> None:
    FakeCommands({}).install(monkeypatch)
    facts = nvidia_driver_info.exit({"root": str(driver_host)})["ansible_facts"]["nvidia_driver"]
    assert facts["installed_module_version"] is None
    assert facts["installed_module_present"] is True


def test_main_modinfo_fails(nvidia_driver_info, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    FakeCommands({"modinfo": (1, "", "modinfo: ERROR: Module nvidia not found.\n")}).install(monkeypatch)
    facts = nvidia_driver_info.exit({"root": str(tmp_path)})["ansible_facts"]["nvidia_driver"]
    assert facts["installed_module_version"] is None
    assert facts["action"] == "none"


def test_main_warns_on_invalid_state_file(nvidia_driver_info, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    FakeCommands({}).install(monkeypatch)
    make_tree(tmp_path, {"state.json": "not json"})
    result = nvidia_driver_info.exit({"root": str(tmp_path), "state_file": "/state.json"})
    assert result["changed"] is False
    assert result["ansible_facts"]["nvidia_driver"]["managed"] == {}
    assert len(nvidia_driver_info.warnings) == 1
    assert "state.json" in nvidia_driver_info.warnings[0]


def test_main_rejects_unknown_option(nvidia_driver_info) -> None:
    result = nvidia_driver_info.fail({"rooot": "/"})
    assert result["failed"] is True
    assert "rooot" in result["msg"]


@pytest.mark.parametrize(
    ("rc", "stdout", "stderr", "expected"),
    [
        (0, "SecureBoot enabled\n", "", "enabled"),
        (255, "This system doesn't support Secure Boot\n", "", "unsupported"),
        (255, "", "EFI variables are not supported on this system\n", "unsupported"),
    ],
)
def test_secure_boot_output_reads_both_streams(
    nvidia_driver_info, rc: int, stdout: str, stderr: str, expected: str
) -> None:
    class Module:
        def get_bin_path(self, name: str) -> str:
            return "/usr/bin/" + name

        def run_command(self, args: List[str], **kwargs: Any) -> Tuple[int, str, str]:
            assert args == ["/usr/bin/mokutil", "--sb-state"]
            return rc, stdout, stderr

    output = host_state.secure_boot_output(Module(), "/")
    assert parse_mokutil_sb_state(output) == expected


def test_documentation_matches_code(nvidia_driver_info, tmp_path: Path) -> None:
    module = nvidia_driver_info.module
    documentation = yaml.safe_load(module.DOCUMENTATION)
    returned = yaml.safe_load(module.RETURN)
    yaml.safe_load(module.EXAMPLES)

    spec = module.build_argspec()
    assert set(documentation["options"]) == set(spec)
    for name, option in documentation["options"].items():
        assert option["type"] == spec[name]["type"]
        assert option["default"] == spec[name]["default"]

    documented = returned["ansible_facts"]["contains"]["nvidia_driver"]["contains"]
    assert set(documented) == FACT_KEYS
    facts, _ = gather_driver_facts(str(tmp_path), KERNEL)
    assert set(facts) == FACT_KEYS
    for key, entry in documented.items():
        assert {"description", "returned", "type"} <= set(entry), key
