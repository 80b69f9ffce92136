"""Unit tests for plugins/module_utils/nvidia_gpu.py and plugins/modules/nvidia_gpu_facts.py.

No GPU is needed. nvidia-smi is replaced by a runner double that answers with recorded outputs from
tests/unit/fixtures/nvidia_smi (sources in SOURCES.md there; files named synthetic-* are constructed), and NVML by a
fake binding object that answers the same calls pynvml does.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Dict, List, Optional, Sequence, Tuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible_collections.gpu_ops.cluster.plugins.module_utils.nvidia_gpu import (
    ADVICE,
    QUERY_FIELDS,
    CommandResult,
    add_mig_names,
    classify_output,
    collect_nvidia_smi,
    collect_nvml,
    cuda_version_from_int,
    decode_clocks_event_reasons,
    driver_branch,
    empty_facts,
    empty_gpu,
    find_problems,
    gather_gpu_facts,
    parse_clocks_event_mask,
    parse_nvml_library_version,
    parse_query_csv,
    parse_query_xml,
    pci_id,
    run_with_timeout,
    to_float,
    to_int,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest import ModuleRunner, load_ansible_module  # noqa: E402  (the directory is on sys.path only now)

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "nvidia_smi"
SMI = "/usr/bin/nvidia-smi"


def fixture_text(name: str) -> str:
    """The recorded output without the leading `#` source lines."""
    lines = (FIXTURES / name).read_text(encoding="utf-8").splitlines(keepends=True)
    while lines and lines[0].startswith("#"):
        lines.pop(0)
    return "".join(lines)


def fixture_fields(name: str) -> Sequence[str]:
    for line in (FIXTURES / name).read_text(encoding="utf-8").splitlines():
        if line.startswith("# fields:"):
            return [field.strip() for field in line.split(":", 1)[1].split(",")]
    return QUERY_FIELDS


def test_every_fixture_names_its_source() -> None:
    for path in sorted(FIXTURES.iterdir()):
        if path.name == "SOURCES.md":
            continue
        head = path.read_text(encoding="utf-8")[:400]
        assert "source:" in head or "synthetic:" in head, path.name
        assert ("synthetic:" in head) == path.name.startswith("synthetic-"), path.name
        assert path.name in (FIXTURES / "SOURCES.md").read_text(encoding="utf-8"), path.name


# --- Value parsers --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("81920 MiB", 81920),
        ("7979", 7979),
        ("[N/A]", None),
        ("N/A", None),
        ("[Not Supported]", None),
        ("[Unknown Error]", None),
        ("", None),
        (None, None),
        ("27 C", 27),
        ("0x10", None),
        ("12abc", None),
    ],
)
def test_to_int(text: Optional[str], expected: Optional[int]) -> None:
    assert to_int(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [("67.03 W", 67.03), ("176.98", 176.98), ("[Not Supported]", None), ("nan", None), ("inf", None)],
)
def test_to_float(text: str, expected: Optional[float]) -> None:
    assert to_float(text) == expected


@pytest.mark.parametrize(
    "mask, expected",
    [
        ("0x0000000000000000", []),
        ("0x0000000000000001", ["gpu_idle"]),
        ("0x0000000000000044", ["sw_power_cap", "hw_thermal_slowdown"]),
        ("0x0000000000001000", ["unknown_0x1000"]),
        ("[N/A]", None),
        ("garbage", None),
    ],
)
def test_parse_clocks_event_mask(mask: str, expected: Optional[List[str]]) -> None:
    assert parse_clocks_event_mask(mask) == expected


def test_versions() -> None:
    assert driver_branch("550.54.15") == "550"
    assert driver_branch("536.40") == "536"
    assert driver_branch(None) is None
    assert cuda_version_from_int(12020) == "12.2"
    assert cuda_version_from_int(11070) == "11.7"
    assert cuda_version_from_int(0) is None


# --- Error messages -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, kind",
    [
        ("error-driver-not-loaded.txt", "driver_not_loaded"),
        ("error-version-mismatch.txt", "version_mismatch"),
        ("error-no-devices.txt", "no_devices"),
    ],
)
def test_classify_recorded_errors(name: str, kind: str) -> None:
    found, message = classify_output(fixture_text(name))
    assert found == kind
    assert message and message.split()[0] in fixture_text(name)


def test_classify_other_spelling_and_unknown_text() -> None:
    # One recorded source prints a typographic apostrophe in "couldn't".
    assert classify_output("NVIDIA-SMI has failed because it couldn\u2018t communicate with the NVIDIA driver.")[0] == (
        "driver_not_loaded"
    )
    assert classify_output('Field "clocks_event_reasons.active" is not a valid field to query.')[0] == "invalid_field"
    assert classify_output("Failed to initialize NVML: Unknown Error")[0] == "nvml_init_failed"
    assert classify_output("0, GPU-1, Tesla T4") == (None, None)
    assert classify_output("") == (None, None)


def test_version_mismatch_names_the_library_version() -> None:
    assert parse_nvml_library_version(fixture_text("error-version-mismatch.txt")) == "550.144"
    assert parse_nvml_library_version("Failed to initialize NVML: Driver/library version mismatch") is None


# --- CSV ------------------------------------------------------------------------------------------------------------


CSV_CASES = {
    "synthetic-h100x8.csv": dict(
        count=8,
        driver="550.54.15",
        first=dict(
            index=0,
            name="NVIDIA H100 80GB HBM3",
            pci_bus_id="00000000:18:00.0",
            memory_total_mib=81559,
            memory_used_mib=1,
            compute_mode="Default",
            persistence_mode="enabled",
            mig_mode_current="disabled",
            ecc_mode_current="enabled",
            ecc_errors_uncorrected_volatile=0,
            retired_pages_pending=None,
            temperature_c=30,
            power_draw_w=69.5,
            power_limit_w=700.0,
            clocks_event_reasons=["gpu_idle"],
        ),
        last=dict(index=7, temperature_c=None, power_draw_w=None, pci_bus_id="00000000:DB:00.0"),
    ),
    "synthetic-tesla-t4.csv": dict(
        count=1,
        driver="515.105.01",
        first=dict(
            name="Tesla T4",
            memory_total_mib=15360,
            memory_used_mib=1032,
            mig_mode_current=None,
            persistence_mode="disabled",
            retired_pages_pending=False,
            clocks_event_reasons=[],
        ),
        last=dict(index=0),
    ),
    "tesla-p100-header.csv": dict(
        count=1,
        driver=None,
        first=dict(
            index=None,
            name="Tesla P100-PCIE-16GB",
            uuid="GPU-ef1b2c9b-38d8-2090-2bd1-f567a3eb42a6",
            memory_used_mib=0,
            memory_total_mib=None,
            temperature_c=37,
            power_draw_w=28.16,
        ),
        last=dict(name="Tesla P100-PCIE-16GB"),
    ),
    "rtx-2080-nounits.csv": dict(
        count=1,
        driver="440.64",
        first=dict(
            name="GeForce RTX 2080",
            uuid="GPU-22b2c6ac-2d49-4863-197c-9c469071178a",
            memory_total_mib=7979,
            power_draw_w=176.98,
            power_limit_w=200.0,
            temperature_c=45,
            mig_mode_current=None,
        ),
        last=dict(name="GeForce RTX 2080"),
    ),
}


@pytest.mark.parametrize("name", sorted(CSV_CASES))
def test_parse_query_csv_fixtures(name: str) -> None:
    case = CSV_CASES[name]
    gpus, driver, problem = parse_query_csv(fixture_text(name), fixture_fields(name))
    assert problem is None
    assert len(gpus) == case["count"]
    assert driver == case["driver"]
    for key, value in case["first"].items():
        assert gpus[0][key] == value, key
    for key, value in case["last"].items():
        assert gpus[-1][key] == value, key
    assert all(set(gpu) == set(empty_gpu()) for gpu in gpus)


def test_parse_query_csv_reports_rows_with_the_wrong_width() -> None:
    gpus, _driver, problem = parse_query_csv("0, GPU-1, Tesla T4\n", QUERY_FIELDS)
    assert gpus == []
    assert problem and "19 columns" in problem


# --- XML ------------------------------------------------------------------------------------------------------------


XML_CASES = {
    "tesla-t4.xml": dict(
        driver="515.105.01",
        cuda="11.7",
        gpu=dict(
            index=0,
            uuid="GPU-d37e67a5-91dd-3774-a5cb-99096249601a",
            name="Tesla T4",
            pci_bus_id="00000000:00:1E.0",
            pci_device_id="0x1EB810DE",  # the XML's bare 1EB810DE, in pci.device_id's form
            pci_sub_system_id="0x12A210DE",
            memory_total_mib=15360,
            memory_used_mib=1032,
            mig_mode_current=None,
            mig_devices=[],
            compute_mode="Default",
            persistence_mode="disabled",
            ecc_mode_current="enabled",
            ecc_errors_uncorrected_volatile=0,
            ecc_errors_uncorrected_aggregate=0,
            retired_pages_pending=False,
            remapped_rows_pending=None,
            temperature_c=40,
            power_draw_w=26.78,
            power_limit_w=70.0,
            clocks_event_reasons=[],
        ),
    ),
    "a100-sxm4-mig.xml": dict(
        driver="535.54.03",
        cuda="12.2",
        gpu=dict(
            name="NVIDIA A100-SXM4-80GB",
            pci_device_id="0x20B210DE",
            pci_sub_system_id="0x147F10DE",
            mig_mode_current="enabled",
            mig_mode_pending="enabled",
            memory_total_mib=81920,
            memory_used_mib=50,
            retired_pages_pending=None,
            remapped_rows_pending=None,
            ecc_errors_uncorrected_volatile=0,
            temperature_c=27,
            power_draw_w=67.03,
            power_limit_w=500.0,
            clocks_event_reasons=[],
        ),
    ),
    "rtx-3080.xml": dict(
        driver="536.40",
        cuda="12.2",
        gpu=dict(
            name="NVIDIA GeForce RTX 3080",
            persistence_mode=None,
            mig_mode_current=None,
            ecc_mode_current=None,
            ecc_errors_uncorrected_volatile=None,
            ecc_errors_uncorrected_aggregate=None,
            retired_pages_pending=None,
            memory_total_mib=10240,
            power_limit_w=336.0,
            clocks_event_reasons=["gpu_idle"],
        ),
    ),
    "rtx-3080-595.xml": dict(
        driver="595.58.03",
        cuda="13.2",
        gpu=dict(
            index=0,
            uuid="GPU-19d6d965-2acc-f646-00f8-4c76979aabb4",
            name="NVIDIA GeForce RTX 3080",
            pci_bus_id="00000000:0C:00.0",
            memory_total_mib=10240,
            memory_used_mib=9184,
            compute_mode="Default",
            persistence_mode="disabled",
            mig_mode_current=None,
            mig_devices=[],
            ecc_mode_current=None,
            ecc_errors_uncorrected_volatile=None,
            ecc_errors_uncorrected_aggregate=None,
            retired_pages_pending=None,
            remapped_rows_pending=None,
            temperature_c=27,
            power_draw_w=139.62,
            power_limit_w=320.0,
            clocks_event_reasons=[],
        ),
    ),
    "synthetic-h100-ecc.xml": dict(
        driver="550.54.15",
        cuda="12.4",
        gpu=dict(
            compute_mode="Exclusive_Process",
            mig_mode_current="disabled",
            mig_mode_pending="enabled",
            ecc_errors_uncorrected_volatile=2,
            ecc_errors_uncorrected_aggregate=6,
            remapped_rows_pending=True,
            remapped_rows_failure=False,
            clocks_event_reasons=["hw_slowdown", "hw_thermal_slowdown"],
        ),
    ),
}


@pytest.mark.parametrize("name", sorted(XML_CASES))
def test_parse_query_xml_fixtures(name: str) -> None:
    case = XML_CASES[name]
    parsed, problem = parse_query_xml(fixture_text(name))
    assert problem is None and parsed is not None
    assert parsed["driver_version"] == case["driver"]
    assert parsed["cuda_driver_version"] == case["cuda"]
    assert len(parsed["gpus"]) == 1
    for key, value in case["gpu"].items():
        assert parsed["gpus"][0][key] == value, key


@pytest.mark.parametrize("value, expected", [
    (0x233010DE, "0x233010DE"),  # NVML's nvmlPciInfo_t.pciDeviceId
    ("233010DE", "0x233010DE"),  # -q -x
    ("0x233010de", "0x233010DE"),  # --query-gpu=pci.device_id
    ("[N/A]", None),
    ("H100", None),
    (None, None),
])
def test_pci_ids_take_one_form(value, expected) -> None:
    assert pci_id(value) == expected


def test_parse_query_xml_mig_devices() -> None:
    parsed, _problem = parse_query_xml(fixture_text("a100-sxm4-mig.xml"))
    assert parsed is not None
    devices = parsed["gpus"][0]["mig_devices"]
    assert [device["gpu_instance_id"] for device in devices] == [3, 4, 5, 6]
    assert {device["memory_total_mib"] for device in devices} == {19968}
    assert {device["memory_used_mib"] for device in devices} == {12}


def test_mig_profiles_and_uuids_come_from_nvidia_smi_list_where_the_xml_lacks_them() -> None:
    # The 535 XML names neither; `-L` (this listing is written for the test in the real tool's format) has both.
    parsed, _problem = parse_query_xml(fixture_text("a100-sxm4-mig.xml"))
    assert parsed is not None
    gpus = parsed["gpus"]
    assert {device["profile"] for device in gpus[0]["mig_devices"]} == {None}
    listing = "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-513536b6-7d19-9063-b049-1e69664bb298)\n" + "".join(
        "  MIG 2g.20gb     Device  %d: (UUID: MIG-0000000%d-7d19-5063-b049-1e69664bb298)\n" % (n, n) for n in range(4))
    from ansible_collections.gpu_ops.cluster.plugins.module_utils.mig_layout import parse_list
    add_mig_names(gpus, parse_list(listing))
    assert [d["profile"] for d in gpus[0]["mig_devices"]] == ["2g.20gb"] * 4
    assert gpus[0]["mig_devices"][3]["uuid"] == "MIG-00000003-7d19-5063-b049-1e69664bb298"
    assert gpus[0]["mig_devices"][3]["gpu_instance_id"] == 6  # the XML's values stay


def test_parse_query_xml_power_draw_of_the_same_card_before_and_after_the_power_split() -> None:
    # One RTX 3080 (same UUID and VBIOS) recorded on 536.40 with <power_draw> and on 595.58.03 with only
    # <average_power_draw> 139.62 W and <instant_power_draw> 142.33 W; the average is what CSV power.draw reports.
    before, _problem = parse_query_xml(fixture_text("rtx-3080.xml"))
    after, _problem = parse_query_xml(fixture_text("rtx-3080-595.xml"))
    assert before is not None and after is not None
    assert before["gpus"][0]["uuid"] == after["gpus"][0]["uuid"]
    assert (before["gpus"][0]["power_draw_w"], after["gpus"][0]["power_draw_w"]) == (22.78, 139.62)


def test_parse_query_xml_power_draw_falls_back_to_instant_without_an_average() -> None:
    # GA100 and older GPUs have no 1 s average and their CSV power.draw is the instant reading; the 595 recording
    # with its average blanked the way nvidia-smi blanks it stands in for one of them.
    recorded = fixture_text("rtx-3080-595.xml")
    blanked = recorded.replace(
        "<average_power_draw>139.62 W</average_power_draw>", "<average_power_draw>N/A</average_power_draw>"
    )
    assert blanked != recorded
    parsed, _problem = parse_query_xml(blanked)
    assert parsed is not None
    assert parsed["gpus"][0]["power_draw_w"] == 142.33


@pytest.mark.parametrize(
    "text, fragment",
    [("", "printed nothing"), ("<html/>", "not <nvidia_smi_log>"), ("<nvidia_smi_log>", "not XML")],
)
def test_parse_query_xml_reports_unreadable_output(text: str, fragment: str) -> None:
    parsed, problem = parse_query_xml(text)
    assert parsed is None and problem and fragment in problem


# --- Parsers never raise --------------------------------------------------------------------------------------------

_XML_PIECES = st.sampled_from(
    [
        "<nvidia_smi_log>",
        "</nvidia_smi_log>",
        "<gpu>",
        "</gpu>",
        "<mig_devices>",
        "<mig_device>",
        "</mig_device>",
        "</mig_devices>",
        "<fb_memory_usage><total>",
        "</total></fb_memory_usage>",
        "<ecc_errors><volatile>",
        "</volatile></ecc_errors>",
        "<dram_uncorrectable>",
        "</dram_uncorrectable>",
        "N/A",
        "12 MiB",
        "&amp;",
        "&x;",
        "<!DOCTYPE x>",
        "<?xml version='1.0' encoding='UTF-16'?>",
        "\x00",
        "]]>",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_text_parsers_never_raise(text: str) -> None:
    parse_query_csv(text)
    parse_query_csv(text, ["index", "name"])
    parse_query_xml(text)
    classify_output(text)
    parse_nvml_library_version(text)
    parse_clocks_event_mask(text)
    to_int(text)
    to_float(text)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(_XML_PIECES, st.text(max_size=8)), max_size=30))
def test_xml_parser_never_raises_on_xml_like_text(pieces: List[str]) -> None:
    parsed, problem = parse_query_xml("".join(pieces))
    assert (parsed is None) != (problem is None)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.lists(
            st.sampled_from(["[N/A]", "N/A", "[Not Supported]", "0x1", "-1", "1e400", "", " x "]) | st.text(max_size=6),
            min_size=19,
            max_size=19,
        ),
        max_size=5,
    )
)
def test_csv_parser_never_raises_on_full_width_rows(rows: List[List[str]]) -> None:
    text = "\n".join(", ".join(cell.replace(",", "").replace("\n", "") for cell in row) for row in rows)
    gpus, _driver, _problem = parse_query_csv(text)
    assert all(set(gpu) == set(empty_gpu()) for gpu in gpus)


# --- nvidia-smi collector -------------------------------------------------------------------------------------------


class FakeRunner:
    """Answers argv by which nvidia-smi mode it asks for; records each call."""

    def __init__(self, csv: Optional[CommandResult], xml: Optional[CommandResult] = None,
                 kernel_log: Optional[CommandResult] = None) -> None:
        self.csv = csv
        self.xml = xml or CommandResult(0, "", "")
        self.kernel_log = kernel_log or CommandResult(0, "", "")
        self.calls = []  # type: List[List[str]]

    def __call__(self, argv: Sequence[str], timeout: float) -> CommandResult:
        self.calls.append(list(argv))
        if os.path.basename(argv[0]) in ("journalctl", "dmesg"):
            return self.kernel_log
        if "-x" in argv:
            return self.xml
        assert self.csv is not None
        return self.csv


def ok(text: str) -> CommandResult:
    return CommandResult(0, text, "")


def test_collect_nvidia_smi_merges_csv_and_xml() -> None:
    runner = FakeRunner(ok(fixture_text("synthetic-tesla-t4.csv")), ok(fixture_text("tesla-t4.xml")))
    facts = collect_nvidia_smi(SMI, runner, 5)
    assert facts["source"] == "nvidia-smi" and facts["error_kind"] is None
    assert facts["driver_version"] == "515.105.01" and facts["cuda_driver_version"] == "11.7"
    assert facts["gpu_count"] == 1
    assert runner.calls[0] == [SMI, "--query-gpu=" + ",".join(QUERY_FIELDS), "--format=csv,noheader,nounits"]
    assert runner.calls[1] == [SMI, "-q", "-x"]


def test_collect_nvidia_smi_takes_mig_devices_and_rows_from_xml() -> None:
    csv = (
        "0, GPU-00000000-1111-2222-3333-444444444444, NVIDIA H100 80GB HBM3, 550.54.15, 00000000:18:00.0, 81559, 1, "
        "Exclusive_Process, Enabled, Disabled, Enabled, Enabled, 2, 6, [N/A], 88, 412.55, 700.00, 0x48\n"
    )
    facts = collect_nvidia_smi(SMI, FakeRunner(ok(csv), ok(fixture_text("synthetic-h100-ecc.xml"))), 5)
    gpu = facts["gpus"][0]
    assert gpu["remapped_rows_pending"] is True
    assert gpu["clocks_event_reasons"] == ["hw_slowdown", "hw_thermal_slowdown"]
    assert facts["cuda_driver_version"] == "12.4"


def test_collect_nvidia_smi_keeps_csv_facts_when_xml_fails() -> None:
    runner = FakeRunner(ok(fixture_text("synthetic-h100x8.csv")), CommandResult(0, "", "", timed_out=True))
    facts = collect_nvidia_smi(SMI, runner, 5)
    assert facts["error_kind"] is None
    assert facts["gpu_count"] == 8 and facts["cuda_driver_version"] is None


def test_collect_nvidia_smi_xml_only_path_reads_power_on_newer_drivers() -> None:
    # The CSV printed no rows, so every GPU fact comes from -q -x.
    runner = FakeRunner(ok(""), ok(fixture_text("rtx-3080-595.xml")))
    facts = collect_nvidia_smi(SMI, runner, 5)
    assert facts["error_kind"] is None and facts["gpu_count"] == 1
    assert (facts["driver_version"], facts["cuda_driver_version"]) == ("595.58.03", "13.2")
    assert facts["gpus"][0]["power_draw_w"] == 139.62
    assert facts["gpus"][0]["power_limit_w"] == 320.0


@pytest.mark.parametrize(
    "result, kind",
    [
        (CommandResult(9, fixture_text("error-driver-not-loaded.txt"), ""), "driver_not_loaded"),
        (CommandResult(18, fixture_text("error-version-mismatch.txt"), ""), "version_mismatch"),
        (CommandResult(6, fixture_text("error-no-devices.txt"), ""), "no_devices"),
        (CommandResult(0, "", "", timed_out=True), "timeout"),
        (CommandResult(2, "", "Segmentation fault"), "command_failed"),
        (CommandResult(0, "", ""), "no_devices"),
        (CommandResult(0, "1, 2\n", ""), "parse_error"),
    ],
)
def test_collect_nvidia_smi_failures_are_data(result: CommandResult, kind: str) -> None:
    facts = collect_nvidia_smi(SMI, FakeRunner(result), 5)
    assert facts["error_kind"] == kind
    assert facts["error"]
    assert facts["gpus"] == [] and facts["gpu_count"] == 0
    assert facts["advice"] == ADVICE.get(kind)
    assert set(facts) == set(empty_facts())


def test_version_mismatch_carries_library_version_and_advice() -> None:
    facts = collect_nvidia_smi(SMI, FakeRunner(CommandResult(18, fixture_text("error-version-mismatch.txt"), "")), 5)
    assert facts["nvml_version"] == "550.144"
    assert "reboot" in facts["advice"] and "reload" in facts["advice"]


def test_collect_nvidia_smi_retries_with_legacy_throttle_field() -> None:
    calls = []  # type: List[List[str]]

    def runner(argv: Sequence[str], timeout: float) -> CommandResult:
        calls.append(list(argv))
        if "-x" in argv:
            return ok(fixture_text("tesla-t4.xml"))
        if "clocks_event_reasons.active" in argv[1]:
            return CommandResult(2, 'Field "clocks_event_reasons.active" is not a valid field to query.\n', "")
        return ok(fixture_text("synthetic-tesla-t4.csv"))

    facts = collect_nvidia_smi(SMI, runner, 5)
    assert facts["error_kind"] is None and facts["gpu_count"] == 1
    assert "clocks_throttle_reasons.active" in calls[1][1]


def test_collect_nvidia_smi_without_binary() -> None:
    facts = collect_nvidia_smi(None, FakeRunner(None), 5)
    assert facts["error_kind"] == "not_installed" and facts["source"] == "none"


def test_run_with_timeout_kills_a_hung_command() -> None:
    result = run_with_timeout([sys.executable, "-c", "import time; time.sleep(10)"], 0.3)
    assert result.timed_out


def test_run_with_timeout_reports_a_missing_binary_and_real_output() -> None:
    assert run_with_timeout(["/nonexistent/nvidia-smi"], 1).rc == 127
    result = run_with_timeout([sys.executable, "-c", "print('No devices were found')"], 10)
    assert (result.rc, result.stdout.strip(), result.timed_out) == (0, "No devices were found", False)


# --- NVML collector -------------------------------------------------------------------------------------------------


class FakeNvmlError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__("NVML error {0}".format(value))
        self.value = value


NOT_SUPPORTED = 3
NOT_FOUND = 6
MIB = 1024 * 1024


class FakeNvml:
    """The pynvml calls collect_nvml makes, answered from a list of GPU dicts (a double of NVML, not NVML)."""

    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    NVML_AGGREGATE_ECC = 1
    NVML_TEMPERATURE_GPU = 0

    def __init__(
        self,
        gpus: List[Dict[str, Any]],
        driver: str = "515.105.01",
        cuda: int = 11070,
        init_error: Optional[int] = None,
    ) -> None:
        self.gpus = gpus
        self.driver = driver
        self.cuda = cuda
        self.init_error = init_error
        self.shutdown_calls = 0

    def _get(self, handle: Dict[str, Any], key: str) -> Any:
        value = handle.get(key)
        if value is None:
            raise FakeNvmlError(NOT_SUPPORTED)
        return value

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise FakeNvmlError(self.init_error)

    def nvmlShutdown(self) -> None:
        self.shutdown_calls += 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver

    def nvmlSystemGetNVMLVersion(self) -> str:
        return "11." + self.driver

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return self.cuda

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Dict[str, Any]:
        return self.gpus[index]

    def nvmlDeviceGetUUID(self, handle: Dict[str, Any]) -> str:
        return self._get(handle, "uuid")

    def nvmlDeviceGetName(self, handle: Dict[str, Any]) -> bytes:
        return self._get(handle, "name").encode()  # older bindings return bytes

    def nvmlDeviceGetPciInfo(self, handle: Dict[str, Any]) -> SimpleNamespace:
        # nvmlPciInfo_t: pciDeviceId and pciSubSystemId are ints, device << 16 | vendor.
        return SimpleNamespace(busId=self._get(handle, "pci_bus_id"), pciDeviceId=handle.get("pci_device_id"),
                               pciSubSystemId=handle.get("pci_sub_system_id"))

    def nvmlDeviceGetMemoryInfo(self, handle: Dict[str, Any]) -> SimpleNamespace:
        return SimpleNamespace(total=self._get(handle, "total_mib") * MIB, used=self._get(handle, "used_mib") * MIB)

    def nvmlDeviceGetMigMode(self, handle: Dict[str, Any]) -> Tuple[int, int]:
        return self._get(handle, "mig")

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Dict[str, Any]) -> int:
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Dict[str, Any], slot: int) -> Dict[str, Any]:
        migs = handle.get("migs") or []
        if slot >= len(migs):
            raise FakeNvmlError(NOT_FOUND)
        return migs[slot]

    def nvmlDeviceGetGpuInstanceId(self, handle: Dict[str, Any]) -> int:
        return self._get(handle, "gi")

    def nvmlDeviceGetComputeInstanceId(self, handle: Dict[str, Any]) -> int:
        return self._get(handle, "ci")

    def nvmlDeviceGetComputeMode(self, handle: Dict[str, Any]) -> int:
        return self._get(handle, "compute_mode")

    def nvmlDeviceGetPersistenceMode(self, handle: Dict[str, Any]) -> int:
        return self._get(handle, "persistence")

    def nvmlDeviceGetEccMode(self, handle: Dict[str, Any]) -> Tuple[int, int]:
        return self._get(handle, "ecc")

    def nvmlDeviceGetTotalEccErrors(self, handle: Dict[str, Any], error_type: int, counter: int) -> int:
        return self._get(handle, "ecc_volatile" if counter == 0 else "ecc_aggregate")

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Dict[str, Any]) -> int:
        return self._get(handle, "retired_pending")

    def nvmlDeviceGetRemappedRows(self, handle: Dict[str, Any]) -> Tuple[int, int, int, int]:
        return self._get(handle, "remapped")

    def nvmlDeviceGetTemperature(self, handle: Dict[str, Any], sensor: int) -> int:
        return self._get(handle, "temperature")

    def nvmlDeviceGetPowerUsage(self, handle: Dict[str, Any]) -> int:
        return self._get(handle, "power_mw")

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Dict[str, Any]) -> int:
        return self._get(handle, "limit_mw")

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Dict[str, Any]) -> int:
        return self._get(handle, "reasons")


# The GPU of the recorded tesla-t4.xml, as NVML would report it.
NVML_T4 = dict(
    uuid="GPU-d37e67a5-91dd-3774-a5cb-99096249601a",
    name="Tesla T4",
    pci_bus_id="00000000:00:1E.0",
    pci_device_id=0x1EB810DE,
    pci_sub_system_id=0x12A210DE,
    total_mib=15360,
    used_mib=1032,
    mig=None,
    compute_mode=0,
    persistence=0,
    ecc=(1, 1),
    ecc_volatile=0,
    ecc_aggregate=0,
    retired_pending=0,
    remapped=None,
    temperature=40,
    power_mw=26780,
    limit_mw=70000,
    reasons=0,
)


def test_nvml_path_returns_the_same_structure_and_values_as_nvidia_smi() -> None:
    nvml_facts = collect_nvml(FakeNvml([dict(NVML_T4)]))
    smi_facts = collect_nvidia_smi(
        SMI, FakeRunner(ok(fixture_text("synthetic-tesla-t4.csv")), ok(fixture_text("tesla-t4.xml"))), 5
    )
    assert set(nvml_facts) == set(smi_facts) == set(empty_facts())
    assert nvml_facts["gpus"] == smi_facts["gpus"]
    for key in ("driver_version", "cuda_driver_version", "gpu_count", "error_kind"):
        assert nvml_facts[key] == smi_facts[key], key
    assert (nvml_facts["source"], smi_facts["source"]) == ("nvml", "nvidia-smi")
    assert nvml_facts["nvml_version"] == "11.515.105.01"


def test_nvml_path_reads_mig_devices_and_remapped_rows() -> None:
    gpu = dict(
        NVML_T4,
        name="NVIDIA A100-SXM4-80GB",
        mig=(1, 1),
        remapped=(0, 2, 1, 0),
        retired_pending=None,
        migs=[
            dict(uuid="MIG-ce861fb0-a248-58ce-a9a8-f9adbc22a66a", gi=3, ci=0, total_mib=19968, used_mib=12),
            dict(uuid="MIG-a45882f0-9215-5733-a0c1-49286ab31cb5", gi=4, ci=0, total_mib=19968, used_mib=12),
        ],
    )
    fake = FakeNvml([gpu], cuda=12020)
    facts = collect_nvml(fake)
    result = facts["gpus"][0]
    assert result["mig_mode_current"] == "enabled"
    assert [(m["index"], m["gpu_instance_id"], m["memory_total_mib"]) for m in result["mig_devices"]] == [
        (0, 3, 19968),
        (1, 4, 19968),
    ]
    assert result["remapped_rows_pending"] is True and result["remapped_rows_failure"] is False
    assert result["retired_pages_pending"] is None
    assert facts["cuda_driver_version"] == "12.2"
    assert fake.shutdown_calls == 1


def test_gather_falls_back_to_nvidia_smi_when_nvml_does_not_initialise(tmp_path: Path) -> None:
    runner = FakeRunner(ok(fixture_text("synthetic-h100x8.csv")))
    facts = gather_gpu_facts(FakeNvml([], init_error=12), SMI, runner, 5, root=str(tmp_path))
    assert facts["source"] == "nvidia-smi" and facts["gpu_count"] == 8


def test_gather_reports_the_nvml_error_when_nvidia_smi_is_missing(tmp_path: Path) -> None:
    facts = gather_gpu_facts(FakeNvml([], init_error=18), None, FakeRunner(None), 5, root=str(tmp_path))
    assert facts["source"] == "nvml"
    assert facts["error_kind"] == "version_mismatch"
    assert "reboot" in facts["advice"]


def test_gather_reads_the_kernel_module(tmp_path: Path) -> None:
    (tmp_path / "sys/module/nvidia").mkdir(parents=True)
    (tmp_path / "sys/module/nvidia/version").write_text("550.54.15\n")
    facts = gather_gpu_facts(None, None, FakeRunner(None), 5, root=str(tmp_path))
    assert facts["kernel_module"] == {"loaded": True, "version": "550.54.15"}
    assert gather_gpu_facts(None, None, FakeRunner(None), 5, root=str(tmp_path / "x"))["kernel_module"] == {
        "loaded": False,
        "version": None,
    }


# --- Decisions ------------------------------------------------------------------------------------------------------


def smi_facts(csv_name: str, xml_name: Optional[str] = None) -> Dict[str, Any]:
    xml = ok(fixture_text(xml_name)) if xml_name else CommandResult(0, "", "")
    return collect_nvidia_smi(SMI, FakeRunner(ok(fixture_text(csv_name)), xml), 5)


def test_find_problems_none_when_expectations_met() -> None:
    facts = smi_facts("synthetic-h100x8.csv")
    problems = find_problems(
        facts,
        expected_gpu_count=8,
        expected_driver_branch="550",
        expected_product=re.compile("H100|H200"),
        expected_mig_mode="disabled",
    )
    assert problems == []


def test_find_problems_names_expected_and_found() -> None:
    facts = smi_facts("synthetic-h100x8.csv")
    problems = find_problems(
        facts,
        expected_gpu_count=7,
        expected_driver_branch="535",
        expected_product=re.compile("^NVIDIA H200"),
        expected_mig_mode="enabled",
    )
    assert "expected 7 GPU(s), found 8" in problems
    assert "expected driver branch 535, found 550.54.15" in problems
    assert sum("expected a product matching '^NVIDIA H200', found 'NVIDIA H100 80GB HBM3'" in p for p in problems) == 8
    assert sum("expected MIG mode enabled, found disabled" in p for p in problems) == 8


def test_find_problems_flags_ecc_row_remap_and_pending_mig() -> None:
    csv = (
        "0, GPU-00000000-1111-2222-3333-444444444444, NVIDIA H100 80GB HBM3, 550.54.15, 00000000:18:00.0, 81559, 1, "
        "Default, Enabled, Disabled, Enabled, Enabled, 2, 6, [N/A], 88, 412.55, 700.00, 0x48\n"
    )
    facts = collect_nvidia_smi(SMI, FakeRunner(ok(csv), ok(fixture_text("synthetic-h100-ecc.xml"))), 5)
    problems = find_problems(facts, expected_mig_mode="enabled")
    joined = "\n".join(problems)
    assert "expected 0 uncorrected ECC errors since the driver loaded, found 2" in joined
    assert "expected 0 uncorrected ECC errors over the GPU's lifetime, found 6" in joined
    assert "pending row remapping" in joined
    assert "found disabled (enabled is pending; reset the GPU or reboot)" in joined


def test_find_problems_consumer_gpu_without_mig_counts_as_disabled() -> None:
    parsed, _problem = parse_query_xml(fixture_text("rtx-3080.xml"))
    assert parsed is not None
    facts = dict(empty_facts(), gpus=parsed["gpus"], driver_version="536.40")
    assert find_problems(facts, expected_mig_mode="disabled") == []
    assert find_problems(facts, expected_mig_mode="enabled") == [
        "GPU 0 (GPU-19d6d965-2acc-f646-00f8-4c76979aabb4): expected MIG mode enabled, found not supported"
    ]


def test_find_problems_reports_error_states() -> None:
    facts = collect_nvidia_smi(SMI, FakeRunner(CommandResult(6, fixture_text("error-no-devices.txt"), "")), 5)
    assert find_problems(facts, expected_gpu_count=1) == [
        "expected a working GPU stack, found no_devices: No devices were found",
        "expected 1 GPU(s), found 0",
    ]


# --- main() ---------------------------------------------------------------------------------------------------------


@pytest.fixture
def gpu_facts_module(patched_ansible_module: List[str], monkeypatch: pytest.MonkeyPatch) -> ModuleRunner:
    module = load_ansible_module("nvidia_gpu_facts")
    monkeypatch.setattr(module, "pynvml", None)
    monkeypatch.setattr(module, "HAS_PYNVML", False)
    return ModuleRunner(module, patched_ansible_module)


def use_runner(monkeypatch: pytest.MonkeyPatch, runner: FakeRunner, module: ModuleRunner) -> None:
    monkeypatch.setattr(module.module, "run_with_timeout", runner)


def test_main_check_mode_reports_without_change(
    gpu_facts_module: ModuleRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = FakeRunner(ok(fixture_text("synthetic-h100x8.csv")))
    use_runner(monkeypatch, runner, gpu_facts_module)
    result = gpu_facts_module.exit({"nvidia_smi_path": SMI, "expected_gpu_count": 8}, check_mode=True)
    assert gpu_facts_module.ran_in_check_mode is True
    assert result["changed"] is False
    assert result["healthy"] is True and result["problems"] == []
    assert result["ansible_facts"]["nvidia_gpu"]["gpu_count"] == 8
    assert runner.calls[0][0] == SMI


def test_main_fail_on_unmet_fails_with_problems_and_facts(
    gpu_facts_module: ModuleRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_runner(monkeypatch, FakeRunner(ok(fixture_text("synthetic-h100x8.csv"))), gpu_facts_module)
    result = gpu_facts_module.fail({"nvidia_smi_path": SMI, "expected_gpu_count": 4, "fail_on_unmet": True})
    assert result["msg"] == "expected 4 GPU(s), found 8"
    assert result["problems"] == ["expected 4 GPU(s), found 8"]
    assert result["ansible_facts"]["nvidia_gpu"]["gpu_count"] == 8
    assert result["changed"] is False


def test_main_unmet_without_fail_on_unmet_only_reports(
    gpu_facts_module: ModuleRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_runner(monkeypatch, FakeRunner(ok(fixture_text("synthetic-h100x8.csv"))), gpu_facts_module)
    result = gpu_facts_module.exit({"nvidia_smi_path": SMI, "expected_driver_branch": "535"})
    assert result["healthy"] is False
    assert result["problems"] == ["expected driver branch 535, found 550.54.15"]


@pytest.mark.parametrize(
    "result, kind",
    [
        (CommandResult(9, fixture_text("error-driver-not-loaded.txt"), ""), "driver_not_loaded"),
        (CommandResult(18, fixture_text("error-version-mismatch.txt"), ""), "version_mismatch"),
        (CommandResult(6, fixture_text("error-no-devices.txt"), ""), "no_devices"),
        (CommandResult(0, "", "", timed_out=True), "timeout"),
    ],
)
def test_main_error_kinds_are_data(
    gpu_facts_module: ModuleRunner, monkeypatch: pytest.MonkeyPatch, result: CommandResult, kind: str
) -> None:
    use_runner(monkeypatch, FakeRunner(result), gpu_facts_module)
    exited = gpu_facts_module.exit({"nvidia_smi_path": SMI, "timeout": 3})
    facts = exited["ansible_facts"]["nvidia_gpu"]
    assert facts["error_kind"] == kind
    assert exited["healthy"] is False and exited["problems"][0].startswith(
        "expected a working GPU stack, found " + kind
    )
    failed = gpu_facts_module.fail({"nvidia_smi_path": SMI, "fail_on_unmet": True})
    assert failed["ansible_facts"]["nvidia_gpu"]["error_kind"] == kind


def test_main_without_nvidia_smi(gpu_facts_module: ModuleRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    from ansible.module_utils import basic

    monkeypatch.setattr(basic.AnsibleModule, "get_bin_path", lambda self, *args, **kwargs: None)
    result = gpu_facts_module.exit({})
    assert result["ansible_facts"]["nvidia_gpu"]["error_kind"] == "not_installed"
    assert result["ansible_facts"]["nvidia_gpu"]["source"] == "none"


def test_main_uses_nvml_when_it_initialises(gpu_facts_module: ModuleRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu_facts_module.module, "pynvml", FakeNvml([dict(NVML_T4)]))
    monkeypatch.setattr(gpu_facts_module.module, "HAS_PYNVML", True)
    use_runner(monkeypatch, FakeRunner(None), gpu_facts_module)
    result = gpu_facts_module.exit({"expected_product": "T4", "expected_gpu_count": 1})
    assert result["ansible_facts"]["nvidia_gpu"]["source"] == "nvml"
    assert result["healthy"] is True


def test_main_reports_the_kernel_logs_hardware_xids_as_problems(
    gpu_facts_module: ModuleRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = ok(fixture_text("../kernel_log/synthetic-journal-h100x8.txt"))
    runner = FakeRunner(ok(fixture_text("synthetic-h100x8.csv")), kernel_log=journal)
    use_runner(monkeypatch, runner, gpu_facts_module)
    monkeypatch.setattr(gpu_facts_module.module.AnsibleModule, "get_bin_path",
                        lambda self, name, *args, **kwargs: SMI if name == "nvidia-smi" else "/usr/bin/" + name)
    result = gpu_facts_module.exit({"expected_gpu_count": 8, "kernel_log": "journal"})
    facts = result["ansible_facts"]["nvidia_gpu"]
    assert facts["kernel_log"] == {"source": "journal", "error": None}
    assert [(x["xid"], x["gpu_index"], x["application"]) for x in facts["xid_errors"]] == [
        (48, 0, False), (79, 3, False), (79, 3, False), (13, 5, True)]
    assert result["healthy"] is False
    assert [p.split(":")[0] for p in result["problems"]] == ["GPU 0 (0000", "GPU 3 (0000"]
    assert runner.calls[-1][0] == "/usr/bin/journalctl"
    # Every code counted: the application's Xid 13 too.
    result = gpu_facts_module.exit({"kernel_log": "journal", "xid_ignore": []})
    assert len(result["problems"]) == 3


def test_main_reads_a_kernel_log_file_and_says_when_it_cannot(
    gpu_facts_module: ModuleRunner, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    use_runner(monkeypatch, FakeRunner(ok(fixture_text("synthetic-h100x8.csv"))), gpu_facts_module)
    log = tmp_path / "kern.log"
    result = gpu_facts_module.exit({"nvidia_smi_path": SMI, "kernel_log": "file", "kernel_log_file": str(log)})
    assert result["healthy"] is True  # an unreadable log is no GPU problem, and says so
    assert result["ansible_facts"]["nvidia_gpu"]["kernel_log"]["error"].startswith("cannot read the kernel log")
    log.write_text("Dec  6 04:12:40 gpu-h100-0 kernel: NVRM: Xid (PCI:0000:5d:00): 79, GPU has fallen off the bus.\n")
    result = gpu_facts_module.exit({"nvidia_smi_path": SMI, "kernel_log": "file", "kernel_log_file": str(log)})
    assert result["problems"] == ["GPU 3 (0000:5d:00): expected no GPU Xid error since boot, found Xid 79 (GPU has "
                                  "fallen off the bus): GPU has fallen off the bus."]


@pytest.mark.parametrize(
    "args, fragment",
    [({"expected_product": "H100("}, "not a valid regular expression"), ({"timeout": 0}, "timeout=0"),
     ({"kernel_log": "file"}, "kernel_log is file but all of the following are missing: kernel_log_file")],
)
def test_main_rejects_bad_options(gpu_facts_module: ModuleRunner, args: Dict[str, Any], fragment: str) -> None:
    assert fragment in gpu_facts_module.fail(args)["msg"]


def test_module_documentation_matches_argspec() -> None:
    import yaml

    module = load_ansible_module("nvidia_gpu_facts")
    documented = yaml.safe_load(module.DOCUMENTATION)["options"]
    spec = module.build_argspec()
    assert set(documented) == set(spec)
    for name, option in spec.items():
        assert documented[name]["type"] == option["type"], name
        assert documented[name].get("default") == option.get("default"), name
        assert documented[name].get("choices") == option.get("choices"), name
    yaml.safe_load(module.EXAMPLES)
    returned = yaml.safe_load(module.RETURN)["ansible_facts"]["contains"]["nvidia_gpu"]["contains"]
    assert set(returned) == set(empty_facts())
