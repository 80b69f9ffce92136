"""The lab's nvidia-smi double (lab/doubles/nvidia-smi), run as a subprocess the way the facts module runs nvidia-smi.

What these tests prove: the facts module's parsers (plugins/module_utils/nvidia_gpu.py) read the double's CSV and XML
answers to the same per-GPU facts for every catalogued product, the failures look like the real tool's (the messages
come from tests/unit/fixtures/nvidia_smi, recorded on real hosts), and the output repeats exactly. The expected
product values below are written out here from lab/doubles/SOURCES.md, not read from the double, so a wrong catalogue
entry fails.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

import pytest

from ansible_collections.gpu_ops.cluster.plugins.module_utils.nvidia_gpu import (
    ERROR_COMMAND_FAILED,
    ERROR_DRIVER_NOT_LOADED,
    ERROR_INVALID_FIELD,
    ERROR_NO_DEVICES,
    LEGACY_FIELD_NAMES,
    QUERY_FIELDS,
    classify_output,
    collect_nvidia_smi,
    find_problems,
    parse_query_csv,
    parse_query_xml,
    query_argv,
    run_with_timeout,
    xml_argv,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
DOUBLE = REPO_ROOT / "lab" / "doubles" / "nvidia-smi"
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "nvidia_smi"

# name -> (memory.total MiB, MIG capable, power limit W, default driver), as recorded (lab/doubles/SOURCES.md).
PRODUCTS = {
    "NVIDIA H100 80GB HBM3": (81559, True, 700.0, "565.57.01"),
    "NVIDIA H200": (143771, True, 700.0, "570.86.15"),
    "NVIDIA A100-SXM4-40GB": (40960, True, 400.0, "580.126.09"),
    "NVIDIA A100-SXM4-80GB": (81920, True, 400.0, "535.54.03"),
    "Tesla T4": (15360, False, 70.0, "515.105.01"),
    "NVIDIA L4": (23034, False, 72.0, "550.90.07"),
}
# Per-GPU facts both views carry; compared between the CSV and XML answers.
SHARED_KEYS = (
    "index",
    "uuid",
    "name",
    "pci_bus_id",
    "memory_total_mib",
    "memory_used_mib",
    "mig_mode_current",
    "mig_mode_pending",
    "compute_mode",
    "persistence_mode",
    "ecc_mode_current",
    "ecc_errors_uncorrected_volatile",
    "ecc_errors_uncorrected_aggregate",
    "temperature_c",
    "power_draw_w",
    "power_limit_w",
    "clocks_event_reasons",
)
UUID_PATTERN = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
BUS_ID_PATTERN = re.compile(r"^00000000:[0-9A-F]{2}:[0-9A-F]{2}\.0$")


def recorded(name: str) -> str:
    """A recorded real nvidia-smi output without its leading `#` source lines."""
    lines = (FIXTURES / name).read_text(encoding="utf-8").splitlines(keepends=True)
    return "".join(line for line in lines if not line.startswith("#"))


class Lab:
    """One node's description file, an empty NVML library directory, and a way to run the double against them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.description = root / "gpus.json"
        self.libdir = root / "lib"
        self.libdir.mkdir()

    def describe(self, **values: Any) -> "Lab":
        self.description.write_text(json.dumps(values), encoding="utf-8")
        return self

    def env(self) -> Dict[str, str]:
        env = dict(os.environ)
        env.update(GPU_LAB_GPUS=str(self.description), GPU_LAB_NVML_LIBDIR=str(self.libdir),
                   GPU_LAB_STATE_ROOT=str(self.root / "state"), LC_ALL="C", LANG="C")
        return env

    def run(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(DOUBLE), *args], capture_output=True, text=True, env=self.env(), timeout=30, check=False
        )

    def ok(self, *args: str) -> str:
        result = self.run(*args)
        assert result.returncode == 0, (args, result.returncode, result.stdout, result.stderr)
        return result.stdout


@pytest.fixture
def lab(tmp_path: Path) -> Lab:
    return Lab(tmp_path)


def csv_fields_for(lab: Lab) -> Sequence[str]:
    """QUERY_FIELDS, or their pre-535 names when the double refuses the new ones (as the facts module retries)."""
    first = lab.run(*query_argv("nvidia-smi", QUERY_FIELDS)[1:])
    if first.returncode == 0:
        return QUERY_FIELDS
    assert classify_output(first.stdout)[0] == ERROR_INVALID_FIELD, first.stdout
    return [LEGACY_FIELD_NAMES.get(name, name) for name in QUERY_FIELDS]


def both_views(lab: Lab) -> tuple[List[Dict[str, Any]], Optional[str], Dict[str, Any]]:
    fields = csv_fields_for(lab)
    csv_gpus, csv_driver, problem = parse_query_csv(lab.ok(*query_argv("nvidia-smi", fields)[1:]), fields)
    assert problem is None
    xml_facts, why = parse_query_xml(lab.ok(*xml_argv("nvidia-smi")[1:]))
    assert why is None and xml_facts is not None
    return csv_gpus, csv_driver, xml_facts


# --- The facts module reads the same GPUs from both answers ---------------------------------------------------------


@pytest.mark.parametrize("product", sorted(PRODUCTS))
def test_csv_and_xml_give_the_same_gpus(lab: Lab, product: str) -> None:
    memory, mig_capable, power_limit, default_driver = PRODUCTS[product]
    lab.describe(product=product, count=4, node="gpu-node-0")
    csv_gpus, csv_driver, xml_facts = both_views(lab)

    assert [{key: gpu[key] for key in SHARED_KEYS} for gpu in csv_gpus] == [
        {key: gpu[key] for key in SHARED_KEYS} for gpu in xml_facts["gpus"]
    ]
    assert csv_driver == xml_facts["driver_version"] == default_driver
    assert len(csv_gpus) == 4
    assert [gpu["index"] for gpu in csv_gpus] == [0, 1, 2, 3]
    assert {gpu["name"] for gpu in csv_gpus} == {product}
    assert {gpu["memory_total_mib"] for gpu in csv_gpus} == {memory}
    assert {gpu["power_limit_w"] for gpu in csv_gpus} == {power_limit}
    assert {gpu["mig_mode_current"] for gpu in csv_gpus} == {"disabled" if mig_capable else None}
    assert {gpu["ecc_mode_current"] for gpu in csv_gpus} == {"enabled"}
    assert {gpu["persistence_mode"] for gpu in csv_gpus} == {"enabled"}
    assert {gpu["compute_mode"] for gpu in csv_gpus} == {"Default"}
    assert {gpu["clocks_event_reasons"] == ["gpu_idle"] for gpu in csv_gpus} == {True}
    assert all(UUID_PATTERN.match(gpu["uuid"]) for gpu in csv_gpus)
    assert all(BUS_ID_PATTERN.match(gpu["pci_bus_id"]) for gpu in csv_gpus)
    assert len({gpu["uuid"] for gpu in csv_gpus}) == len({gpu["pci_bus_id"] for gpu in csv_gpus}) == 4
    # Idle: nothing allocated, cool, well under the power limit, no errors.
    assert all(gpu["memory_used_mib"] <= 1 for gpu in csv_gpus)
    assert all(25 <= gpu["temperature_c"] <= 40 for gpu in csv_gpus)
    assert all(0 < gpu["power_draw_w"] < power_limit / 2 for gpu in csv_gpus)
    assert {gpu["ecc_errors_uncorrected_volatile"] for gpu in csv_gpus} == {0}


