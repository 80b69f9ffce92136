# -*- coding: utf-8 -*-
# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)
"""Read-only inspection of the NVIDIA GPUs on a host, through NVML or nvidia-smi.

Both sources end in the same structure (see `empty_facts` and `empty_gpu`). Parsers take text and never raise; the
collectors take their I/O as arguments (an NVML binding object, a command runner) so tests can hand them doubles.
Every failure is data: an `error_kind`, the message as the tool printed it, and advice where there is one.
"""

from __future__ import annotations

import os
import re
import subprocess
import xml.etree.ElementTree as ET
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

from ansible_collections.gpu_ops.cluster.plugins.module_utils.mig_layout import parse_list as parse_gpu_list
from ansible_collections.gpu_ops.cluster.plugins.module_utils.nvidia_driver import read_loaded_driver

# Field order of the CSV query; the parser maps columns by this list (or by a header line when one is present).
QUERY_FIELDS = (
    "index",
    "uuid",
    "name",
    "driver_version",
    "pci.bus_id",
    "memory.total",
    "memory.used",
    "compute_mode",
    "persistence_mode",
    "mig.mode.current",
    "mig.mode.pending",
    "ecc.mode.current",
    "ecc.errors.uncorrected.volatile.total",
    "ecc.errors.uncorrected.aggregate.total",
    "retired_pages.pending",
    "temperature.gpu",
    "power.draw",
    "power.limit",
    "clocks_event_reasons.active",
)
# Drivers before 535 only know the older name of the throttle bitmask.
LEGACY_FIELD_NAMES = {"clocks_event_reasons.active": "clocks_throttle_reasons.active"}
_FIELD_ALIASES = {
    "gpu_uuid": "uuid",
    "gpu_name": "name",
    "gpu_bus_id": "pci.bus_id",
    "clocks_throttle_reasons.active": "clocks_event_reasons.active",
    "enforced.power.limit": "power.limit",
}
_MISSING_VALUES = frozenset(
    (
        "",
        "n/a",
        "[n/a]",
        "not supported",
        "[not supported]",
        "unknown error",
        "[unknown error]",
        "[gpu is lost]",
        "gpu is lost",
        "[insufficient permissions]",
        "none",
    )
)

# NVML clocks event (throttle) reason bits, nvml.h; names as nvidia-smi -q -x spells them.
CLOCKS_EVENT_REASONS = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clocks_setting"),
)
COMPUTE_MODES = {0: "Default", 1: "Exclusive_Thread", 2: "Prohibited", 3: "Exclusive_Process"}

# NVML return codes (nvml.h) that name a host state rather than a bug.
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18

ERROR_NOT_INSTALLED = "not_installed"
ERROR_DRIVER_NOT_LOADED = "driver_not_loaded"
ERROR_VERSION_MISMATCH = "version_mismatch"
ERROR_NO_DEVICES = "no_devices"
ERROR_TIMEOUT = "timeout"
ERROR_NVML_INIT = "nvml_init_failed"
ERROR_INVALID_FIELD = "invalid_field"
ERROR_COMMAND_FAILED = "command_failed"
ERROR_PARSE = "parse_error"

ADVICE = {
    ERROR_NOT_INSTALLED: "install the NVIDIA driver utilities (nvidia-smi) or nvidia-ml-py, or set nvidia_smi_path",
    ERROR_DRIVER_NOT_LOADED: "load the nvidia kernel module (modprobe nvidia) or reboot; check dmesg for NVRM errors",
    ERROR_VERSION_MISMATCH: (
        "the loaded kernel module and the user-space NVML library are different versions; "
        "reboot the node or reload the nvidia kernel modules"
    ),
    ERROR_NO_DEVICES: "no GPU answered the driver; check lspci, the PCI passthrough and dmesg for NVRM errors",
    ERROR_TIMEOUT: "nvidia-smi hung; a GPU may be wedged (check dmesg for Xid errors) and the node may need a reset",
}

SOURCE_NVML = "nvml"
SOURCE_NVIDIA_SMI = "nvidia-smi"
SOURCE_NONE = "none"


class CommandResult(NamedTuple):
    rc: int
    stdout: str
    stderr: str
    timed_out: bool = False


# Runs argv with a timeout in seconds; never raises.
CommandRunner = Callable[[Sequence[str], float], CommandResult]


# --- Structure ------------------------------------------------------------------------------------------------------


def empty_facts() -> Dict[str, Any]:
    return {
        "source": SOURCE_NONE,
        "error_kind": None,
        "error": None,
        "advice": None,
        "driver_version": None,
        "cuda_driver_version": None,
        "nvml_version": None,
        "kernel_module": {"loaded": False, "version": None},
        "gpu_count": 0,
        "gpus": [],
        "healthy": False,
        "problems": [],
        "kernel_log": {"source": "none", "error": None},
        "xid_errors": [],
    }


