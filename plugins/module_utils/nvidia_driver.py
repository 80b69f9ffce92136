# -*- coding: utf-8 -*-
# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)
"""Read-only inspection of the NVIDIA driver on a host.

Pure functions: every parser takes text or bytes, every probe takes a filesystem root so the tests can point it at a
temporary tree, and nothing here imports Ansible. A failure to read something is data (None, "unknown", {}), never an
exception, because the role decides what to do about a host it could only partly see.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

VERSION_PATTERN = r"[0-9]+\.[0-9]+(?:\.[0-9]+)?"
_VERSION_RE = re.compile(r"^(" + VERSION_PATTERN + r")\Z")
# First line of /proc/driver/nvidia/version, for both module flavours:
#   NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.261.03  Wed Jul 30 ...
#   NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.163.01  Release Build  ...
_NVRM_LINE_RE = re.compile(
    r"NVRM version:.*?\b(?P<open>Open )?Kernel Module(?:\s+for\s+\S+)?\s+(?P<version>" + VERSION_PATTERN + r")\b"
)
_LIBRARY_NAME_RE = re.compile(r"^libnvidia-ml\.so\.(" + VERSION_PATTERN + r")\Z")

SECURE_BOOT_EFIVAR = "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
EFI_DIR = "/sys/firmware/efi"
DEFAULT_STATE_FILE = "/etc/ansible/facts.d/nvidia_driver.fact"
LIBRARY_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu/nvidia/current",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu/nvidia/current",
    "/usr/lib64",
    "/usr/lib",
)
CONTAINER_MARKERS = ("/run/.containerenv", "/.dockerenv")
RUNFILE_MARKERS = ("/usr/bin/nvidia-uninstall", "/var/log/nvidia-installer.log")

ACTION_NONE = "none"
ACTION_LOAD = "load"
ACTION_REBOOT = "reboot"

# A probe that runs a host command and returns its stdout, or None when the command is missing or failed.
CommandProbe = Callable[[], Optional[str]]


# --- Paths and reads ------------------------------------------------------------------------------------------------


def host_path(root: str, path: str) -> str:
    """Place an absolute host path under root; relative paths are taken as relative to root too."""
    return os.path.join(root, path.lstrip("/"))


def read_text(path: str) -> Optional[str]:
    try:
        with open(path, "r", encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except (OSError, ValueError):
        return None


def read_bytes(path: str) -> Optional[bytes]:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except (OSError, ValueError):
        return None


def dir_has_entries(path: str) -> bool:
    try:
        return os.path.isdir(path) and len(os.listdir(path)) > 0
    except OSError:
        return False


def list_dir(path: str) -> List[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


# --- Parsers --------------------------------------------------------------------------------------------------------


def normalise_version(text: Optional[str]) -> Optional[str]:
    """Return text stripped if it is a driver version (535.261.03, 390.157), else None."""
    if text is None:
        return None
    match = _VERSION_RE.match(text.strip())
    return match.group(1) if match else None


def parse_proc_version(text: Optional[str]) -> Tuple[Optional[str], Optional[str]]:
    """Return (version, flavour) from /proc/driver/nvidia/version; flavour is "open", "proprietary" or None."""
    if not text:
        return None, None
    for line in text.splitlines():
        match = _NVRM_LINE_RE.search(line)
        if match:
            flavour = "open" if match.group("open") else "proprietary"
            return match.group("version"), flavour
    return None, None


def parse_modinfo_version(stdout: Optional[str]) -> Optional[str]:
    """Return the version printed by `modinfo -F version nvidia`, or None."""
    if not stdout:
        return None
    for line in stdout.splitlines():
        if line.strip():
            return normalise_version(line)
    return None


def parse_efivar_secure_boot(data: Optional[bytes]) -> str:
    """Decode the SecureBoot efivar: four attribute bytes, then one value byte (1 = enabled, 0 = disabled)."""
    if data is None or len(data) < 5:
        return "unknown"
    value = data[4]
    if value == 1:
        return "enabled"
    if value == 0:
        return "disabled"
    return "unknown"


def parse_mokutil_sb_state(stdout: Optional[str]) -> str:
    """Map `mokutil --sb-state` output to enabled, disabled, unsupported or unknown."""
    if not stdout:
        return "unknown"
    for line in stdout.splitlines():
        words = line.strip().lower()
        if words == "secureboot enabled":
            return "enabled"
        if words == "secureboot disabled":
            return "disabled"
        # Legacy BIOS hosts: "This system doesn't support Secure Boot" or "EFI variables are not supported ..."
        if "doesn't support secure boot" in words or "efi variables are not supported" in words:
            return "unsupported"
    return "unknown"


def version_key(version: str) -> Tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def newest_library_version(file_names: Iterable[str]) -> Optional[str]:
    """Return the newest X.Y[.Z] among libnvidia-ml.so.<X.Y[.Z]> names; the .so.1 soname link carries no version."""
    versions = [match.group(1) for match in (_LIBRARY_NAME_RE.match(name) for name in file_names) if match]
    if not versions:
        return None
    return max(versions, key=version_key)


def parse_state_file(text: Optional[str]) -> Tuple[Dict[str, Any], Optional[str]]:
    """Return (content, warning) for the role's state file; missing -> ({}, None), invalid -> ({}, warning)."""
    if text is None:
        return {}, None
    try:
        content = json.loads(text)
    except ValueError as error:
        return {}, "nvidia_driver state file is not valid JSON ({0}); ignoring it".format(error)
    if not isinstance(content, dict):
        return {}, "nvidia_driver state file holds a JSON {0}, not an object; ignoring it".format(
            type(content).__name__
        )
    return content, None