@pytest.mark.parametrize("product", sorted(PRODUCTS))
def test_the_facts_module_collector_finds_a_healthy_node(lab: Lab, product: str, monkeypatch) -> None:
    memory, mig_capable, _limit, default_driver = PRODUCTS[product]
    lab.describe(product=product, count=8, node="gpu-node-1")
    for key, value in lab.env().items():
        monkeypatch.setenv(key, value)

    facts = collect_nvidia_smi(str(DOUBLE), run_with_timeout, 30.0)

    assert facts["error_kind"] is None, facts["error"]
    assert facts["source"] == "nvidia-smi"
    assert facts["gpu_count"] == 8
    assert facts["driver_version"] == default_driver
    assert facts["cuda_driver_version"]
    assert (
        find_problems(
            facts,
            expected_gpu_count=8,
            expected_driver_branch=default_driver.split(".")[0],
            expected_product=re.compile(re.escape(product)),
            expected_mig_mode="disabled",
        )
        == []
    )
    # The CSV view, completed by the XML one, still holds exactly the described pool.
    assert {gpu["memory_total_mib"] for gpu in facts["gpus"]} == {memory}


def test_injected_faults_are_what_the_facts_module_finds(lab: Lab, monkeypatch) -> None:
    """`labctl fault` writes these: a GPU fallen off the bus and uncorrected ECC errors on another."""
    lab.describe(product="NVIDIA H100 80GB HBM3", count=8, node="gpu-h100-0",
                 faults={"missing_gpus": [3], "ecc_uncorrected": {"0": 2}})
    for key, value in lab.env().items():
        monkeypatch.setenv(key, value)
    facts = collect_nvidia_smi(str(DOUBLE), run_with_timeout, 30.0)
    assert facts["gpu_count"] == 7 and [gpu["index"] for gpu in facts["gpus"]] == list(range(7))
    healthy_buses = [gpu["pci_bus_id"] for gpu in facts["gpus"]]
    lab.describe(product="NVIDIA H100 80GB HBM3", count=8, node="gpu-h100-0")
    all_buses = [gpu["pci_bus_id"] for gpu in collect_nvidia_smi(str(DOUBLE), run_with_timeout, 30.0)["gpus"]]
    assert healthy_buses == all_buses[:3] + all_buses[4:]  # the others keep their bus ids
    assert facts["gpus"][0]["ecc_errors_uncorrected_volatile"] == facts["gpus"][0]["ecc_errors_uncorrected_aggregate"] == 2
    problems = find_problems(facts, expected_gpu_count=8)
    assert problems[0] == "expected 8 GPU(s), found 7"
    assert problems[1].endswith("expected 0 uncorrected ECC errors since the driver loaded, found 2")
    # The XML view (nvidia-smi -q -x) says the same.
    xml_facts, _ = parse_query_xml(lab.describe(product="NVIDIA H100 80GB HBM3", count=8, node="gpu-h100-0",
                                                faults={"ecc_uncorrected": {"0": 2}}).ok(*xml_argv("nvidia-smi")[1:]))
    assert xml_facts["gpus"][0]["ecc_errors_uncorrected_volatile"] == 2


def test_a_version_mismatch_fails_every_call_as_the_recorded_tool_and_the_facts_module_names_it(lab: Lab,
                                                                                                  monkeypatch) -> None:
    """`labctl fault --version-mismatch`: a driver upgraded without a reboot (issue 19's diagnose signature)."""
    lab.describe(product="NVIDIA H100 80GB HBM3", count=8, faults={"nvml_library_version": "550.144"})
    for argv in (("-L",), ("-q", "-x"), ("--query-gpu=index", "--format=csv")):
        result = lab.run(*argv)
        assert (result.returncode, result.stdout) == (18, recorded("error-version-mismatch.txt")), argv
    for key, value in lab.env().items():
        monkeypatch.setenv(key, value)
    facts = collect_nvidia_smi(str(DOUBLE), run_with_timeout, 30.0)
    assert facts["error_kind"] == "version_mismatch" and facts["nvml_version"] == "550.144"
    assert lab.run("-h").returncode == 0


def test_more_products_on_one_node_are_listed_in_bus_order_with_their_pci_ids(lab: Lab) -> None:
    lab.describe(product="NVIDIA H100 80GB HBM3", count=2, more=[{"product": "NVIDIA A100-SXM4-40GB", "count": 2}])
    result = lab.run("--query-gpu=index,name,pci.bus_id,pci.device_id", "--format=csv,noheader")
    assert result.stdout.splitlines() == [
        "0, NVIDIA A100-SXM4-40GB, 00000000:07:00.0, 0x20B010DE",
        "1, NVIDIA A100-SXM4-40GB, 00000000:0F:00.0, 0x20B010DE",
        "2, NVIDIA H100 80GB HBM3, 00000000:18:00.0, 0x233010DE",
        "3, NVIDIA H100 80GB HBM3, 00000000:2A:00.0, 0x233010DE"]


@pytest.mark.parametrize("more, named", [
    ({"product": "NVIDIA L4"}, "more="), ([{"product": "NVIDIA L4", "gpus": 1}], "more[0]="),
    ([{"count": 1}], "more[0].product is missing"), ([{"product": "NVIDIA L4", "count": 16}], "count=18"),
])
def test_a_bad_more_is_refused_by_key(lab: Lab, more: Any, named: str) -> None:
    lab.describe(product="NVIDIA H100 80GB HBM3", count=2, more=more)
    result = lab.run("-L")
    assert result.returncode == 255 and named in result.stderr, result.stderr


