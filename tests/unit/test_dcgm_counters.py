"""The DCGM exporter's counters: the shipped set has what alerts need, and bad counters are named."""

from __future__ import annotations

from pathlib import Path

import yaml

from conftest import load_filter_plugin

ROOT = Path(__file__).resolve().parents[2]
filters = load_filter_plugin("dcgm")

COUNTERS = yaml.safe_load((ROOT / "roles" / "dcgm_exporter" / "vars" / "main.yml").read_text())[
    "_dcgm_exporter_default_counters"]
# What the alert rules and the issue ask for beyond upstream's defaults (ANCHORS: formats worth knowing).
REQUIRED = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE",
            "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
            "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "DCGM_FI_DEV_RETIRED_PENDING", "DCGM_FI_DEV_POWER_VIOLATION",
            "DCGM_FI_DEV_THERMAL_VIOLATION", "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
            "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
            "DCGM_FI_DEV_FB_TOTAL", "DCGM_FI_DEV_FB_USED")


def test_shipped_counters_are_valid_and_complete():
    assert filters.dcgm_counter_problems(COUNTERS) == []
    fields = {counter["field"] for counter in COUNTERS}
    assert [field for field in REQUIRED if field not in fields] == []


def test_bad_counters_are_named():
    problems = filters.dcgm_counter_problems([
        {"field": "DCGM_FI_DEV_GPU_TEMP", "type": "gauge", "help": "t"},
        {"field": "DCGM_FI_DEV_GPU_TEMP", "type": "gauge", "help": "t"},
        {"field": "gpu_temp", "type": "histogram", "help": "a, b"},
        "DCGM_FI_DEV_FB_USED",
    ])
    assert problems == [
        "counter[1].field='DCGM_FI_DEV_GPU_TEMP' repeats counter[0]",
        "counter[2].field='gpu_temp'; allowed: a DCGM field name such as DCGM_FI_DEV_GPU_TEMP",
        "counter[2].type='histogram'; allowed: gauge, counter, label",
        "counter[2].help='a, b'; allowed: one line of text without commas (counters.csv is CSV)",
        "counter[3]='DCGM_FI_DEV_FB_USED'; allowed: a mapping {field, type, help}",
    ]
    assert filters.dcgm_counter_problems([]) == [
        "dcgm_exporter counters=[]; allowed: a non-empty list of {field, type, help}"]


# The pinned exporter release's own etc/default-counters.csv, recorded field by field (tag and commit inside).
UPSTREAM = yaml.safe_load((ROOT / "tests" / "unit" / "fixtures" / "dcgm_exporter" / "default-counters.yml").read_text())
# DCGM fields the role enables that the exporter's default file does not name at all (not even commented out); each
# is a field of DCGM's own table (dcgm_fields.h, through go-dcgm's field-name map), so the exporter accepts it.
OUTSIDE_DEFAULT_FILE = {
    "DCGM_FI_DEV_FB_TOTAL": "gauge",
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": "gauge",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": "gauge",  # DCGM 4's name; DCGM_FI_DEV_CLOCK_THROTTLE_REASONS is deprecated
}


def upstream_problems(counters, upstream, outside):
    """Each counter the role enables that the pinned exporter's default file does not know with the same type, and
    each field upstream enables that the role's set leaves out."""
    fields = upstream["fields"]
    problems = []
    for counter in counters:
        field, kind = counter["field"], counter["type"]
        known = fields.get(field, {}).get("type") or outside.get(field)
        if known is None:
            problems.append(f"{field}: not in the exporter {upstream['tag']}'s etc/default-counters.csv")
        elif known != kind:
            problems.append(f"{field}: type {kind}, the exporter {upstream['tag']}'s file says {known}")
    enabled = {counter["field"] for counter in counters}
    for field, entry in fields.items():
        if entry["enabled"] and field not in enabled:
            problems.append(f"{field}: enabled by the exporter {upstream['tag']}'s defaults but not by the role")
    return problems


def test_fixture_is_of_the_pinned_release():
    defaults = yaml.safe_load((ROOT / "roles" / "dcgm_exporter" / "defaults" / "main.yml").read_text())
    assert UPSTREAM["image_tag"] == defaults["dcgm_exporter_image_tag"]
    assert defaults["dcgm_exporter_image_tag"].startswith(UPSTREAM["tag"] + "-")


def test_every_counter_exists_in_the_pinned_exporters_default_file():
    assert upstream_problems(COUNTERS, UPSTREAM, OUTSIDE_DEFAULT_FILE) == []


def test_upstream_check_can_fail():
    counters = [{"field": "DCGM_FI_DEV_GPU_TEMP", "type": "counter", "help": "t"},
                {"field": "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "type": "gauge", "help": "t"}]
    upstream = {"tag": "9.9.9-9.9.9", "fields": {"DCGM_FI_DEV_GPU_TEMP": {"type": "gauge", "enabled": True},
                                                "DCGM_FI_DEV_GPU_UTIL": {"type": "gauge", "enabled": True},
                                                "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": {"type": "counter", "enabled": False}}}
    assert upstream_problems(counters, upstream, {}) == [
        "DCGM_FI_DEV_GPU_TEMP: type counter, the exporter 9.9.9-9.9.9's file says gauge",
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS: not in the exporter 9.9.9-9.9.9's etc/default-counters.csv",
        "DCGM_FI_DEV_GPU_UTIL: enabled by the exporter 9.9.9-9.9.9's defaults but not by the role"]


def unit_problems(counters, upstream):
    """Each counter whose help text does not state the unit the pinned exporter's file gives it ("(in ns)")."""
    units = {field: entry["unit"] for field, entry in upstream["fields"].items() if "unit" in entry}
    return [f"{counter['field']}: help {counter['help']!r} does not say (in {units[counter['field']]}), as the exporter "
            f"{upstream['tag']}'s file does" for counter in counters
            if counter["field"] in units and f"(in {units[counter['field']]})" not in counter["help"]]


def test_the_help_text_states_the_unit_of_the_pinned_exporter():
    """The violation counters count nanoseconds; help text saying microseconds once led the rules to divide by 1e6."""
    assert {field for field, entry in UPSTREAM["fields"].items() if entry.get("unit") == "ns"} == {
        f"DCGM_FI_DEV_{kind}_VIOLATION" for kind in ("POWER", "THERMAL", "SYNC_BOOST", "BOARD_LIMIT", "LOW_UTIL",
                                                     "RELIABILITY")}
    assert unit_problems(COUNTERS, UPSTREAM) == []
    wrong = [{"field": "DCGM_FI_DEV_POWER_VIOLATION", "type": "counter", "help": "Throttling (in us)."}]
    assert unit_problems(wrong, UPSTREAM) == [
        f"DCGM_FI_DEV_POWER_VIOLATION: help 'Throttling (in us).' does not say (in ns), as the exporter "
        f"{UPSTREAM['tag']}'s file does"]
