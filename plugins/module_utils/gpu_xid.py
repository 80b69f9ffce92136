# -*- coding: utf-8 -*-
# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)
"""The NVIDIA driver's Xid reports in a host's kernel log: read, parsed and tied to the GPUs the facts module found.

The driver reports GPU faults to the kernel log as one line each, for example (recorded on real hosts; the
documentation of the codes is NVIDIA's "Xid Errors" guide):

    NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0)
    NVRM: Xid (PCI:0000:cb:00): 109, pid=1797828, name=pt_main_thread, Ch 00000008, errorString CTX SWITCH TIMEOUT
    NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, reset gpu to activate.
    NVRM: Xid (PCI:0000:44:00): 79, pid=..., GPU has fallen off the bus.

and newer drivers also report a GPU that fell off the bus without an Xid line, over several lines:

    NVRM: The NVIDIA GPU 0000:b3:00.0
    NVRM: (PCI ID: 10de:26b5) installed in this system has
    NVRM: fallen off the bus and is not responding to commands.

Some codes are the application's fault, not the GPU's (an illegal instruction, a page fault in the program, a
context-switch timeout of a hung kernel): the NVIDIA device plugin leaves 13, 31, 43, 45, 68 and 109 out of its
health checks by default, and so does this file (APPLICATION_XIDS); the caller may choose otherwise.
"""

from __future__ import absolute_import, annotations, division, print_function

import re
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

APPLICATION_XIDS = (13, 31, 43, 45, 68, 109)
# What a few hardware codes mean (NVIDIA's Xid guide), for the problem a person reads; others are named by number.
XID_NAMES = {
    48: "double bit ECC error",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recorded",
    64: "ECC page retirement or row remapping failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}

_BUS = r"(?:[0-9A-Fa-f]{4,8}:)?[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-9A-Fa-f])?"
XID_LINE = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<bus>" + _BUS + r")\): (?P<xid>\d+)(?:, *(?P<detail>.*))?$")
FALLEN_FIRST = re.compile(r"NVRM: The NVIDIA GPU (?P<bus>" + _BUS + r")\s*$")
FALLEN_LATER = re.compile(r"NVRM: fallen off the bus")
# A leading timestamp: journalctl -o short-iso (2026-12-06T04:11:22+0000) or dmesg --time-format iso
# (2026-12-06T04:11:22,123456+00:00); the rest of the prefix (host, "kernel:") is dropped.
TIMESTAMP = re.compile(r"^(?P<time>\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?)\s")

KERNEL_LOG_SOURCES = ("auto", "journal", "dmesg", "file", "none")
JOURNAL_ARGV = ["journalctl", "--dmesg", "--boot", "--output", "short-iso", "--no-pager", "--quiet"]
DMESG_ARGV = ["dmesg", "--time-format", "iso"]


def bus_key(bus_id: Optional[str]) -> Optional[str]:
    """One spelling for a PCI address: the driver's 0000:cb:00 and nvidia-smi's 00000000:CB:00.0 both give
    0000:cb:00 (domain as four digits, bus, device; the function is left out)."""
    if not bus_id:
        return None
    match = re.match(r"^(?:([0-9A-Fa-f]{4,8}):)?([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})(?:\.[0-9A-Fa-f])?$", bus_id.strip())
    if not match:
        return None
    domain = (match.group(1) or "0000")[-4:]
    return "{0}:{1}:{2}".format(domain, match.group(2), match.group(3)).lower()