@pytest.mark.parametrize("faults, named", [
    ({"missing_gpus": [8]}, "faults.missing_gpus"), ({"ecc_uncorrected": {"0": -1}}, "faults.ecc_uncorrected"),
    ({"xid": 79}, "faults="), ({"nvml_library_version": "new"}, "faults.nvml_library_version"),
])
def test_a_bad_fault_is_refused_by_key(lab: Lab, faults: Mapping[str, Any], named: str) -> None:
    lab.describe(product="NVIDIA H100 80GB HBM3", count=8, faults=faults)
    result = lab.run("-L")
    assert result.returncode == 255 and named in result.stderr


def test_a_pre_535_driver_refuses_the_new_field_names_and_writes_the_old_layout(lab: Lab) -> None:
    lab.describe(product="Tesla T4", count=1, driver_version="515.105.01")
    refused = lab.run("--query-gpu=index,clocks_event_reasons.active", "--format=csv,noheader,nounits")
    assert refused.returncode == 2
    assert lab.ok("--query-gpu=clocks_throttle_reasons.active", "--format=csv,noheader") == "0x0000000000000001\n"
    xml = lab.ok("-q", "-x")
    assert 'SYSTEM "nvsmi_device_v11.dtd"' in xml and "<clocks_throttle_reasons>" in xml
    assert "<power_readings>" in xml and "<gpu_power_readings>" not in xml

    lab.describe(product="Tesla T4", count=1, driver_version="550.54.15")
    xml = lab.ok("-q", "-x")
    assert 'SYSTEM "nvsmi_device_v12.dtd"' in xml and "<clocks_event_reasons>" in xml
    assert "<sram_uncorrectable_parity>" in xml and "<gpu_power_readings>" in xml


def test_headers_and_units_follow_the_format_modifiers(lab: Lab) -> None:
    lab.describe(product="NVIDIA H100 80GB HBM3", count=1, node="n")
    query = "--query-gpu=index,memory.total,power.limit,temperature.gpu"
    with_units = lab.ok(query, "--format=csv").splitlines()
    assert with_units[0] == "index, memory.total [MiB], power.limit [W], temperature.gpu"
    assert re.match(r"^0, 81559 MiB, 700\.00 W, [0-9]+$", with_units[1])
    assert re.match(r"^0, 81559, 700\.00, [0-9]+$", lab.ok(query, "--format=csv,noheader,nounits"))


# --- Listing, errors --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("count", [1, 4, 8])
def test_list_gpus_prints_one_line_per_gpu_with_the_csv_uuids(lab: Lab, count: int) -> None:
    lab.describe(product="NVIDIA H200", count=count, node="gpu-h200-0")
    lines = lab.ok("-L").splitlines()
    matches = [re.match(r"^GPU (\d+): NVIDIA H200 \(UUID: (GPU-[0-9a-f-]+)\)$", line) for line in lines]
    assert len(lines) == count and all(matches)
    uuids = lab.ok("--query-gpu=uuid", "--format=csv,noheader").split()
    assert [match.group(2) for match in matches if match] == uuids
    assert [int(match.group(1)) for match in matches if match] == list(range(count))


def test_an_unknown_field_fails_like_the_real_tool(lab: Lab) -> None:
    lab.describe(product="NVIDIA H100 80GB HBM3", count=2)
    result = lab.run("--query-gpu=index,gpu.magic", "--format=csv,noheader,nounits")
    assert result.returncode == 2
    assert result.stdout == 'Field "gpu.magic" is not a valid field to query.\n\n'
    assert classify_output(result.stdout)[0] == ERROR_INVALID_FIELD


@pytest.mark.parametrize("args", [[], ["-L"], ["-q", "-x"], ["--query-gpu=index", "--format=csv"], ["--version"]])
def test_without_a_description_the_node_has_no_driver(lab: Lab, args: List[str]) -> None:
    result = lab.run(*args)  # no gpus.json written
    assert result.returncode == 9
    assert result.stdout.strip() == recorded("error-driver-not-loaded.txt").strip()
    assert result.stdout.endswith(".\n\n")
    assert classify_output(result.stdout)[0] == ERROR_DRIVER_NOT_LOADED


def test_a_pool_without_gpus_answers_no_devices(lab: Lab) -> None:
    lab.describe(product="NVIDIA L4", count=0)
    result = lab.run("-L")
    assert result.returncode == 6
    assert result.stdout.strip() == recorded("error-no-devices.txt").strip()
    assert classify_output(result.stdout)[0] == ERROR_NO_DEVICES


@pytest.mark.parametrize(
    "description, named",
    [
        ({"product": "NVIDIA H100 80GB HBM3", "count": "8"}, "count='8'"),
        ({"product": "NVIDIA H100 80GB HBM3", "gpus": 8}, "gpus"),
        ({"product": "NVIDIA B300", "count": 8}, "memory_mib is required"),
        ({"count": 8}, "product is missing"),
        ({"product": "NVIDIA H100 80GB HBM3", "driver_version": "latest"}, "driver_version='latest'"),
    ],
)
def test_a_broken_description_is_reported_by_key(lab: Lab, description: Mapping[str, Any], named: str, monkeypatch):
    lab.description.write_text(json.dumps(description), encoding="utf-8")
    result = lab.run("-L")
    assert result.returncode == 255
    assert named in result.stderr and "gpu-lab nvidia-smi double" in result.stderr
    for key, value in lab.env().items():
        monkeypatch.setenv(key, value)
    facts = collect_nvidia_smi(str(DOUBLE), run_with_timeout, 30.0)
    assert facts["error_kind"] == ERROR_COMMAND_FAILED and named in facts["error"]


def test_an_unknown_product_needs_and_uses_the_pools_memory(lab: Lab) -> None:
    lab.describe(product="NVIDIA B300", count=2, memory_mib=275040, mig_capable=True)
    gpus, _driver, _problem = parse_query_csv(lab.ok(*query_argv("nvidia-smi")[1:]))
    assert [(gpu["name"], gpu["memory_total_mib"], gpu["mig_mode_current"]) for gpu in gpus] == [
        ("NVIDIA B300", 275040, "disabled")
    ] * 2