def empty_gpu() -> Dict[str, Any]:
    return {
        "index": None,
        "uuid": None,
        "name": None,
        "pci_bus_id": None,
        "pci_device_id": None,
        "pci_sub_system_id": None,
        "memory_total_mib": None,
        "memory_used_mib": None,
        "mig_mode_current": None,
        "mig_mode_pending": None,
        "mig_devices": [],
        "compute_mode": None,
        "persistence_mode": None,
        "ecc_mode_current": None,
        "ecc_errors_uncorrected_volatile": None,
        "ecc_errors_uncorrected_aggregate": None,
        "retired_pages_pending": None,
        "remapped_rows_pending": None,
        "remapped_rows_failure": None,
        "temperature_c": None,
        "power_draw_w": None,
        "power_limit_w": None,
        "clocks_event_reasons": None,
    }


def empty_mig_device() -> Dict[str, Any]:
    return {
        "index": None,
        "uuid": None,
        "profile": None,
        "gpu_instance_id": None,
        "compute_instance_id": None,
        "memory_total_mib": None,
        "memory_used_mib": None,
    }


# --- Value parsers --------------------------------------------------------------------------------------------------


def clean(value: Optional[str]) -> Optional[str]:
    """Strip a value; None for the placeholders nvidia-smi prints when it has no answer."""
    if value is None:
        return None
    text = value.strip()
    if text.lower() in _MISSING_VALUES:
        return None
    return text


def _number_text(value: Optional[str]) -> Optional[str]:
    text = clean(value)
    if text is None:
        return None
    # Units appear in XML and in CSV without nounits: "81920 MiB", "67.03 W", "27 C".
    match = re.match(r"^([-+]?[0-9]+(?:\.[0-9]+)?)(?:\s*(?:MiB|W|C|%|MHz|mV))?$", text)
    return match.group(1) if match else None


def to_int(value: Optional[str]) -> Optional[int]:
    text = _number_text(value)
    if text is None:
        return None
    try:
        return int(float(text)) if "." in text else int(text)
    except (ValueError, OverflowError):
        return None


def to_float(value: Optional[str]) -> Optional[float]:
    text = _number_text(value)
    if text is None:
        return None
    try:
        number = float(text)
    except (ValueError, OverflowError):
        return None
    return number if number == number and abs(number) != float("inf") else None


def to_mode(value: Optional[str]) -> Optional[str]:
    """Enabled/Disabled (any case) -> enabled/disabled; anything else -> None."""
    text = clean(value)
    if text is None:
        return None
    lowered = text.lower()
    return lowered if lowered in ("enabled", "disabled") else None


def to_yes_no(value: Optional[str]) -> Optional[bool]:
    text = clean(value)
    if text is None:
        return None
    lowered = text.lower()
    if lowered in ("yes", "true", "1"):
        return True
    if lowered in ("no", "false", "0"):
        return False
    return None


def decode_clocks_event_reasons(mask: Optional[int]) -> Optional[List[str]]:
    """NVML bitmask -> reason names; unknown bits are reported as hex so nothing is silently dropped."""
    if mask is None or mask < 0:
        return None
    names = [name for bit, name in CLOCKS_EVENT_REASONS if mask & bit]
    known = 0
    for bit, _name in CLOCKS_EVENT_REASONS:
        known |= bit
    if mask & ~known:
        names.append("unknown_0x{0:x}".format(mask & ~known))
    return names


def parse_clocks_event_mask(value: Optional[str]) -> Optional[List[str]]:
    text = clean(value)
    if text is None:
        return None
    try:
        mask = int(text, 16) if text.lower().startswith("0x") else int(text)
    except ValueError:
        return None
    return decode_clocks_event_reasons(mask)


def driver_branch(version: Optional[str]) -> Optional[str]:
    if not version:
        return None
    match = re.match(r"^([0-9]+)\.", version.strip())
    return match.group(1) if match else None