def environ_declares_container(environ: Optional[bytes]) -> bool:
    """True when a NUL-separated environ block (/proc/1/environ) sets container=..."""
    if not environ:
        return False
    return any(entry.startswith(b"container=") for entry in environ.split(b"\0"))


# --- Decisions ------------------------------------------------------------------------------------------------------


def version_mismatch(loaded_version: Optional[str], library_version: Optional[str]) -> Tuple[bool, Optional[str]]:
    """NVML refuses to work ("Driver/library version mismatch") when the loaded module and the library differ."""
    if not loaded_version or not library_version or loaded_version == library_version:
        return False, None
    return True, (
        "Driver/library version mismatch: kernel module {0} is loaded but the NVML library is {1}; "
        "reboot the node or reload the nvidia kernel module".format(loaded_version, library_version)
    )


def decide_action(
    installed_version: Optional[str],
    loaded_version: Optional[str],
    nouveau_loaded: bool,
    in_container: bool,
    installed_present: bool,
) -> Tuple[str, str]:
    """Return (action, reason): what the node needs so that the installed driver is the one running."""
    if in_container:
        return ACTION_NONE, "the host kernel owns the module inside a container"
    if not installed_version and not installed_present:
        return ACTION_NONE, "no nvidia kernel module is installed for the running kernel"
    if not loaded_version:
        if nouveau_loaded:
            return ACTION_REBOOT, "nouveau is loaded and holds the GPU; the nvidia module can only load after a reboot"
        return ACTION_LOAD, "the nvidia kernel module is installed but not loaded"
    if not installed_version:
        return ACTION_NONE, "kernel module {0} is loaded; modinfo gave no installed version to compare".format(
            loaded_version
        )
    if loaded_version != installed_version:
        return ACTION_REBOOT, "kernel module {0} is loaded but {1} is installed".format(
            loaded_version, installed_version
        )
    return ACTION_NONE, "kernel module {0} is loaded and installed".format(loaded_version)


# --- Probes of a filesystem root ------------------------------------------------------------------------------------