@pytest.mark.parametrize(
    "args, rc, message",
    [
        (["-x"], 2, "Specify -q/--query and -x/--xml-format to run an XML query."),
        (["--query-gpu=index"], 2, '"--format=" switch is missing.'),
        (["--query-gpu=index", "--format=noheader"], 2, "Format modifier --format=csv is mandatory."),
        (["--frobnicate"], 2, "ERROR: Option --frobnicate is not recognized."),
        (["-q", "-x", "-i", "1"], 6, "No devices were found"),  # GPU 1 of a one-GPU node
    ],
)
def test_bad_arguments_are_refused_after_the_driver_check(lab: Lab, args: List[str], rc: int, message: str) -> None:
    lab.describe(product="NVIDIA H100 80GB HBM3", count=1)
    result = lab.run(*args)
    assert (result.returncode, message in result.stdout) == (rc, True), result.stdout


def test_id_selects_gpus_by_index_uuid_or_bus_id(lab: Lab) -> None:
    lab.describe(product="NVIDIA H100 80GB HBM3", count=8, node="n")
    uuid_of_7 = lab.ok("--query-gpu=uuid", "--format=csv,noheader", "-i", "7").strip()
    listed = lab.ok("-L", "-i", "3,{0},0000:2A:00.0".format(uuid_of_7)).splitlines()
    assert [line.split(":")[0] for line in listed] == ["GPU 1", "GPU 3", "GPU 7"]


# --- It says what it is -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_help_says_it_is_a_double_even_without_a_description(lab: Lab, flag: str) -> None:
    first_line = lab.ok(flag).splitlines()[0]  # no gpus.json: help must still work, as the real tool's does
    assert "DOUBLE of nvidia-smi" in first_line
    assert "NOT NVIDIA's" in first_line


def test_the_script_is_a_self_contained_executable_that_names_itself_a_double() -> None:
    text = DOUBLE.read_text(encoding="utf-8")
    assert text.startswith("#!/usr/bin/python3\n")
    assert os.access(DOUBLE, os.X_OK)
    header = "\n".join(text.splitlines()[:8])
    assert "gpu-lab DOUBLE of nvidia-smi" in header and "NOT NVIDIA's nvidia-smi" in header
    imports = re.findall(r"^(?:from|import) ([a-z_.]+)", text, flags=re.MULTILINE)
    assert not [name for name in imports if name.split(".")[0] in ("ansible", "yaml", "pynvml", "lab", "plugins")]


# --- Determinism ------------------------------------------------------------------------------------------------------

ALL_OUTPUTS = (
    [],
    ["-L"],
    ["-q"],
    ["-q", "-x"],
    ["--version"],
    ["--query-gpu=timestamp," + ",".join(QUERY_FIELDS), "--format=csv"],
)


def test_every_output_repeats_exactly(lab: Lab) -> None:
    lab.describe(product="NVIDIA A100-SXM4-40GB", count=4, node="gpu-a100-0")
    first = [lab.ok(*args) for args in ALL_OUTPUTS]
    second = [lab.ok(*args) for args in ALL_OUTPUTS]
    assert first == second


def test_timestamps_are_the_descriptions_not_the_clock(lab: Lab) -> None:
    lab.describe(product="NVIDIA A100-SXM4-80GB", count=1)
    os.utime(lab.description, (1691149470.25, 1691149470.25))  # 2023-08-04, long before any test run
    xml_stamp = re.search(r"<timestamp>(.*)</timestamp>", lab.ok("-q", "-x"))
    assert xml_stamp and xml_stamp.group(1).endswith(" 2023")
    csv_stamp = lab.ok("--query-gpu=timestamp", "--format=csv,noheader").strip()
    assert csv_stamp.startswith("2023/08/0") and csv_stamp.endswith(".250")


def test_uuids_belong_to_the_node_and_the_index(lab: Lab) -> None:
    def uuids(node: str) -> List[str]:
        lab.describe(product="NVIDIA H100 80GB HBM3", count=8, node=node)
        return lab.ok("--query-gpu=uuid", "--format=csv,noheader").split()

    first, again, other = uuids("gpu-h100-0"), uuids("gpu-h100-0"), uuids("gpu-h100-1")
    assert first == again
    assert len(set(first)) == 8
    assert not set(first) & set(other)


# --- Driver version from the installed library ------------------------------------------------------------------------


def install_library(libdir: Path, relative: str, link_from_libdir: bool) -> None:
    """A fake libnvidia-ml.so.<version> where a driver package puts it, with the .so.1 links Debian makes."""
    library = libdir / relative
    library.parent.mkdir(parents=True, exist_ok=True)
    library.write_bytes(b"\x7fELF not really")
    (library.parent / "libnvidia-ml.so.1").symlink_to(library.name)
    if link_from_libdir and library.parent != libdir:
        # update-alternatives: lib/libnvidia-ml.so.1 -> /etc/alternatives/... -> nvidia/current/libnvidia-ml.so.1
        alternative = libdir / "alternatives-libnvidia-ml.so.1"
        alternative.symlink_to(library.parent / "libnvidia-ml.so.1")
        (libdir / "libnvidia-ml.so.1").symlink_to(alternative)


@pytest.mark.parametrize(
    "relative, link_from_libdir, driver, cuda",
    [
        ("nvidia/current/libnvidia-ml.so.535.261.03", True, "535.261.03", "12.2"),  # Debian 12, alternatives set
        ("nvidia/current/libnvidia-ml.so.550.163.01", False, "550.163.01", "12.4"),  # Debian 13, no alternative yet
        ("nvidia/tesla-535/libnvidia-ml.so.535.216.03", True, "535.216.03", "12.2"),  # Debian's tesla-535 flavour
        ("libnvidia-ml.so.570.124.06", True, "570.124.06", "12.8"),  # NVIDIA's packages: straight into the libdir
    ],
)
def test_the_driver_version_follows_the_installed_library(
    lab: Lab, relative: str, link_from_libdir: bool, driver: str, cuda: str
) -> None:
    install_library(lab.libdir, relative, link_from_libdir)
    lab.describe(product="NVIDIA H100 80GB HBM3", count=1)
    xml_facts, _why = parse_query_xml(lab.ok("-q", "-x"))
    assert xml_facts is not None
    assert (xml_facts["driver_version"], xml_facts["cuda_driver_version"]) == (driver, cuda)
    assert lab.ok("--version").splitlines()[2] == "DRIVER version      : " + driver


def test_the_descriptions_driver_version_wins_over_the_library(lab: Lab) -> None:
    install_library(lab.libdir, "nvidia/current/libnvidia-ml.so.535.261.03", True)
    lab.describe(product="NVIDIA H100 80GB HBM3", count=1, driver_version="550.54.15", cuda_version="12.4")
    assert lab.ok("--query-gpu=driver_version", "--format=csv,noheader") == "550.54.15\n"
    assert "CUDA Version: 12.4" in lab.ok()


