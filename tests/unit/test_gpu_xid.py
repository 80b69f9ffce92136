"""plugins/module_utils/gpu_xid.py and nvidia_gpu_facts' kernel log options: the driver's Xid reports read from the
kernel log, tied to the GPUs by PCI address, and the hardware ones reported as problems."""

from __future__ import annotations

from pathlib import Path
from typing import List, Sequence

import pytest

from ansible_collections.gpu_ops.cluster.plugins.module_utils import gpu_xid
from ansible_collections.gpu_ops.cluster.plugins.module_utils.nvidia_gpu import CommandResult, parse_query_csv

FIXTURES = Path(__file__).parent / "fixtures"


def fixture(name: str) -> str:
    lines = (FIXTURES / name).read_text(encoding="utf-8").splitlines()
    while lines and lines[0].startswith("#"):
        lines.pop(0)
    return "\n".join(lines) + "\n"


def h100_gpus() -> List[dict]:
    gpus, _, _ = parse_query_csv(fixture("nvidia_smi/synthetic-h100x8.csv"))
    return gpus


def test_recorded_dmesg_lines_give_each_xid_with_its_address_and_detail():
    reports = gpu_xid.parse_kernel_log(fixture("kernel_log/xid-dmesg-ctime.txt"))
    assert [(r["xid"], r["pci_bus_id"]) for r in reports] == [(13, "0000:cb:00")] * 3 + [(109, "0000:cb:00")]
    assert reports[3]["detail"].startswith("pid=1797828, name=pt_main_thread, Ch 00000008")
    assert reports[0]["time"] is None  # --ctime stamps are not ISO; the facts module asks for ISO


def test_application_xids_are_listed_but_no_problem():
    reports = gpu_xid.attach_gpus(gpu_xid.parse_kernel_log(fixture("kernel_log/xid-dmesg-ctime.txt")), h100_gpus())
    assert all(r["application"] for r in reports)
    assert gpu_xid.xid_problems(reports) == []
    # A user who counts them as faults says so.
    strict = gpu_xid.attach_gpus(reports, h100_gpus(), application_xids=())
    assert gpu_xid.xid_problems(strict) == [
        "the GPU at 0000:cb:00 (not listed now): expected no GPU Xid error since boot, found Xid 13 3 times: "
        "pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction "
        "Parameter",
        "the GPU at 0000:cb:00 (not listed now): expected no GPU Xid error since boot, found Xid 109: pid=1797828, "
        "name=pt_main_thread, Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005",
    ]


def test_a_gpu_fallen_off_the_bus_without_an_xid_line_counts_as_xid_79():
    reports = gpu_xid.parse_kernel_log(fixture("kernel_log/fallen-off-the-bus.txt"))
    assert [(r["xid"], r["pci_bus_id"]) for r in reports] == [(79, "0000:b3:00.0")]
    assert gpu_xid.bus_key(reports[0]["pci_bus_id"]) == "0000:b3:00"


def test_journal_reports_are_tied_to_the_gpus_and_name_gpu_code_count_and_time():
    reports = gpu_xid.attach_gpus(gpu_xid.parse_kernel_log(fixture("kernel_log/synthetic-journal-h100x8.txt")),
                                  h100_gpus())
    assert [(r["xid"], r["gpu_index"], r["application"]) for r in reports] == [
        (48, 0, False), (79, 3, False), (79, 3, False), (13, 5, True)]
    assert reports[0]["time"] == "2026-12-06T04:11:22+0000"
    assert gpu_xid.xid_problems(reports) == [
        "GPU 0 (0000:18:00): expected no GPU Xid error since boot, found Xid 48 (double bit ECC error), first at "
        "2026-12-06T04:11:22+0000: pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has been "
        "detected on GPU in the framebuffer at partition 6, subpartition 0.",
        "GPU 3 (0000:5d:00): expected no GPU Xid error since boot, found Xid 79 (GPU has fallen off the bus) 2 times, "
        "first at 2026-12-06T04:12:40+0000: pid=2368, name=python, GPU has fallen off the bus.",
    ]


@pytest.mark.parametrize(("given", "key"), [("00000000:5D:00.0", "0000:5d:00"), ("0000:5d:00", "0000:5d:00"),
                                            ("5d:00.0", "0000:5d:00"), ("", None), ("not a bus", None)])
def test_bus_addresses_of_the_driver_and_nvidia_smi_compare_equal(given, key):
    assert gpu_xid.bus_key(given) == key


class Runner:
    def __init__(self, result: CommandResult) -> None:
        self.result, self.calls = result, []

    def __call__(self, argv: Sequence[str], timeout: float) -> CommandResult:
        self.calls.append(list(argv))
        return self.result


def which(present: Sequence[str]):
    return lambda name: f"/usr/bin/{name}" if name in present else None


def test_auto_reads_the_journals_kernel_messages_since_boot_else_dmesg():
    runner = Runner(CommandResult(0, "2026-12-06T04:12:40+0000 h kernel: NVRM: Xid (PCI:0000:5d:00): 79, x\n", ""))
    source, text, error = gpu_xid.read_kernel_log("auto", runner, 5, which=which(["journalctl", "dmesg"]))
    assert (source, error) == ("journal", None) and "Xid" in text
    assert runner.calls[0] == ["/usr/bin/journalctl", "--dmesg", "--boot", "--output", "short-iso", "--no-pager",
                               "--quiet"]
    source, _, _ = gpu_xid.read_kernel_log("auto", runner, 5, which=which(["dmesg"]))
    assert source == "dmesg" and runner.calls[1] == ["/usr/bin/dmesg", "--time-format", "iso"]


def test_a_log_that_cannot_be_read_is_said_so_not_guessed(tmp_path):
    denied = Runner(CommandResult(1, "", "dmesg: read kernel buffer failed: Operation not permitted"))
    assert gpu_xid.read_kernel_log("dmesg", denied, 5, which=which(["dmesg"])) == (
        "dmesg", None, "dmesg failed (rc=1): dmesg: read kernel buffer failed: Operation not permitted")
    assert gpu_xid.read_kernel_log("journal", denied, 5, which=which([])) == (
        "journal", None, "journalctl is not installed")
    slow = Runner(CommandResult(0, "", "", timed_out=True))
    assert gpu_xid.read_kernel_log("journal", slow, 5, which=which(["journalctl"]))[2] == \
        "journalctl did not answer within 5 s"
    missing = tmp_path / "kern.log"
    source, text, error = gpu_xid.read_kernel_log("file", denied, 5, str(missing))
    assert source == "file" and text is None and error.startswith(f"cannot read the kernel log {missing}: ")
    missing.write_text("NVRM: Xid (PCI:0000:18:00): 48, DBE\n")
    assert gpu_xid.read_kernel_log("file", denied, 5, str(missing)) == ("file", "NVRM: Xid (PCI:0000:18:00): 48, DBE\n",
                                                                        None)
    assert gpu_xid.read_kernel_log("none", denied, 5) == ("none", None, None)