def detect_container(root: str) -> bool:
    if any(os.path.exists(host_path(root, marker)) for marker in CONTAINER_MARKERS):
        return True
    if (read_text(host_path(root, "/run/systemd/container")) or "").strip():
        return True
    return environ_declares_container(read_bytes(host_path(root, "/proc/1/environ")))


def detect_secure_boot(root: str, in_container: bool, mokutil: CommandProbe) -> str:
    state = parse_efivar_secure_boot(read_bytes(host_path(root, SECURE_BOOT_EFIVAR)))
    if state != "unknown":
        return state
    state = parse_mokutil_sb_state(mokutil())
    if state != "unknown":
        return state
    # Container runtimes mask /sys/firmware, so its absence there says nothing about the firmware.
    if not in_container and not os.path.isdir(host_path(root, EFI_DIR)):
        return "unsupported"
    return "unknown"


def read_loaded_driver(root: str) -> Tuple[Optional[str], Optional[str]]:
    """Return (version, flavour) of the loaded nvidia module; /sys/module gives the version, /proc the flavour."""
    proc_version, flavour = parse_proc_version(read_text(host_path(root, "/proc/driver/nvidia/version")))
    sys_version = normalise_version(read_text(host_path(root, "/sys/module/nvidia/version")))
    return sys_version or proc_version, flavour


def dkms_module_present(root: str, kernel_release: str) -> bool:
    dkms_dir = host_path(root, "/lib/modules/{0}/updates/dkms".format(kernel_release))
    return any(name == "nvidia.ko" or name.startswith("nvidia.ko.") for name in list_dir(dkms_dir))


def find_library_version(root: str) -> Optional[str]:
    names = []  # type: List[str]
    for directory in LIBRARY_DIRS:
        names.extend(list_dir(host_path(root, directory)))
    return newest_library_version(names)


def gather_driver_facts(
    root: str,
    kernel_release: str,
    state_file: str = DEFAULT_STATE_FILE,
    modinfo: CommandProbe = lambda: None,
    mokutil: CommandProbe = lambda: None,
) -> Tuple[Dict[str, Any], List[str]]:
    """Inspect the tree under root; return (facts, warnings). modinfo and mokutil run only when needed."""
    warnings = []  # type: List[str]
    managed, state_warning = parse_state_file(read_text(host_path(root, state_file)))
    if state_warning:
        warnings.append("{0}: {1}".format(host_path(root, state_file), state_warning))

    in_container = detect_container(root)
    loaded_version, loaded_flavour = read_loaded_driver(root)
    installed_version = parse_modinfo_version(modinfo())
    installed_present = dkms_module_present(root, kernel_release)
    library_version = find_library_version(root)
    nouveau_loaded = os.path.isdir(host_path(root, "/sys/module/nouveau"))
    mismatch, mismatch_message = version_mismatch(loaded_version, library_version)
    action, action_reason = decide_action(
        installed_version, loaded_version, nouveau_loaded, in_container, installed_present
    )

    facts = {
        "kernel_release": kernel_release,
        "in_container": in_container,
        "secure_boot": detect_secure_boot(root, in_container, mokutil),
        "module_loaded": os.path.isdir(host_path(root, "/sys/module/nvidia")),
        "loaded_version": loaded_version,
        "loaded_flavor": loaded_flavour,
        "installed_module_version": installed_version,
        "installed_module_present": installed_present,
        "library_version": library_version,
        "nouveau_loaded": nouveau_loaded,
        "runfile_installed": any(os.path.exists(host_path(root, marker)) for marker in RUNFILE_MARKERS),
        "operator_driver": dir_has_entries(host_path(root, "/run/nvidia/driver")),
        "managed": managed,
        "version_mismatch": mismatch,
        "mismatch_message": mismatch_message,
        "action": action,
        "action_reason": action_reason,
        "reboot_required": action == ACTION_REBOOT,
    }
    return facts, warnings