def test_the_library_the_loader_would_use_wins_over_a_newer_one_beside_it(lab: Lab) -> None:
    # Debian 12 with both flavours installed and the alternative on tesla-535: the loader gets 535, not 550.
    install_library(lab.libdir, "nvidia/current/libnvidia-ml.so.550.163.01", False)
    install_library(lab.libdir, "nvidia/tesla-535/libnvidia-ml.so.535.216.03", True)
    lab.describe(product="NVIDIA A100-SXM4-40GB", count=1)
    assert lab.ok("--query-gpu=driver_version", "--format=csv,noheader") == "535.216.03\n"
    (lab.libdir / "libnvidia-ml.so.1").unlink()  # no alternative chosen: the newest installed library
    assert lab.ok("--query-gpu=driver_version", "--format=csv,noheader") == "550.163.01\n"


@pytest.mark.parametrize("product", sorted(PRODUCTS) + ["NVIDIA B300"])
def test_every_field_the_double_lists_is_answered(lab: Lab, product: str) -> None:
    lab.describe(product=product, count=2, memory_mib=275040, driver_version="550.54.15")
    names = re.findall(r'^"(.+)"$', lab.ok("--help-query-gpu"), flags=re.MULTILINE)
    assert set(QUERY_FIELDS) <= set(names)
    rows = lab.ok("--query-gpu=" + ",".join(names), "--format=csv,noheader").splitlines()
    assert len(rows) == 2 and all(len(row.split(", ")) == len(names) for row in rows)


# --- MIG state --------------------------------------------------------------------------------------------------------
# The MIG role drives the double exactly as it would drive nvidia-smi; the expected texts below are the recorded ones
# (or the double's documented guesses) listed in lab/doubles/SOURCES.md, written out here, not read from the double.

H100 = "NVIDIA H100 80GB HBM3"
BUS_0 = "00000000:18:00.0"  # the first HGX H100 bus


def load_double() -> Any:
    """The double as a module (it has no .py suffix), to compare its MIG table with the project's."""
    import importlib.machinery
    import importlib.util
    import sys

    loader = importlib.machinery.SourceFileLoader("gpu_lab_nvidia_smi_double", str(DOUBLE))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[loader.name] = module  # dataclasses look their module up while the class is built
    loader.exec_module(module)
    return module


def mig_lab(lab: Lab, product: str = H100, count: int = 2, **faults: Any) -> Lab:
    values: Dict[str, Any] = {"product": product, "count": count, "node": "gpu-mig-0"}
    if faults:
        values["faults"] = faults
    return lab.describe(**values)


def modes(lab: Lab) -> List[str]:
    return lab.ok("--query-gpu=index,mig.mode.current,mig.mode.pending", "--format=csv,noheader").splitlines()


def lgi_rows(lab: Lab) -> List[tuple]:
    """(gpu, profile name, profile id, GI id, start, size) from the -lgi table."""
    rows = re.findall(r"^\|\s+(\d+)\s+MIG (\S+)\s+(\d+)\s+(\d+)\s+(\d+):(\d+)\s+\|$", lab.ok("mig", "-lgi"), re.M)
    return [(int(g), name, int(p), int(gi), int(s), int(z)) for g, name, p, gi, s, z in rows]


def test_the_doubles_mig_table_is_the_projects() -> None:
    from ansible_collections.gpu_ops.cluster.plugins.module_utils import mig_profiles

    double = load_double()
    capable = [name for name, product in double.CATALOGUE.items() if product.mig_capable]
    assert sorted(double.MIG_GEOMETRY) == sorted(capable)
    for name, geometry in double.MIG_GEOMETRY.items():
        project = mig_profiles.product(name)
        assert project is not None, name
        assert (geometry.memory_slices, geometry.compute_slices) == (project.memory_slices, project.compute_slices)
        assert [tuple(p) for p in geometry.profiles] == [
            (p.name, p.id, p.compute, p.size, p.starts, p.instances) for p in project.profiles
        ], name
        assert set(geometry.memory_gib) == {p.size for p in project.profiles}


def test_enabling_and_disabling_mig_mode(lab: Lab) -> None:
    mig_lab(lab)
    assert modes(lab) == ["0, Disabled, Disabled", "1, Disabled, Disabled"]
    result = lab.run("-i", "0", "-mig", "1")
    assert (result.returncode, result.stdout) == (0, "Enabled MIG Mode for GPU {0}\nAll done.\n".format(BUS_0))
    assert modes(lab) == ["0, Enabled, Enabled", "1, Disabled, Disabled"]
    xml_facts, _ = parse_query_xml(lab.ok("-q", "-x"))
    assert [(g["mig_mode_current"], g["mig_mode_pending"]) for g in xml_facts["gpus"]] == [
        ("enabled", "enabled"), ("disabled", "disabled")]
    assert lab.ok("--multi-instance-gpu=ENABLED").splitlines()[-1] == "All done."  # no -i: every GPU
    assert modes(lab) == ["0, Enabled, Enabled", "1, Enabled, Enabled"]
    assert lab.ok("-mig", "0", "-i", "1") == "Disabled MIG Mode for GPU 00000000:2A:00.0\nAll done.\n"
    assert modes(lab)[1] == "1, Disabled, Disabled"


def test_mode_persists_under_var_lib_and_instances_live_under_run(lab: Lab) -> None:
    mig_lab(lab)
    lab.ok("-i", "0", "-mig", "1")
    lab.ok("mig", "-i", "0", "-cgi", "19", "-C")
    state = lab.root / "state"
    mode_file = state / "var" / "lib" / "gpu-lab" / "mig-mode.json"
    assert json.loads(mode_file.read_text())["gpus"][BUS_0] == {"current": "Enabled", "pending": "Enabled"}
    instances = json.loads((state / "run" / "gpu-lab" / "mig-instances.json").read_text())["gpus"]
    assert instances == {BUS_0: [{"id": 7, "profile_id": 19, "start": 0, "size": 1, "compute_instances": [0]}]}
    assert "MIG 1g.10gb" in lab.ok("-L")
    # A container restart empties /run (a tmpfs): the instances are gone, the mode is not.
    import shutil

    shutil.rmtree(state / "run")
    assert modes(lab)[0] == "0, Enabled, Enabled"
    result = lab.run("mig", "-lgi")
    assert (result.returncode, result.stdout) == (6, "No GPU instances found: Not Found\n")
    assert "MIG" not in lab.ok("-L")


