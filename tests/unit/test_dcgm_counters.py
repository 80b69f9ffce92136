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
