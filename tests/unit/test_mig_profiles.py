"""MIG profile tables and the placement search (plugins/module_utils/mig_profiles.py)."""

import pytest

from ansible_collections.gpu_ops.cluster.plugins.module_utils import mig_profiles as mp


@pytest.mark.parametrize("name, key", [
    ("NVIDIA A100-SXM4-40GB", "a100-40gb"), ("NVIDIA A100-SXM4-80GB", "80gb"), ("NVIDIA H100 80GB HBM3", "80gb"),
    ("NVIDIA H100 NVL", "h100-94gb"), ("NVIDIA H200", "h200-141gb"), ("nvidia  h200", "h200-141gb"), ("NVIDIA A30", "a30-24gb"),
])
def test_products_by_nvml_name(name, key):
    assert mp.product(name).key == key


def test_unknown_and_non_mig_products():
    assert mp.product("NVIDIA L4") is None
    assert mp.layout_problems("NVIDIA L4", {"1g.10gb": 1}, "node gpu-0, GPU 0") == [
        "node gpu-0, GPU 0: no MIG profile table for 'NVIDIA L4' (known: " + ", ".join(sorted(mp.PRODUCTS)) + ")"]


def test_profile_ids_and_names_h200():
    h200 = mp.product("NVIDIA H200")
    assert {p.name: p.id for p in h200.profiles} == {
        "1g.18gb": 19, "1g.18gb+me": 20, "1g.35gb": 15, "2g.35gb": 14, "3g.71gb": 9, "4g.71gb": 5, "7g.141gb": 0}
    assert h200.profile("MIG 3g.71gb").memory_gb == 71


@pytest.mark.parametrize("devices", [
    {"1g.10gb": 7}, {"1g.20gb": 4}, {"2g.20gb": 3}, {"3g.40gb": 2}, {"4g.40gb": 1}, {"7g.80gb": 1},
    {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}, {"4g.40gb": 1, "3g.40gb": 1}, {"2g.20gb": 3, "1g.20gb": 1},
    {"2g.20gb": 3, "1g.10gb": 1}, {"4g.40gb": 1, "2g.20gb": 1, "1g.10gb": 1}, {"1g.10gb+me": 1, "1g.10gb": 6}, {},
])
def test_layouts_that_fit_an_h100(devices):
    geometry = mp.product("NVIDIA H100 80GB HBM3")
    placed = mp.place(geometry, devices)
    assert placed is not None and len(placed) == sum(devices.values())
    used = set()
    for name, start in placed:
        profile = geometry.profile(name)
        assert start in profile.starts
        slices = set(range(start, start + profile.size))
        assert not used & slices and max(slices) < 8
        used |= slices
    assert mp.layout_problems("NVIDIA H100 80GB HBM3", devices, "n") == []


def test_balanced_layout_placements_and_creation_order():
    h100 = mp.product("NVIDIA H100 80GB HBM3")
    balanced = {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}
    # 1g.10gb may not start at slice 7: the 3g.40gb must take the upper half.
    assert mp.place(h100, balanced) == [("2g.20gb", 0), ("1g.10gb", 2), ("1g.10gb", 3), ("3g.40gb", 4)]
    # Largest first under lowest-start first fit strands the last 1g.10gb; the orders that work come first.
    assert mp.first_fit(h100, ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]) is None
    orders = mp.creation_orders(h100, balanced)
    assert len(orders) == 12 and len({tuple(o) for o in orders}) == 12
    assert mp.first_fit(h100, orders[0]) is not None
    assert mp.creation_orders(h100, {"1g.10gb": 7}) == [["1g.10gb"] * 7]


@pytest.mark.parametrize("devices, words", [
    ({"7g.80gb": 1, "1g.10gb": 1}, "does not fit one NVIDIA H100 80GB HBM3 (8 of 7 compute slices"),
    ({"4g.40gb": 1, "2g.20gb": 2}, "does not fit"),
    ({"3g.40gb": 2, "1g.10gb": 1}, "does not fit"),
    ({"1g.10gb": 8}, "profile '1g.10gb' x8 on NVIDIA H100 80GB HBM3: at most 7 fit on one GPU"),
    ({"1g.10gb+me": 2}, "at most 1 fit"),
    ({"1g.5gb": 1}, "profile '1g.5gb' does not exist on NVIDIA H100 80GB HBM3 (its profiles: 1g.10gb, 1g.10gb+me"),
    ({"1g.10gb": -1}, "count -1 must be a whole number"),
    ({"1g.10gb": "2"}, "count '2' must be a whole number"),
])
def test_layouts_refused_with_reason(devices, words):
    problems = mp.layout_problems("NVIDIA H100 80GB HBM3", devices, "node gpu-h100-0, GPU 1")
    assert len(problems) == 1
    assert problems[0].startswith("node gpu-h100-0, GPU 1: ")
    assert words in problems[0]


def test_refusal_lists_layouts_that_fit_and_they_do():
    message = mp.layout_problems("NVIDIA A100-SXM4-40GB", {"4g.20gb": 1, "2g.10gb": 2}, "x")[0]
    assert "fits for example: {1g.5gb: 7}" in message
    geometry = mp.product("NVIDIA A100-SXM4-40GB")
    for example in mp.example_layouts(geometry):
        pairs = dict(item.split(": ") for item in example.strip("{}").split(", "))
        assert mp.place(geometry, {k: int(v) for k, v in pairs.items()}) is not None


def test_a30_has_four_slices():
    a30 = mp.product("NVIDIA A30")
    assert mp.place(a30, {"2g.12gb": 1, "1g.6gb": 2}) == [("2g.12gb", 0), ("1g.6gb", 2), ("1g.6gb", 3)]
    assert mp.place(a30, {"4g.24gb": 1, "1g.6gb": 1}) is None


def test_resource_names_and_counts():
    assert mp.resource_name("MIG 1g.10gb+me") == "nvidia.com/mig-1g.10gb.me"
    assert mp.counts(["MIG 1g.10gb", "1g.10gb", "MIG 3g.40gb"]) == {"1g.10gb": 2, "3g.40gb": 1}


def test_every_table_is_consistent():
    for key, geometry in mp.PRODUCTS.items():
        for profile in geometry.profiles:
            assert profile.instances == len([s for s in profile.starts if s + profile.size <= geometry.memory_slices]) \
                or "+me" in profile.name or profile.compute * profile.instances <= geometry.compute_slices, (key, profile)
            # Each profile alone at its limit fits.
            assert mp.place(geometry, {profile.name: profile.instances}) is not None, (key, profile.name)