@pytest.mark.parametrize("args", [["-i", "0", "-mig", "1"], ["-mig", "1"]])
def test_a_gpu_without_mig_refuses_it(lab: Lab, args: List[str]) -> None:
    mig_lab(lab, product="Tesla T4", count=1)
    result = lab.run(*args)
    assert result.stdout.splitlines()[0] == "Unable to enable MIG Mode for GPU 00000000:00:1E.0: Not Supported"
    if "-i" in args:  # named: an error
        assert (result.returncode, result.stdout.splitlines()[1]) == (255, "Terminating early due to previous errors.")
    else:  # all GPUs: the real tool treats it as a warning
        assert (result.returncode, result.stdout.splitlines()[1:]) == (0, ["Treating as warning and moving on.",
                                                                           "All done."])
    assert lab.ok("--query-gpu=mig.mode.current", "--format=csv,noheader") == "[N/A]\n"
    listed = lab.run("mig", "-lgip")
    assert (listed.returncode, listed.stdout) == (6, "No MIG-supported devices found.\n")


@pytest.mark.parametrize("args", [["-lgip"], ["-lgipp"], ["-lgi"], ["-lci"], ["-cgi", "19", "-C"], ["-dci"], ["-dgi"]])
def test_mig_commands_need_mig_mode(lab: Lab, args: List[str]) -> None:
    mig_lab(lab)
    result = lab.run("mig", *args)
    assert (result.returncode, result.stdout) == (6, "No MIG-enabled devices found.\n")


def test_profiles_and_placements_follow_the_table(lab: Lab) -> None:
    mig_lab(lab, count=1)
    lab.ok("-mig", "1")
    table = lab.ok("mig", "-lgip")
    assert table.splitlines()[:5] == [
        "+-----------------------------------------------------------------------------+",
        "| GPU instance profiles:                                                      |",
        "| GPU   Name             ID    Instances   Memory     P2P    SM    DEC   ENC  |",
        "|                              Free/Total   GiB              CE    JPEG  OFA  |",
        "|=============================================================================|",
    ]
    rows = re.findall(r"^\|\s+0\s+MIG (\S+)\s+(\d+)\s+(\d+)/(\d+)\s+([0-9.]+)\s+No", table, re.M)
    assert [(n, int(i), int(f), int(t)) for n, i, f, t, _m in rows] == [
        ("1g.10gb", 19, 7, 7), ("1g.10gb+me", 20, 1, 1), ("1g.20gb", 15, 4, 4), ("2g.20gb", 14, 3, 3),
        ("3g.40gb", 9, 2, 2), ("4g.40gb", 5, 1, 1), ("7g.80gb", 0, 1, 1)]
    assert {len(line) for line in table.splitlines()} == {79}
    assert lab.ok("mig", "-lgipp").splitlines() == [
        "GPU  0 Profile ID 19 Placements: {0,1,2,3,4,5,6}:1",
        "GPU  0 Profile ID 20 Placements: {0,1,2,3,4,5,6}:1",
        "GPU  0 Profile ID 15 Placements: {0,2,4,6}:2",
        "GPU  0 Profile ID 14 Placements: {0,2,4}:2",
        "GPU  0 Profile ID  9 Placements: {0,4}:4",
        "GPU  0 Profile ID  5 Placement : {0}:4",
        "GPU  0 Profile ID  0 Placement : {0}:8",
    ]
    lab.ok("mig", "-cgi", "9")  # 3g.40gb at 0: memory slices 0-3 gone
    free = dict(re.findall(r"^\|\s+0\s+MIG (\S+)\s+\d+\s+(\d+)/\d+", lab.ok("mig", "-lgip"), re.M))
    assert free == {"1g.10gb": "3", "1g.10gb+me": "1", "1g.20gb": "2", "2g.20gb": "1", "3g.40gb": "1",
                    "4g.40gb": "0", "7g.80gb": "0"}
    assert lab.ok("mig", "-lgipp").splitlines()[0] == "GPU  0 Profile ID 19 Placements: {4,5,6}:1"


def test_create_places_each_instance_at_the_lowest_free_start(lab: Lab) -> None:
    mig_lab(lab, count=2)
    lab.ok("-mig", "1")
    out = lab.ok("mig", "-i", "1", "-cgi", "19,1g.10gb,MIG 3g.40gb", "-C")
    assert out.splitlines() == [
        "Successfully created GPU instance ID  7 on GPU  1 using profile MIG 1g.10gb (ID 19)",
        "Successfully created compute instance ID  0 on GPU  1 GPU instance ID  7 using profile MIG 1g.10gb (ID  0)",
        "Successfully created GPU instance ID  8 on GPU  1 using profile MIG 1g.10gb (ID 19)",
        "Successfully created compute instance ID  0 on GPU  1 GPU instance ID  8 using profile MIG 1g.10gb (ID  0)",
        "Successfully created GPU instance ID  2 on GPU  1 using profile MIG 3g.40gb (ID  9)",
        "Successfully created compute instance ID  0 on GPU  1 GPU instance ID  2 using profile MIG 3g.40gb (ID  2)",
    ]
    assert lgi_rows(lab) == [(1, "1g.10gb", 19, 7, 0, 1), (1, "1g.10gb", 19, 8, 1, 1), (1, "3g.40gb", 9, 2, 4, 4)]
    assert {len(line) for line in lab.ok("mig", "-lgi").splitlines()} == {57}


@pytest.mark.parametrize("devices", [
    {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}, {"3g.40gb": 2}, {"1g.20gb": 4}, {"4g.40gb": 1, "3g.40gb": 1},
    {"2g.20gb": 3, "1g.10gb": 1}, {"1g.10gb": 7},
])
def test_placements_agree_with_mig_profiles_first_fit(lab: Lab, devices: Mapping[str, int]) -> None:
    from ansible_collections.gpu_ops.cluster.plugins.module_utils import mig_profiles

    geometry = mig_profiles.product(H100)
    mig_lab(lab, count=1)
    lab.ok("-mig", "1")
    for order in mig_profiles.creation_orders(geometry, devices)[:6]:
        lab.run("mig", "-dgi")
        expected = mig_profiles.first_fit(geometry, order)
        result = lab.run("mig", "-cgi", ",".join(order))
        placed = [(name, start) for _gpu, name, _pid, _gi, start, _size in lgi_rows(lab)] if result.returncode == 0 \
            else None
        assert (result.returncode == 0) == (expected is not None), (order, result.stdout)
        if expected is not None:
            assert sorted(placed) == sorted(expected), order