def cuda_version_from_int(value: Optional[int]) -> Optional[str]:
    """NVML reports the CUDA driver version as 1000 * major + 10 * minor (12020 -> 12.2)."""
    if value is None or value <= 0:
        return None
    return "{0}.{1}".format(value // 1000, (value % 1000) // 10)


# --- Error messages -------------------------------------------------------------------------------------------------


def classify_output(text: Optional[str]) -> Tuple[Optional[str], Optional[str]]:
    """Return (error_kind, message) for what nvidia-smi prints when it fails; (None, None) when nothing matches."""
    if not text:
        return None, None
    lowered = text.lower()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    message = " ".join(lines)[:500] or None
    # Sources render the apostrophe of "couldn't" differently, so match the words after it.
    if "communicate with the nvidia driver" in lowered:
        return ERROR_DRIVER_NOT_LOADED, message
    if "driver/library version mismatch" in lowered:
        return ERROR_VERSION_MISMATCH, message
    if "no devices were found" in lowered:
        return ERROR_NO_DEVICES, message
    if "is not a valid field to query" in lowered:
        return ERROR_INVALID_FIELD, message
    if "failed to initialize nvml" in lowered:
        return ERROR_NVML_INIT, message
    return None, None


def parse_nvml_library_version(text: Optional[str]) -> Optional[str]:
    """The second line of a version mismatch: "NVML library version: 570.124"."""
    if not text:
        return None
    match = re.search(r"NVML library version:\s*([0-9]+(?:\.[0-9]+)*)", text)
    return match.group(1) if match else None


# --- CSV (--query-gpu ... --format=csv,noheader,nounits) ------------------------------------------------------------


def _field_name(column: str) -> str:
    # A header line carries units: "memory.used [MiB]".
    name = re.sub(r"\s*\[[^\]]*\]\s*$", "", column.strip()).lower()
    return _FIELD_ALIASES.get(name, name)


def _looks_like_header(cells: Sequence[str]) -> bool:
    names = {_field_name(cell) for cell in cells}
    return bool(names & set(QUERY_FIELDS)) and not any(re.match(r"^[0-9]+$", cell.strip()) for cell in cells)


def pci_id(value: Any) -> Optional[str]:
    """A PCI id (device << 16 | vendor) as nvidia-smi's --query-gpu prints pci.device_id and mig-parted's
    device-filter names it: "0x233010DE". From NVML's nvmlPciInfo_t (an int), the XML's bare "233010DE" or the
    query's "0x233010DE"; None when absent or not an id."""
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    else:
        text = (clean(value) or "") if isinstance(value, str) else ""
        text = text[2:] if text[:2].lower() == "0x" else text
        if not re.fullmatch(r"[0-9A-Fa-f]{1,8}", text):
            return None
        number = int(text, 16)
    return "0x%08X" % number if 0 <= number <= 0xFFFFFFFF else None


def csv_row_to_gpu(row: Mapping[str, str]) -> Dict[str, Any]:
    gpu = empty_gpu()
    gpu["index"] = to_int(row.get("index"))
    gpu["uuid"] = clean(row.get("uuid"))
    gpu["name"] = clean(row.get("name"))
    gpu["pci_bus_id"] = clean(row.get("pci.bus_id"))
    gpu["memory_total_mib"] = to_int(row.get("memory.total"))
    gpu["memory_used_mib"] = to_int(row.get("memory.used"))
    gpu["compute_mode"] = clean(row.get("compute_mode"))
    gpu["persistence_mode"] = to_mode(row.get("persistence_mode"))
    gpu["mig_mode_current"] = to_mode(row.get("mig.mode.current"))
    gpu["mig_mode_pending"] = to_mode(row.get("mig.mode.pending"))
    gpu["ecc_mode_current"] = to_mode(row.get("ecc.mode.current"))
    gpu["ecc_errors_uncorrected_volatile"] = to_int(row.get("ecc.errors.uncorrected.volatile.total"))
    gpu["ecc_errors_uncorrected_aggregate"] = to_int(row.get("ecc.errors.uncorrected.aggregate.total"))
    gpu["retired_pages_pending"] = to_yes_no(row.get("retired_pages.pending"))
    gpu["temperature_c"] = to_int(row.get("temperature.gpu"))
    gpu["power_draw_w"] = to_float(row.get("power.draw"))
    gpu["power_limit_w"] = to_float(row.get("power.limit"))
    gpu["clocks_event_reasons"] = parse_clocks_event_mask(row.get("clocks_event_reasons.active"))
    return gpu


def parse_query_csv(
    text: Optional[str], fields: Sequence[str] = QUERY_FIELDS
) -> Tuple[List[Dict[str, Any]], Optional[str], Optional[str]]:
    """Return (gpus, driver_version, problem) from CSV output; problem says why rows were skipped.

    Columns are taken from a header line when there is one, else from `fields`. GPU names hold no commas, so a plain
    split is exact; a row with the wrong number of cells is skipped and reported rather than guessed at.
    """
    gpus = []  # type: List[Dict[str, Any]]
    driver_versions = []  # type: List[str]
    skipped = 0
    columns = [_field_name(field) for field in fields]
    if not text:
        return gpus, None, None
    for line_number, line in enumerate(text.splitlines()):
        if not line.strip():
            continue
        cells = [cell.strip() for cell in line.split(",")]
        if line_number == 0 and _looks_like_header(cells):
            columns = [_field_name(cell) for cell in cells]
            continue
        if len(cells) != len(columns):
            skipped += 1
            continue
        row = dict(zip(columns, cells))
        gpus.append(csv_row_to_gpu(row))
        version = clean(row.get("driver_version"))
        if version:
            driver_versions.append(version)
    problem = None
    if skipped:
        problem = "{0} line(s) of nvidia-smi CSV output did not have {1} columns".format(skipped, len(columns))
    return gpus, (driver_versions[0] if driver_versions else None), problem


# --- XML (nvidia-smi -q -x) -----------------------------------------------------------------------------------------


def _text(element: Optional[ET.Element], path: str) -> Optional[str]:
    if element is None:
        return None
    found = element.find(path)
    if found is None or found.text is None:
        return None
    return found.text


def _sum_uncorrectable(section: Optional[ET.Element]) -> Optional[int]:
    """Uncorrected ECC errors in a <volatile> or <aggregate> block, across the XML layouts of several drivers."""
    if section is None:
        return None
    # Before DTD v11: <double_bit><total>; 4xx drivers: <total> next to per-unit counters; v12+: *_uncorrectable*.
    for path in ("double_bit/total", "total"):
        value = _text(section, path)
        if value is not None:
            return to_int(value)
    values = [to_int(child.text) for child in section if "uncorrectable" in child.tag]
    known = [value for value in values if value is not None]
    return sum(known) if known else None


def _clocks_event_reasons_from_xml(gpu_element: ET.Element) -> Optional[List[str]]:
    for block_tag, prefix in (
        ("clocks_event_reasons", "clocks_event_reason_"),
        ("clocks_throttle_reasons", "clocks_throttle_reason_"),
    ):
        block = gpu_element.find(block_tag)
        if block is None:
            continue
        states = [(child.tag[len(prefix) :], clean(child.text)) for child in block if child.tag.startswith(prefix)]
        if not states or all(state is None for _name, state in states):
            return None
        return [name for name, state in states if state is not None and state.lower() == "active"]
    return None


# Newer drivers (590.44.01 and 595.58.03 in telegraf's recordings) print <average_power_draw> and <instant_power_draw>
# where <power_draw> was. The CSV power.draw and NVML's nvmlDeviceGetPowerUsage (the NVML path here) return the 1 s
# average on Ampere and newer except GA100, and the instantaneous reading on GA100 and older, which have no average
# ("N/A"). Average first, then instant, keeps all three paths reporting the same quantity on every GPU.
_POWER_DRAW_TAGS = ("power_draw", "average_power_draw", "instant_power_draw")


def _power_draw_from_xml(gpu_element: ET.Element, block: str) -> Optional[float]:
    for tag in _POWER_DRAW_TAGS:
        watts = to_float(_text(gpu_element, block + "/" + tag))
        if watts is not None:
            return watts
    return None


def _mig_devices_from_xml(gpu_element: ET.Element) -> List[Dict[str, Any]]:
    devices = []
    for element in gpu_element.findall("mig_devices/mig_device"):
        device = empty_mig_device()
        device["index"] = to_int(_text(element, "index"))
        device["uuid"] = clean(_text(element, "uuid"))
        device["gpu_instance_id"] = to_int(_text(element, "gpu_instance_id"))
        device["compute_instance_id"] = to_int(_text(element, "compute_instance_id"))
        device["memory_total_mib"] = to_int(_text(element, "fb_memory_usage/total"))
        device["memory_used_mib"] = to_int(_text(element, "fb_memory_usage/used"))
        devices.append(device)
    return devices


def xml_gpu(gpu_element: ET.Element, index: int) -> Dict[str, Any]:
    gpu = empty_gpu()
    # -q -x has no index element; GPUs are listed in nvidia-smi's index order (PCI bus order).
    gpu["index"] = index
    gpu["uuid"] = clean(_text(gpu_element, "uuid"))
    gpu["name"] = clean(_text(gpu_element, "product_name"))
    gpu["pci_bus_id"] = clean(_text(gpu_element, "pci/pci_bus_id")) or clean(gpu_element.get("id"))
    gpu["pci_device_id"] = pci_id(_text(gpu_element, "pci/pci_device_id"))
    gpu["pci_sub_system_id"] = pci_id(_text(gpu_element, "pci/pci_sub_system_id"))
    gpu["memory_total_mib"] = to_int(_text(gpu_element, "fb_memory_usage/total"))
    gpu["memory_used_mib"] = to_int(_text(gpu_element, "fb_memory_usage/used"))
    gpu["mig_mode_current"] = to_mode(_text(gpu_element, "mig_mode/current_mig"))
    gpu["mig_mode_pending"] = to_mode(_text(gpu_element, "mig_mode/pending_mig"))
    gpu["mig_devices"] = _mig_devices_from_xml(gpu_element)
    gpu["compute_mode"] = clean(_text(gpu_element, "compute_mode"))
    gpu["persistence_mode"] = to_mode(_text(gpu_element, "persistence_mode"))
    gpu["ecc_mode_current"] = to_mode(_text(gpu_element, "ecc_mode/current_ecc"))
    gpu["ecc_errors_uncorrected_volatile"] = _sum_uncorrectable(gpu_element.find("ecc_errors/volatile"))
    gpu["ecc_errors_uncorrected_aggregate"] = _sum_uncorrectable(gpu_element.find("ecc_errors/aggregate"))
    gpu["retired_pages_pending"] = to_yes_no(_text(gpu_element, "retired_pages/pending_retirement"))
    if gpu["retired_pages_pending"] is None:
        gpu["retired_pages_pending"] = to_yes_no(_text(gpu_element, "retired_pages/pending_blacklist"))
    gpu["remapped_rows_pending"] = to_yes_no(_text(gpu_element, "remapped_rows/remapped_row_pending"))
    gpu["remapped_rows_failure"] = to_yes_no(_text(gpu_element, "remapped_rows/remapped_row_failure"))
    gpu["temperature_c"] = to_int(_text(gpu_element, "temperature/gpu_temp"))
    # Drivers from 535 on moved power into <gpu_power_readings> and renamed the limit.
    for block in ("gpu_power_readings", "power_readings"):
        if gpu_element.find(block) is None:
            continue
        gpu["power_draw_w"] = _power_draw_from_xml(gpu_element, block)
        gpu["power_limit_w"] = to_float(
            _text(gpu_element, block + "/current_power_limit") or _text(gpu_element, block + "/power_limit")
        )
        break
    gpu["clocks_event_reasons"] = _clocks_event_reasons_from_xml(gpu_element)
    return gpu


def parse_query_xml(text: Optional[str]) -> Tuple[Optional[Dict[str, Any]], Optional[str]]:
    """Return ({driver_version, cuda_driver_version, gpus}, None) or (None, why it could not be read)."""
    if not text or not text.strip():
        return None, "nvidia-smi -q -x printed nothing"
    try:
        root = ET.fromstring(text)
    except (ET.ParseError, ValueError, LookupError, TypeError) as error:
        return None, "nvidia-smi -q -x output is not XML ({0})".format(error)
    if root.tag != "nvidia_smi_log":
        return None, "nvidia-smi -q -x output has root <{0}>, not <nvidia_smi_log>".format(root.tag)
    gpus = [xml_gpu(element, index) for index, element in enumerate(root.findall("gpu"))]
    return {
        "driver_version": clean(_text(root, "driver_version")),
        "cuda_driver_version": clean(_text(root, "cuda_version")),
        "gpus": gpus,
    }, None


def merge_gpus(primary: List[Dict[str, Any]], extra: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Fill the gaps of the CSV view from the XML view of the same GPUs, matched by UUID, then PCI bus id."""
    by_key = {}  # type: Dict[str, Dict[str, Any]]
    for gpu in extra:
        for key in (gpu.get("uuid"), gpu.get("pci_bus_id")):
            if key:
                by_key[key] = gpu
    merged = []
    for gpu in primary:
        other = by_key.get(gpu.get("uuid") or "") or by_key.get(gpu.get("pci_bus_id") or "")
        result = dict(gpu)
        if other is not None:
            for key, value in other.items():
                if key == "index":
                    continue
                if result.get(key) in (None, []) and value not in (None, []):
                    result[key] = value
        merged.append(result)
    return merged


# --- nvidia-smi collector -------------------------------------------------------------------------------------------


C_LOCALE = {"LC_ALL": "C", "LANG": "C"}


def run_with_timeout(argv: Sequence[str], timeout: float) -> CommandResult:
    """subprocess with a timeout (AnsibleModule.run_command has none); a hung nvidia-smi is killed, not waited on."""
    environment = dict(os.environ)
    environment.update(C_LOCALE)
    try:
        completed = subprocess.run(
            list(argv),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            timeout=timeout,
            env=environment,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return CommandResult(rc=-1, stdout="", stderr="", timed_out=True)
    except OSError as error:
        return CommandResult(rc=127, stdout="", stderr=str(error))
    return CommandResult(
        rc=completed.returncode,
        stdout=completed.stdout.decode("utf-8", errors="replace"),
        stderr=completed.stderr.decode("utf-8", errors="replace"),
    )


def query_argv(nvidia_smi: str, fields: Sequence[str] = QUERY_FIELDS) -> List[str]:
    return [nvidia_smi, "--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits"]


def xml_argv(nvidia_smi: str) -> List[str]:
    return [nvidia_smi, "-q", "-x"]


def _set_error(facts: Dict[str, Any], kind: str, message: Optional[str]) -> None:
    facts["error_kind"] = kind
    facts["error"] = message
    facts["advice"] = ADVICE.get(kind)


def _command_error(result: CommandResult, timeout: float, what: str) -> Optional[Tuple[str, str]]:
    """(kind, message) when a run failed; None when it succeeded."""
    if result.timed_out:
        return ERROR_TIMEOUT, "{0} did not finish within {1} s".format(what, timeout)
    kind, message = classify_output(result.stdout + "\n" + result.stderr)
    if kind is not None:
        return kind, message or ""
    if result.rc != 0:
        output = " ".join((result.stderr or result.stdout).split())[:500]
        return ERROR_COMMAND_FAILED, "{0} exited with {1}: {2}".format(what, result.rc, output or "no output")
    return None


def collect_nvidia_smi(nvidia_smi: Optional[str], runner: CommandRunner, timeout: float) -> Dict[str, Any]:
    """Facts from `nvidia-smi --query-gpu` (CSV) completed by `nvidia-smi -q -x` (CUDA version, MIG devices, rows)."""
    facts = empty_facts()
    if not nvidia_smi:
        _set_error(facts, ERROR_NOT_INSTALLED, "nvidia-smi was not found")
        return facts
    facts["source"] = SOURCE_NVIDIA_SMI

    fields = list(QUERY_FIELDS)
    result = runner(query_argv(nvidia_smi, fields), timeout)
    failure = _command_error(result, timeout, "nvidia-smi --query-gpu")
    if failure is not None and failure[0] == ERROR_INVALID_FIELD:
        fields = [LEGACY_FIELD_NAMES.get(field, field) for field in fields]
        result = runner(query_argv(nvidia_smi, fields), timeout)
        failure = _command_error(result, timeout, "nvidia-smi --query-gpu")
    if failure is not None:
        _set_error(facts, failure[0], failure[1])
        if failure[0] == ERROR_VERSION_MISMATCH:
            facts["nvml_version"] = parse_nvml_library_version(result.stdout + "\n" + result.stderr)
        return facts

    gpus, driver_version, csv_problem = parse_query_csv(result.stdout, fields)
    facts["driver_version"] = driver_version

    xml_result = runner(xml_argv(nvidia_smi), timeout)
    xml_failure = _command_error(xml_result, timeout, "nvidia-smi -q -x")
    # The XML only completes the CSV; when it cannot be read, the CSV facts stand with those gaps left null.
    xml_facts = None if xml_failure else parse_query_xml(xml_result.stdout)[0]
    if xml_facts is not None:
        facts["cuda_driver_version"] = xml_facts["cuda_driver_version"]
        facts["driver_version"] = facts["driver_version"] or xml_facts["driver_version"]
        gpus = merge_gpus(gpus, xml_facts["gpus"]) if gpus else xml_facts["gpus"]

    # The XML of older drivers names neither a MIG device's profile nor its UUID; `nvidia-smi -L` lists both.
    if any(gpu.get("mig_mode_current") == "enabled" for gpu in gpus):
        listed = runner([nvidia_smi, "-L"], timeout)
        if _command_error(listed, timeout, "nvidia-smi -L") is None:
            add_mig_names(gpus, parse_gpu_list(listed.stdout))

    facts["gpus"] = gpus
    facts["gpu_count"] = len(gpus)
    if csv_problem and not gpus:
        _set_error(facts, ERROR_PARSE, csv_problem)
    elif not gpus:
        _set_error(facts, ERROR_NO_DEVICES, "nvidia-smi listed no GPUs")
    return facts


def add_mig_names(gpus: List[Dict[str, Any]], listed: Sequence[Mapping[str, Any]]) -> None:
    """Profile and UUID of each MIG device from `nvidia-smi -L` (matched by GPU index and MIG device number); a GPU
    whose XML listed no MIG devices gets those of the list."""
    by_index = {entry["index"]: entry["mig_devices"] for entry in listed}
    for gpu in gpus:
        devices = by_index.get(gpu.get("index")) or []
        if not gpu.get("mig_devices"):
            gpu["mig_devices"] = [dict(empty_mig_device(), index=d["device"]) for d in devices]
        named = {d["device"]: d for d in devices}
        for device in gpu["mig_devices"]:
            entry = named.get(device.get("index"))
            if entry is not None:
                device["profile"] = device.get("profile") or entry["profile"]
                device["uuid"] = device.get("uuid") or entry["uuid"]


# --- NVML collector -------------------------------------------------------------------------------------------------


class NvmlUnavailable(Exception):
    """nvmlInit failed; carries the classified error so the caller can fall back and still report it."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


def _as_text(value: Any) -> Optional[str]:
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    return clean(str(value))


def classify_nvml_error(error: Exception) -> str:
    code = getattr(error, "value", None)
    if code == NVML_ERROR_LIB_RM_VERSION_MISMATCH:
        return ERROR_VERSION_MISMATCH
    if code == NVML_ERROR_DRIVER_NOT_LOADED:
        return ERROR_DRIVER_NOT_LOADED
    if code == NVML_ERROR_LIBRARY_NOT_FOUND:
        return ERROR_NOT_INSTALLED
    return ERROR_NVML_INIT


def _nvml_call(nvml: Any, function_name: str, *args: Any) -> Any:
    """One NVML query; None when the binding lacks it or the GPU does not support it."""
    function = getattr(nvml, function_name, None)
    if function is None:
        return None
    try:
        return function(*args)
    except Exception:  # NVMLError and its many generated subclasses; any one unanswered field is just missing.
        return None


def _mib(memory: Any, attribute: str) -> Optional[int]:
    value = getattr(memory, attribute, None) if memory is not None else None
    return int(value) // (1024 * 1024) if isinstance(value, int) else None


def _watts(milliwatts: Any) -> Optional[float]:
    return round(milliwatts / 1000.0, 2) if isinstance(milliwatts, int) else None


def _mode_from_int(value: Any) -> Optional[str]:
    if value == 1:
        return "enabled"
    if value == 0:
        return "disabled"
    return None


def _pair(value: Any) -> Tuple[Any, Any]:
    if isinstance(value, (tuple, list)) and len(value) == 2:
        return value[0], value[1]
    return None, None


def _nvml_mig_devices(nvml: Any, handle: Any) -> List[Dict[str, Any]]:
    devices = []
    slots = _nvml_call(nvml, "nvmlDeviceGetMaxMigDeviceCount", handle)
    for slot in range(slots if isinstance(slots, int) else 0):
        mig_handle = _nvml_call(nvml, "nvmlDeviceGetMigDeviceHandleByIndex", handle, slot)
        if mig_handle is None:
            continue  # an empty slot answers NVML_ERROR_NOT_FOUND
        device = empty_mig_device()
        device["index"] = len(devices)
        device["uuid"] = _as_text(_nvml_call(nvml, "nvmlDeviceGetUUID", mig_handle))
        # A MIG device's name is its GPU's with the profile: "NVIDIA A100-SXM4-40GB MIG 1g.5gb".
        name = _as_text(_nvml_call(nvml, "nvmlDeviceGetName", mig_handle)) or ""
        device["profile"] = name.rsplit(" MIG ", 1)[1].strip().lower() if " MIG " in name else None
        device["gpu_instance_id"] = _nvml_call(nvml, "nvmlDeviceGetGpuInstanceId", mig_handle)
        device["compute_instance_id"] = _nvml_call(nvml, "nvmlDeviceGetComputeInstanceId", mig_handle)
        memory = _nvml_call(nvml, "nvmlDeviceGetMemoryInfo", mig_handle)
        device["memory_total_mib"] = _mib(memory, "total")
        device["memory_used_mib"] = _mib(memory, "used")
        devices.append(device)
    return devices


def nvml_gpu(nvml: Any, index: int) -> Dict[str, Any]:
    gpu = empty_gpu()
    gpu["index"] = index
    handle = _nvml_call(nvml, "nvmlDeviceGetHandleByIndex", index)
    if handle is None:
        return gpu
    uncorrected = getattr(nvml, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1)
    gpu["uuid"] = _as_text(_nvml_call(nvml, "nvmlDeviceGetUUID", handle))
    gpu["name"] = _as_text(_nvml_call(nvml, "nvmlDeviceGetName", handle))
    pci = _nvml_call(nvml, "nvmlDeviceGetPciInfo", handle)
    gpu["pci_bus_id"] = _as_text(getattr(pci, "busId", None))
    gpu["pci_device_id"] = pci_id(getattr(pci, "pciDeviceId", None))
    gpu["pci_sub_system_id"] = pci_id(getattr(pci, "pciSubSystemId", None))
    memory = _nvml_call(nvml, "nvmlDeviceGetMemoryInfo", handle)
    gpu["memory_total_mib"] = _mib(memory, "total")
    gpu["memory_used_mib"] = _mib(memory, "used")
    current, pending = _pair(_nvml_call(nvml, "nvmlDeviceGetMigMode", handle))
    gpu["mig_mode_current"] = _mode_from_int(current)
    gpu["mig_mode_pending"] = _mode_from_int(pending)
    if gpu["mig_mode_current"] == "enabled":
        gpu["mig_devices"] = _nvml_mig_devices(nvml, handle)
    gpu["compute_mode"] = COMPUTE_MODES.get(_nvml_call(nvml, "nvmlDeviceGetComputeMode", handle))
    gpu["persistence_mode"] = _mode_from_int(_nvml_call(nvml, "nvmlDeviceGetPersistenceMode", handle))
    gpu["ecc_mode_current"] = _mode_from_int(_pair(_nvml_call(nvml, "nvmlDeviceGetEccMode", handle))[0])
    gpu["ecc_errors_uncorrected_volatile"] = _nvml_call(
        nvml, "nvmlDeviceGetTotalEccErrors", handle, uncorrected, getattr(nvml, "NVML_VOLATILE_ECC", 0)
    )
    gpu["ecc_errors_uncorrected_aggregate"] = _nvml_call(
        nvml, "nvmlDeviceGetTotalEccErrors", handle, uncorrected, getattr(nvml, "NVML_AGGREGATE_ECC", 1)
    )
    retired_pending = _nvml_call(nvml, "nvmlDeviceGetRetiredPagesPendingStatus", handle)
    gpu["retired_pages_pending"] = bool(retired_pending) if isinstance(retired_pending, int) else None
    remapped = _nvml_call(nvml, "nvmlDeviceGetRemappedRows", handle)
    if isinstance(remapped, (tuple, list)) and len(remapped) == 4:
        gpu["remapped_rows_pending"] = bool(remapped[2])
        gpu["remapped_rows_failure"] = bool(remapped[3])
    gpu["temperature_c"] = _nvml_call(
        nvml, "nvmlDeviceGetTemperature", handle, getattr(nvml, "NVML_TEMPERATURE_GPU", 0)
    )
    gpu["power_draw_w"] = _watts(_nvml_call(nvml, "nvmlDeviceGetPowerUsage", handle))
    gpu["power_limit_w"] = _watts(_nvml_call(nvml, "nvmlDeviceGetEnforcedPowerLimit", handle))
    mask = _nvml_call(nvml, "nvmlDeviceGetCurrentClocksEventReasons", handle)
    if mask is None:
        mask = _nvml_call(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", handle)
    gpu["clocks_event_reasons"] = decode_clocks_event_reasons(mask if isinstance(mask, int) else None)
    return gpu


def collect_nvml(nvml: Any) -> Dict[str, Any]:
    """Facts through an NVML binding (pynvml from nvidia-ml-py); raises NvmlUnavailable when nvmlInit fails."""
    try:
        nvml.nvmlInit()
    except Exception as error:  # pynvml raises a generated NVMLError subclass per return code
        raise NvmlUnavailable(classify_nvml_error(error), "NVML initialisation failed: {0}".format(error))
    try:
        facts = empty_facts()
        facts["source"] = SOURCE_NVML
        facts["driver_version"] = _as_text(_nvml_call(nvml, "nvmlSystemGetDriverVersion"))
        facts["nvml_version"] = _as_text(_nvml_call(nvml, "nvmlSystemGetNVMLVersion"))
        cuda = _nvml_call(nvml, "nvmlSystemGetCudaDriverVersion")
        facts["cuda_driver_version"] = cuda_version_from_int(cuda if isinstance(cuda, int) else None)
        count = _nvml_call(nvml, "nvmlDeviceGetCount")
        gpus = [nvml_gpu(nvml, index) for index in range(count if isinstance(count, int) else 0)]
        facts["gpus"] = gpus
        facts["gpu_count"] = len(gpus)
        if not gpus:
            _set_error(facts, ERROR_NO_DEVICES, "NVML reports no GPUs")
        return facts
    finally:
        _nvml_call(nvml, "nvmlShutdown")


# --- Decisions ------------------------------------------------------------------------------------------------------


def _gpu_label(gpu: Mapping[str, Any]) -> str:
    return "GPU {0} ({1})".format(gpu.get("index"), gpu.get("uuid") or gpu.get("pci_bus_id") or "unknown id")


def find_problems(
    facts: Mapping[str, Any],
    expected_gpu_count: Optional[int] = None,
    expected_driver_branch: Optional[str] = None,
    expected_product: Optional["re.Pattern[str]"] = None,
    expected_mig_mode: Optional[str] = None,
) -> List[str]:
    """Every unmet expectation and every unhealthy GPU state, each naming what was expected and what was found."""
    problems = []  # type: List[str]
    if facts.get("error_kind"):
        problems.append(
            "expected a working GPU stack, found {0}: {1}".format(facts["error_kind"], facts.get("error") or "")
        )
    gpus = list(facts.get("gpus") or [])
    if expected_gpu_count is not None and len(gpus) != expected_gpu_count:
        problems.append("expected {0} GPU(s), found {1}".format(expected_gpu_count, len(gpus)))
    if expected_driver_branch:
        branch = driver_branch(facts.get("driver_version"))
        if branch != str(expected_driver_branch).strip():
            problems.append(
                "expected driver branch {0}, found {1}".format(
                    expected_driver_branch, facts.get("driver_version") or "no driver version"
                )
            )
    for gpu in gpus:
        label = _gpu_label(gpu)
        if expected_product is not None and not expected_product.search(gpu.get("name") or ""):
            problems.append(
                "{0}: expected a product matching {1!r}, found {2!r}".format(
                    label, expected_product.pattern, gpu.get("name")
                )
            )
        if expected_mig_mode:
            current = gpu.get("mig_mode_current")
            # A GPU without MIG support is effectively in disabled mode.
            effective = current or "disabled"
            if effective != expected_mig_mode:
                found = current or "not supported"
                if gpu.get("mig_mode_pending") == expected_mig_mode:
                    found += " (" + expected_mig_mode + " is pending; reset the GPU or reboot)"
                problems.append("{0}: expected MIG mode {1}, found {2}".format(label, expected_mig_mode, found))
        for key, what in (
            ("ecc_errors_uncorrected_volatile", "since the driver loaded"),
            ("ecc_errors_uncorrected_aggregate", "over the GPU's lifetime"),
        ):
            count = gpu.get(key)
            if isinstance(count, int) and count > 0:
                problems.append("{0}: expected 0 uncorrected ECC errors {1}, found {2}".format(label, what, count))
        if gpu.get("retired_pages_pending"):
            problems.append(
                "{0}: expected no pages pending retirement, found some; reboot to retire them".format(label)
            )
        if gpu.get("remapped_rows_pending"):
            problems.append("{0}: expected no pending row remapping, found one; reset the GPU or reboot".format(label))
        if gpu.get("remapped_rows_failure"):
            problems.append(
                "{0}: expected row remapping to work, found a remapping failure; replace the GPU".format(label)
            )
    return problems


# --- Gathering ------------------------------------------------------------------------------------------------------


def gather_gpu_facts(
    nvml: Any,
    nvidia_smi: Optional[str],
    runner: CommandRunner = run_with_timeout,
    timeout: float = 30.0,
    root: str = "/",
) -> Dict[str, Any]:
    """NVML when a binding is given and initialises; nvidia-smi otherwise. Adds the kernel module state."""
    nvml_failure = None  # type: Optional[NvmlUnavailable]
    facts = None  # type: Optional[Dict[str, Any]]
    if nvml is not None:
        try:
            facts = collect_nvml(nvml)
        except NvmlUnavailable as failure:
            nvml_failure = failure
    if facts is None:
        facts = collect_nvidia_smi(nvidia_smi, runner, timeout)
        # Without nvidia-smi, NVML's own answer (a missing library aside) says more than "not installed".
        if (
            facts["error_kind"] == ERROR_NOT_INSTALLED
            and nvml_failure is not None
            and nvml_failure.kind != ERROR_NOT_INSTALLED
        ):
            facts["source"] = SOURCE_NVML
            _set_error(facts, nvml_failure.kind, nvml_failure.message)

    loaded_version, _flavour = read_loaded_driver(root)
    facts["kernel_module"] = {
        "loaded": os.path.isdir(os.path.join(root, "sys/module/nvidia")),
        "version": loaded_version,
    }
    return facts
