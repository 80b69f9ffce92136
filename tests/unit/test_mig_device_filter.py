"""mig-parted's device-filter, as its published configs use it: the project's own config file in that shape
(fixtures/mig_parted/device-filter-configs.yaml) is accepted as written and each GPU of a node, products mixed, gets
the entry mig-parted would give it (api/spec/v1 MatchesDeviceFilter / MatchesDevices, walked in entry order by
WalkSelectedMigConfigForEachGPU; apply skips GPUs without MIG under `devices: all`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from ansible_collections.gpu_ops.cluster.plugins.filter.mig import nvidia_mig_config_problems
from ansible_collections.gpu_ops.cluster.plugins.module_utils import mig_layout as ml

from test_nvidia_mig import Node, clean_env  # noqa: F401 (the fixture, so GPU_LAB_* never leak between tests)

CONFIGS = yaml.safe_load((Path(__file__).parent / "fixtures" / "mig_parted" / "device-filter-configs.yaml")
                         .read_text())["mig-configs"]

H100 = ("NVIDIA H100 80GB HBM3", "0x233010DE", "0x16C110DE")
H100_OTHER_BOARD = ("NVIDIA H100 80GB HBM3", "0x233010DE", "0x16C010DE")
A100_40 = ("NVIDIA A100-SXM4-40GB", "0x20B010DE", "0x134F10DE")
A30 = ("NVIDIA A30", "0x20B710DE", "0x153210DE")
H200 = ("NVIDIA H200", "0x233510DE", None)
L4 = ("NVIDIA L4", "0x27B810DE", "0x16CA10DE")


def gpu(index, product, mode="disabled"):
    name, device_id, sub_id = product
    capable = name != "NVIDIA L4"
    return {"index": index, "name": name, "uuid": f"GPU-{index}", "pci_device_id": device_id,
            "pci_sub_system_id": sub_id, "mig_mode": mode if capable else None, "mig_mode_pending": None,
            "mig_mode_raw": "Disabled" if capable else "[N/A]", "mig_capable": capable, "instances": []}


# One node, products mixed, as a GPU Operator user's heterogeneous pool can have them.
MIXED = [gpu(0, H100), gpu(1, H100_OTHER_BOARD), gpu(2, A100_40), gpu(3, A100_40), gpu(4, A30), gpu(5, H200),
         gpu(6, L4)]


def layouts(config, gpus=MIXED):
    wanted, problems = ml.desired_by_gpu(CONFIGS[config], gpus, f"config {config!r}")
    assert problems == []
    assert ml.fit_problems(gpus, wanted, "gpu-mixed-0") == []
    return {index: want["devices"] if want["enabled"] else "disabled" for index, want in wanted.items()}


def test_the_published_shape_is_accepted_as_written():
    assert ml.configs_problems(CONFIGS) == []
    for name in CONFIGS:
        assert nvidia_mig_config_problems(CONFIGS, name, {}) == []
        assert ml.entry_problems(CONFIGS[name], f"config {name!r}") == []


def test_each_gpu_gets_the_entry_its_pci_id_selects_and_unmatched_gpus_stay_as_they_are():
    assert layouts("all-1g.10gb") == {0: {"1g.10gb": 7}, 1: {"1g.10gb": 7}, 2: {"1g.10gb": 4}, 3: {"1g.10gb": 4}}
    assert layouts("all-balanced") == {
        0: {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}, 1: {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1},
        2: {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}, 3: {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1},
        4: {"1g.6gb": 2, "2g.12gb": 1}, 5: {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}}
    # devices: all without a filter takes every GPU that can do MIG; the L4 (6) is skipped, as mig-parted skips it.
    assert layouts("all-disabled") == {i: "disabled" for i in range(6)}


def test_indexes_case_later_entries_and_subsystem_ids():
    # GPU 0's board (subsystem 0x16C1) matches the subsystem-qualified id; GPU 1's does not. Later entries win.
    assert layouts("h100-split", [gpu(0, H100), gpu(1, H100), gpu(2, A100_40)]) == {
        0: {"3g.40gb": 2}, 1: {"1g.10gb": 7}, 2: "disabled"}
    assert layouts("h100-split", [gpu(0, H100_OTHER_BOARD), gpu(1, H100_OTHER_BOARD)]) == {
        0: {"3g.40gb": 2}, 1: {"3g.40gb": 2}}


@pytest.mark.parametrize("device_filter, product, matches", [
    ("0x233010DE", H100, True),
    ("0x233010de", H100, True),      # hex digits of any case
    ("0X233010DE", H100, True),      # Go's ParseUint(s, 0, 32) takes 0X too
    ("590352606", H100, True),       # no prefix: decimal (0x233010DE)
    ("0x2330_10DE", H100, True),     # Go literal underscores
    ("0x233110DE", H100, False),     # H100 PCIe is another device
    ("0x233010DF", H100, False),     # the vendor half counts
    ("0x233010DE:0x16C110DE", H100, True),
    ("0x233010DE:0x16C110DE", H100_OTHER_BOARD, False),
    (["0x20B010DE", "0x233010DE"], H100, True),
    (["0x20B010DE"], H100, False),
    ("", H100, True),                # mig-parted: an empty filter is no filter
    ([], A30, True),
    (None, L4, True),
])
def test_matching_follows_mig_parted(device_filter, product, matches):
    assert ml.matches_device_filter(device_filter, gpu(0, product)) is matches


@pytest.mark.parametrize("device_filter, words", [
    (0x233010DE, "device-filter=590352606: must be a PCI device id string or a list of them, quoted"),
    (["0x233010DE", 0x20B010DE], "device-filter=['0x233010DE', 548409566]: must be a PCI device id string"),
    ("233010DE", "device-filter='233010DE': not a PCI id mig-parted can read"),
    (["0x233010DE", "H100"], "device-filter[1]='H100': not a PCI id mig-parted can read"),
    ("0x1233010DE", "device-filter='0x1233010DE': not a PCI id"),  # over 32 bits
    ("0x233010DE:0x16C110DE:0x1", "not a PCI id"),
])
def test_bad_filters_are_refused_before_any_change_naming_the_path(device_filter, words):
    configs = {"x": [{"device-filter": device_filter, "devices": "all", "mig-enabled": False}]}
    problems = nvidia_mig_config_problems(configs, "x", {})
    assert any(p.startswith("nvidia_mig_configs['x'][0].") and words in p for p in problems), problems


EXPECTED_BY_PRODUCT = {
    "all-1g.10gb": {"NVIDIA H100 80GB HBM3": ["1g.10gb"] * 7, "NVIDIA A100-SXM4-80GB": ["1g.10gb"] * 7,
                    "NVIDIA A100-SXM4-40GB": ["1g.10gb"] * 4, "NVIDIA H200": [], "NVIDIA L4": []},
    "all-balanced": {"NVIDIA H100 80GB HBM3": ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"],
                     "NVIDIA A100-SXM4-80GB": ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"],
                     "NVIDIA A100-SXM4-40GB": ["1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb"],
                     "NVIDIA H200": ["1g.18gb", "1g.18gb", "2g.35gb", "3g.71gb"], "NVIDIA L4": []},
}


@pytest.mark.parametrize("config", sorted(EXPECTED_BY_PRODUCT))
def test_a_node_of_mixed_products_gets_each_products_entry_through_the_double(tmp_path, config):
    """The module reads each GPU's pci.device_id from the node's nvidia-smi and applies the entry it selects."""
    node = Node(tmp_path, product="NVIDIA H100 80GB HBM3", count=1)
    description = {"product": "NVIDIA H100 80GB HBM3", "count": 1, "driver_version": "580.105.08",
                   "cuda_version": "13.0", "node": "gpu-mixed-0",
                   "more": [{"product": p, "count": 1} for p in ("NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-40GB",
                                                                 "NVIDIA H200", "NVIDIA L4")]}
    node.description.write_text(json.dumps(description))
    gpus = node.host.read()
    assert sorted(g["pci_device_id"] for g in gpus) == sorted(
        ["0x233010DE", "0x20B210DE", "0x20B010DE", "0x233510DE", "0x27B810DE"])
    result = node.apply(CONFIGS[config])
    changed = sorted(a["index"] for a in result["plan"])
    assert changed == sorted(g["index"] for g in gpus if EXPECTED_BY_PRODUCT[config][g["name"]])
    after = node.host.read()
    assert {g["index"]: sorted(d["profile"] for d in g["mig_devices"]) for g in after} == {
        g["index"]: EXPECTED_BY_PRODUCT[config][g["name"]] for g in after}
    assert node.apply(CONFIGS[config])["changed"] is False