def test_no_room_fails_and_keeps_what_was_made(lab: Lab) -> None:
    mig_lab(lab, count=1)
    lab.ok("-mig", "1")
    result = lab.run("mig", "-cgi", "9,19,19,14,19", "-C")
    assert result.returncode == 255
    assert result.stdout.splitlines()[-2:] == [
        "Unable to create a GPU instance on GPU  0 using profile 14: Insufficient Resources",
        "Failed to create GPU instances: Insufficient Resources",
    ]
    assert [row[3] for row in lgi_rows(lab)] == [11, 12, 1]  # 1g at 4 and 5, 3g at 0; listed by profile
    assert len(re.findall(r"^  MIG ", lab.ok("-L"), re.M)) == 3
    # The instance limit counts too: one 1g.10gb+me per GPU.
    lab.ok("mig", "-cgi", "20")
    assert lab.run("mig", "-cgi", "1g.10gb+me").returncode == 255
    bad = lab.run("mig", "-cgi", "5g.50gb")
    assert (bad.returncode, bad.stdout.splitlines()[0]) == (
        2, "Unable to create a GPU instance on GPU  0 using profile 5g.50gb: Invalid Argument")


def test_list_and_xml_agree_on_the_mig_devices(lab: Lab, monkeypatch) -> None:
    mig_lab(lab, count=2)
    lab.ok("-mig", "1")
    lab.ok("mig", "-i", "0", "-cgi", "19,19,14,9", "-C")
    listing = lab.ok("-L")
    assert listing == lab.ok("-L")  # UUIDs are stable
    lines = listing.splitlines()
    assert re.match(r"^GPU 0: NVIDIA H100 80GB HBM3 \(UUID: GPU-[0-9a-f-]{36}\)$", lines[0])
    mig_lines = [re.match(r"^  MIG (\S+)\s+Device\s+(\d+): \(UUID: (MIG-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-"
                          r"[0-9a-f]{4}-[0-9a-f]{12})\)$", line) for line in lines[1:5]]
    assert all(mig_lines), lines
    # By GPU instance id: 3g at 4 (GI 2), 2g at 2 (GI 4), 1g at 0 and 1 (GI 7, 8).
    assert [(m.group(1), int(m.group(2))) for m in mig_lines if m] == [
        ("3g.40gb", 0), ("2g.20gb", 1), ("1g.10gb", 2), ("1g.10gb", 3)]
    assert lines[1] == "  MIG 3g.40gb     Device  0: (UUID: {0})".format(mig_lines[0].group(3))
    assert lines[5].startswith("GPU 1: ") and len(lines) == 6
    xml = lab.ok("-q", "-x")
    facts, _ = parse_query_xml(xml)
    devices = facts["gpus"][0]["mig_devices"]
    assert [(d["index"], d["gpu_instance_id"], d["compute_instance_id"]) for d in devices] == [
        (0, 2, 0), (1, 4, 0), (2, 7, 0), (3, 8, 0)]
    assert [d["memory_total_mib"] for d in devices] == [40192, 19968, 9728, 9728]
    assert "<uuid>MIG-" not in xml and "1g.10gb" not in xml  # as driver 535: no names, no MIG UUIDs in the XML
    assert facts["gpus"][1]["mig_devices"] == []
    for key, value in lab.env().items():
        monkeypatch.setenv(key, value)
    collected = collect_nvidia_smi(str(DOUBLE), run_with_timeout, 30.0)
    assert find_problems(collected, expected_mig_mode="enabled") == []


def test_destroying_compute_then_gpu_instances(lab: Lab) -> None:
    mig_lab(lab, count=2)
    lab.ok("-mig", "1")
    lab.ok("mig", "-cgi", "9,19", "-C", "-i", "0")
    lab.ok("mig", "-cgi", "14", "-i", "1")  # no compute instance
    assert re.findall(r"^\|\s+(\d+)\s+(\d+)\s+MIG (\S+)\s+(\d+)\s+(\d+)\s+(\d+:\d+)\s+\|$", lab.ok("mig", "-lci"),
                      re.M) == [("0", "11", "1g.10gb", "0", "0", "0:1"), ("0", "1", "3g.40gb", "2", "0", "0:3")]
    refused = lab.run("mig", "-dgi")
    assert refused.returncode == 255
    assert refused.stdout.splitlines() == [
        "Unable to destroy GPU instance ID  1 from GPU  0: In use by another client",
        "Unable to destroy GPU instance ID 11 from GPU  0: In use by another client",
        "Successfully destroyed GPU instance ID  3 from GPU  1",
        "Failed to destroy GPU instances: In use by another client",
    ]
    disabling = lab.run("-i", "0", "-mig", "0")
    assert (disabling.returncode, disabling.stdout) == (255, "Unable to disable MIG Mode for GPU {0}: In use by "
                                                             "another client\nTerminating early due to previous "
                                                             "errors.\n".format(BUS_0))
    assert lab.ok("mig", "-dci") == (
        "Successfully destroyed compute instance ID  0 from GPU  0 GPU instance ID  1\n"
        "Successfully destroyed compute instance ID  0 from GPU  0 GPU instance ID 11\n")
    nothing = lab.run("mig", "-dci")
    assert (nothing.returncode, nothing.stdout) == (6, "No compute instances found: Not Found\n")
    assert lab.ok("mig", "-dgi", "-i", "0") == (
        "Successfully destroyed GPU instance ID  1 from GPU  0\n"
        "Successfully destroyed GPU instance ID 11 from GPU  0\n")
    gone = lab.run("mig", "-dgi")
    assert (gone.returncode, gone.stdout) == (6, "No GPU instances found: Not Found\n")
    assert lab.ok("-mig", "0").endswith("All done.\n") and modes(lab)[0] == "0, Disabled, Disabled"