def parse_kernel_log(text: str) -> List[Dict[str, Any]]:
    """Every Xid report in the text, in order: xid, pci_bus_id (as the driver printed it), time (or null), detail,
    line. A multi-line "fallen off the bus" report without an Xid line counts as Xid 79."""
    found: List[Dict[str, Any]] = []
    pending_fall: Optional[Tuple[str, Optional[str], str]] = None
    for raw in text.splitlines():
        line = raw.rstrip()
        stamp = TIMESTAMP.match(line)
        time = stamp.group("time") if stamp else None
        body = line[line.find("NVRM:"):] if "NVRM:" in line else ""
        if not body:
            continue
        match = XID_LINE.search(body)
        if match:
            found.append({"xid": int(match.group("xid")), "pci_bus_id": match.group("bus"), "time": time,
                          "detail": (match.group("detail") or "").strip(), "line": line})
            continue
        first = FALLEN_FIRST.search(body)
        if first:
            pending_fall = (first.group("bus"), time, line)
            continue
        if pending_fall and FALLEN_LATER.search(body):
            bus, first_time, first_line = pending_fall
            found.append({"xid": 79, "pci_bus_id": bus, "time": first_time,
                          "detail": "GPU has fallen off the bus (reported without an Xid line)", "line": first_line})
            pending_fall = None
    return found


def attach_gpus(reports: Iterable[Mapping[str, Any]], gpus: Sequence[Mapping[str, Any]],
                application_xids: Iterable[int] = APPLICATION_XIDS) -> List[Dict[str, Any]]:
    """The reports with gpu_index (the GPU at that PCI address, or null: a GPU the driver no longer lists) and
    application (true for a code of the program's own making)."""
    by_bus = {bus_key(gpu.get("pci_bus_id")): gpu.get("index") for gpu in gpus if bus_key(gpu.get("pci_bus_id"))}
    ignored = set(application_xids)
    out = []
    for report in reports:
        entry = dict(report)
        entry["gpu_index"] = by_bus.get(bus_key(report.get("pci_bus_id")))
        entry["application"] = entry["xid"] in ignored
        out.append(entry)
    return out


def xid_problems(reports: Iterable[Mapping[str, Any]]) -> List[str]:
    """One problem per GPU and code (the first report's time and detail; the count when it repeats), leaving out the
    application's codes."""
    grouped: Dict[Tuple[Any, str, int], List[Mapping[str, Any]]] = {}
    for report in reports:
        if report.get("application"):
            continue
        key = (report.get("gpu_index"), str(report.get("pci_bus_id")), int(report["xid"]))
        grouped.setdefault(key, []).append(report)
    problems = []
    for (index, bus, xid), same in grouped.items():
        first = same[0]
        where = "GPU {0} ({1})".format(index, bus) if index is not None else "the GPU at {0} (not listed now)".format(bus)
        name = XID_NAMES.get(xid)
        problems.append("{0}: expected no GPU Xid error since boot, found Xid {1}{2}{3}{4}{5}".format(
            where, xid, " ({0})".format(name) if name else "", " {0} times".format(len(same)) if len(same) > 1 else "",
            ", first at {0}".format(first["time"]) if first.get("time") else "",
            ": {0}".format(first["detail"]) if first.get("detail") else ""))
    return problems


Runner = Callable[[Sequence[str], float], Any]


def read_kernel_log(source: str, runner: Runner, timeout: float, path: Optional[str] = None,
                    which: Callable[[str], Optional[str]] = lambda name: None) -> Tuple[str, Optional[str], Optional[str]]:
    """(the source used, its text or None, why it could not be read or None). source: auto (the journal where
    journalctl exists, else dmesg), journal, dmesg, file (path) or none."""
    if source == "none":
        return "none", None, None
    if source == "file":
        try:
            with open(path or "", "r", encoding="utf-8", errors="replace") as handle:
                return "file", handle.read(), None
        except OSError as error:
            return "file", None, "cannot read the kernel log {0}: {1}".format(path, error)
    if source == "auto":
        source = "journal" if which("journalctl") else "dmesg"
    argv = list(JOURNAL_ARGV if source == "journal" else DMESG_ARGV)
    tool = which(argv[0])
    if not tool:
        return source, None, "{0} is not installed".format(argv[0])
    result = runner([tool] + argv[1:], timeout)
    if getattr(result, "timed_out", False):
        return source, None, "{0} did not answer within {1} s".format(argv[0], timeout)
    if result.rc != 0:
        return source, None, "{0} failed (rc={1}): {2}".format(argv[0], result.rc, (result.stderr or result.stdout or "").strip()[:300])
    return source, result.stdout or "", None
