"""The MIG tables against NVIDIA's own: go-nvml's mock servers dgxa100, dgxh100, dgxh200 and dgxb200 (go-nvml
v0.13.4-1, pinned in lab/go/nvml-mig-mocks), asked through the NVML interface by lab/go/nvml-mig-mocks/main.go
(`labctl nvml-mig-mocks`, a prerequisite of `make unit`). Compared: each product's GPU instance profiles (name,
compute slices, memory slices, instance limit, placement starts), its slice counts, the double's SM count per slice and
full-size compute instance profile ids, and the PCI device ids the nvidia-smi double answers.

Where a mock contradicts itself (a placement whose size is not its profile's memory in slices: the H100, H200 and B200
mocks give 3g and 7g instances 3 and 7 memory slices and 1g.20gb-like profiles 1 slice at every start, though their
own memory sizes are 4, 8 and 2 slices), its placements are not compared, and the test names those profiles so that a
go-nvml that fixes them fails here and gets compared in full. The mocks' PCI ids for H200 (0x233310DE) and B200
(0x2B0010DE) are not the products' (mig-parted's published config-default.yaml selects H200 141GB by 0x233510DE and
B200 by 0x290110DE), so only the A100 and H100 ids are compared."""

from __future__ import annotations

import math
from typing import Any, Dict, List, Tuple

import pytest

from ansible_collections.gpu_ops.cluster.plugins.module_utils import mig_profiles

from conftest import nvml_mig_mocks
from test_nvidia_smi_double import load_double

DOUBLE = load_double()

# Mock -> the name nvidia-smi prints for a real GPU of that kind (the tables' key). The mocks call theirs
# "Mock NVIDIA A100-SXM4-40GB", "NVIDIA H200 141GB HBM3e", "NVIDIA B200 180GB HBM3e".
PRODUCT_OF_MOCK = {"dgxa100": "NVIDIA A100-SXM4-40GB", "dgxh100": "NVIDIA H100 80GB HBM3",
                   "dgxh200": "NVIDIA H200", "dgxb200": "NVIDIA B200"}
# (mock, profile) whose placements contradict the mock's own memory size (see the module's docstring).
MOCK_CONTRADICTIONS = {(mock, profile) for mock, names in {
    "dgxh100": ("1g.20gb", "3g.40gb", "7g.80gb"),
    "dgxh200": ("1g.35gb", "3g.71gb", "7g.141gb"),
    "dgxb200": ("1g.45gb", "3g.90gb", "7g.180gb"),
}.items() for profile in names}
PCI_IDS_COMPARED = ("dgxa100", "dgxh100")


@pytest.fixture(scope="module")
def mocks() -> Dict[str, Dict[str, Any]]:
    answer = nvml_mig_mocks()
    assert answer["schema"] == 1
    return {gpu["mock"]: gpu for gpu in answer["gpus"]}


def profile_name(gi: Dict[str, Any], slice_mb: int) -> str:
    """The name nvidia-smi gives a GPU instance profile: compute slices, memory in whole GB rounded up, +me for
    NVML's 1_SLICE_REV1 (the one-slice profile with the media engines)."""
    media = "+me" if gi["profile_name"] == "1_SLICE_REV1" else ""
    return f"{gi['slice_count']}g.{math.ceil(gi['memory_size_mb'] / 1024)}gb{media}"


def nvidia_view(gpu: Dict[str, Any]) -> Tuple[Dict[str, Dict[str, Any]], set]:
    """name -> {compute, size, instances, starts, sm, ci_full} from one mock, and the names whose placements the mock
    contradicts."""
    profiles = gpu["gpu_instance_profiles"]
    slice_mb = next(gi["memory_size_mb"] for gi in profiles if gi["profile_name"] == "1_SLICE")
    view, contradicted = {}, set()
    for gi in profiles:
        name = profile_name(gi, slice_mb)
        size = round(gi["memory_size_mb"] / slice_mb)
        if any(p["size"] != size for p in gi["placements"]):
            contradicted.add(name)
        full = [ci["profile"] for ci in gi["compute_instance_profiles"] if ci["slice_count"] == gi["slice_count"]]
        view[name] = {"compute": gi["slice_count"], "size": size, "instances": gi["instance_count"],
                      "starts": tuple(p["start"] for p in gi["placements"]),
                      "sm": gi["multiprocessor_count"] // gi["slice_count"], "ci_full": full}
    return view, contradicted


def differences(ours: Dict[str, Dict[str, Any]], theirs: Dict[str, Dict[str, Any]], skip_starts: set) -> List[str]:
    found = []
    if set(ours) != set(theirs):
        found.append(f"profiles: ours {sorted(ours)}, NVIDIA's {sorted(theirs)}")
    for name in sorted(set(ours) & set(theirs)):
        for key in ("compute", "size", "instances", "starts"):
            if key == "starts" and name in skip_starts:
                continue
            if ours[name][key] != theirs[name][key]:
                found.append(f"{name} {key}: ours {ours[name][key]}, NVIDIA's {theirs[name][key]}")
    return found


def table_view(profiles) -> Dict[str, Dict[str, Any]]:
    return {p.name: {"compute": p.compute, "size": p.size, "instances": p.instances, "starts": tuple(p.starts)}
            for p in profiles}


@pytest.mark.parametrize("mock", sorted(PRODUCT_OF_MOCK))
def test_the_projects_mig_table_matches_nvidias_mock(mocks, mock):
    theirs, contradicted = nvidia_view(mocks[mock])
    assert {(mock, name) for name in contradicted} == {c for c in MOCK_CONTRADICTIONS if c[0] == mock}
    geometry = mig_profiles.product(PRODUCT_OF_MOCK[mock])
    assert geometry is not None, f"no MIG table for {PRODUCT_OF_MOCK[mock]}"
    assert differences(table_view(geometry.profiles), theirs, contradicted) == []
    whole = max(theirs.values(), key=lambda p: p["compute"])
    assert (geometry.memory_slices, geometry.compute_slices) == (whole["size"], whole["compute"])


@pytest.mark.parametrize("mock", sorted(m for m in PRODUCT_OF_MOCK if PRODUCT_OF_MOCK[m] in DOUBLE.MIG_GEOMETRY))
def test_the_nvidia_smi_doubles_mig_table_matches_nvidias_mock(mocks, mock):
    theirs, contradicted = nvidia_view(mocks[mock])
    geometry = DOUBLE.MIG_GEOMETRY[PRODUCT_OF_MOCK[mock]]
    assert differences(table_view(geometry.profiles), theirs, contradicted) == []
    assert {p["sm"] for p in theirs.values()} == {geometry.sm_per_slice}
    # The compute instance spanning a whole GPU instance: the profile id -cgi -C gives it, by compute slices.
    for name, profile in theirs.items():
        assert DOUBLE.CI_PROFILE_ID[profile["compute"]] in profile["ci_full"], name


@pytest.mark.parametrize("mock", PCI_IDS_COMPARED)
def test_the_double_answers_nvidias_pci_device_ids(mocks, mock):
    product = DOUBLE.CATALOGUE[PRODUCT_OF_MOCK[mock]]
    assert "0x" + product.pci_device_id == mocks[mock]["pci_device_id"]


def test_the_mocks_pci_ids_not_compared_are_still_what_this_test_says(mocks):
    assert {m: g["pci_device_id"] for m, g in mocks.items() if m not in PCI_IDS_COMPARED} == {
        "dgxh200": "0x233310DE", "dgxb200": "0x2B0010DE"}
    assert DOUBLE.CATALOGUE["NVIDIA H200"].pci_device_id == "233510DE"