def test_compute_instances_can_be_created_apart(lab: Lab) -> None:
    mig_lab(lab, count=1)
    lab.ok("-mig", "1")
    lab.ok("mig", "-cgi", "14,19")
    assert "MIG" not in lab.ok("-L")  # a GPU instance without a compute instance is no MIG device
    assert lab.run("mig", "-lci").returncode == 6
    assert lab.ok("mig", "-cci", "-gi", "9") == (
        "Successfully created compute instance ID  0 on GPU  0 GPU instance ID  9 using profile MIG 1g.10gb (ID  0)\n")
    assert lab.ok("mig", "-cci").splitlines() == [
        "Successfully created compute instance ID  0 on GPU  0 GPU instance ID  3 using profile MIG 2g.20gb (ID  1)"]
    assert lab.run("mig", "-cci", "-gi", "3").returncode == 255  # it has its compute instance already
    assert lab.run("mig", "-cci").stdout == "Failed to create compute instances: Insufficient Resources\n"
    assert len(re.findall(r"^  MIG ", lab.ok("-L"), re.M)) == 2


def test_a_mode_change_can_wait_for_a_reset(lab: Lab) -> None:
    mig_lab(lab, count=2, mig_reset_required=True)
    result = lab.run("-i", "0", "-mig", "1")
    assert result.returncode == 0
    assert result.stdout.splitlines() == [
        "Warning: MIG mode is in pending enable state for GPU {0}:In use by another client".format(BUS_0),
        "{0} is currently being used by one or more other processes (e.g. CUDA application or a monitoring "
        "application such as another instance of nvidia-smi). Please first kill all processes using the device "
        "and retry the command or reboot the system to make MIG mode effective.".format(BUS_0),
        "All done.",
    ]
    assert modes(lab)[0] == "0, Disabled, Enabled"
    assert "<pending_mig>Enabled</pending_mig>" in lab.ok("-q", "-x", "-i", "0")
    assert lab.run("mig", "-lgi").stdout == "No MIG-enabled devices found.\n"
    assert lab.ok("--gpu-reset", "-i", "0") == "GPU {0} was successfully reset.\n".format(BUS_0)
    assert modes(lab) == ["0, Enabled, Enabled", "1, Disabled, Disabled"]


def test_a_restart_makes_a_pending_mode_effective(lab: Lab) -> None:
    import shutil

    mig_lab(lab, count=1, mig_reset_required=True)
    lab.ok("-mig", "1")
    assert modes(lab) == ["0, Disabled, Enabled"]
    assert modes(lab) == ["0, Disabled, Enabled"]  # reading is no reboot
    shutil.rmtree(lab.root / "state" / "run")  # the container restarted: /run is empty again
    assert modes(lab) == ["0, Enabled, Enabled"]
    assert modes(lab) == ["0, Enabled, Enabled"]
    assert (lab.root / "state" / "run" / "gpu-lab" / "booted").exists()


def test_gpu_processes_are_listed_and_hold_the_gpu(lab: Lab) -> None:
    query = "--query-compute-apps=pid,process_name,gpu_uuid,used_memory"
    mig_lab(lab, count=2)
    assert lab.ok(query, "--format=csv") == "pid, process_name, gpu_uuid, used_gpu_memory [MiB]\n"
    assert lab.ok(query, "--format=csv,noheader") == ""
    mig_lab(lab, count=2, processes=[{"index": 1, "pid": 4242, "name": "python3", "used_memory_mib": 1000}])
    uuid_1 = lab.ok("--query-gpu=uuid", "--format=csv,noheader", "-i", "1").strip()
    assert lab.ok(query, "--format=csv,noheader") == "4242, python3, {0}, 1000 MiB\n".format(uuid_1)
    assert lab.ok(query, "--format=csv,noheader,nounits") == "4242, python3, {0}, 1000\n".format(uuid_1)
    assert lab.ok(query, "--format=csv,noheader", "-i", "0") == ""
    assert lab.ok("--query-gpu=memory.used", "--format=csv,noheader,nounits").split() == ["1", "1001"]
    held = lab.run("--gpu-reset", "-i", "1")
    assert held.returncode == 255 and "is currently in use by another process." in held.stdout
    assert "pending enable state" in lab.ok("-i", "1", "-mig", "1")
    assert modes(lab)[1] == "1, Disabled, Enabled"
    assert lab.run(query).returncode == 2  # --format is required, as for --query-gpu
    lab.ok("--gpu-reset", "-i", "0")
    lab.ok("-i", "0", "-mig", "1")
    lab.ok("mig", "-cgi", "19,19", "-C")  # on GPU 0, the one MIG-enabled GPU
    mig_lab(lab, count=2, processes=[{"index": 0, "pid": 4243, "name": "python3", "used_memory_mib": 10}])
    busy = lab.run("mig", "-dci")
    assert busy.returncode == 255 and busy.stdout.splitlines() == [
        "Unable to destroy compute instance ID  0 from GPU  0 GPU instance ID  7: In use by another client",
        "Unable to destroy compute instance ID  0 from GPU  0 GPU instance ID  8: In use by another client",
        "Failed to destroy compute instances: In use by another client",
    ]
    assert len(lgi_rows(lab)) == 2
    assert lab.run("--query-compute-apps=pid,gpu.magic", "--format=csv").returncode == 2


@pytest.mark.parametrize("faults, named", [
    ({"mig_reset_required": "yes"}, "faults.mig_reset_required"),
    ({"processes": [{"index": 9, "pid": 1, "name": "x"}]}, "faults.processes"),
    ({"processes": [{"index": 0, "pid": 1}]}, "faults.processes"),
])
def test_bad_mig_faults_are_refused_by_key(lab: Lab, faults: Mapping[str, Any], named: str) -> None:
    lab.describe(product=H100, count=2, faults=faults)
    result = lab.run("-L")
    assert result.returncode == 255 and named in result.stderr


@pytest.mark.parametrize("args, message", [
    (["mig"], "ERROR: No MIG command given."),
    (["mig", "-lgi", "-lci"], "Invalid combination of input arguments."),
    (["mig", "-cgi"], "ERROR: Option -cgi is missing its value."),
    (["mig", "-lgi", "-C"], "Invalid combination of input arguments."),
    (["mig", "-frob"], "ERROR: Option -frob is not recognized."),
    (["-mig", "2"], 'ERROR: Invalid value "2" for -mig'),
])
def test_bad_mig_arguments(lab: Lab, args: List[str], message: str) -> None:
    mig_lab(lab)
    result = lab.run(*args)
    assert result.returncode == 2 and result.stdout.startswith(message), result.stdout


def test_reading_mig_state_needs_no_write_access(lab: Lab) -> None:
    mig_lab(lab)
    (lab.root / "state").write_text("not a directory")  # nothing can be written there
    assert modes(lab) == ["0, Disabled, Disabled", "1, Disabled, Disabled"]
    result = lab.run("-mig", "1")
    assert result.returncode == 255 and "cannot keep MIG state" in result.stderr

