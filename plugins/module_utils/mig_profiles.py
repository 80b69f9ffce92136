# -*- coding: utf-8 -*-
# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)
"""MIG GPU instance profiles per product, and whether a MIG layout fits a GPU.

A MIG-capable GPU has memory slices (8 on A100, H100 and H200; 4 on A30) and compute slices (7, or 4 on A30). A GPU
instance profile (`nvidia-smi mig -lgip`) takes a fixed run of memory slices that may start only at the offsets
`nvidia-smi mig -lgipp` lists ("placements"), and a number of compute slices (the N of "Ng"). A layout (mig-parted's
`mig-devices: {"1g.10gb": 2, "3g.40gb": 1}`) fits a GPU when every instance gets its own run of memory slices at an
allowed start, no profile is used more often than its instance limit and the compute slices suffice.

Facts, not code, come from NVIDIA's MIG User Guide (the "Supported MIG Profiles" tables of A30, A100 40 GB/80 GB,
H100 80 GB/94 GB, H200 141 GB, B200: profile names, GI profile ids, instance limits, placements). The placements are
the guide's; they were not read off a real `nvidia-smi mig -lgipp` by this project yet (no GPU was lent to it).
tests/unit/test_mig_oracle.py compares the A100 40 GB, H100 80 GB, H200 and B200 tables with NVIDIA's go-nvml mocks.

Standard library only: the facts module, the MIG module and unit tests import it; so may lab tooling.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple


@dataclass(frozen=True)
class Profile:
    """One GPU instance profile as `nvidia-smi mig -lgip` / `-lgipp` show it."""

    name: str  # "1g.10gb", "1g.10gb+me"
    id: int  # the GI profile id ("ID" column of -lgip), what `nvidia-smi mig -cgi <id>` takes
    compute: int  # compute slices (the "1g")
    size: int  # memory slices (the placement's ":Size")
    starts: Tuple[int, ...]  # allowed placement starts (-lgipp)
    instances: int  # most instances of this profile on one GPU (-lgip "Total")

    @property
    def memory_gb(self) -> int:
        """The nominal memory of the name ("10gb" -> 10)."""
        return int(self.name.split(".", 1)[1].split("+", 1)[0][:-2])


@dataclass(frozen=True)
class Product:
    """The MIG geometry of one GPU product."""

    key: str
    memory_slices: int
    compute_slices: int
    profiles: Tuple[Profile, ...]

    def profile(self, name: str) -> Optional[Profile]:
        wanted = canonical_profile_name(name)
        for profile in self.profiles:
            if profile.name == wanted:
                return profile
        return None

    def profile_by_id(self, profile_id: int) -> Optional[Profile]:
        for profile in self.profiles:
            if profile.id == profile_id:
                return profile
        return None

    @property
    def profile_names(self) -> List[str]:
        return [profile.name for profile in self.profiles]


def _eight_slice_profiles(small: int, one_big: int, half: int, full: int) -> Tuple[Profile, ...]:
    """The seven GI profiles every 8-memory-slice product has, from its memory sizes (GB) per profile kind."""
    return (
        Profile(f"1g.{small}gb", 19, 1, 1, (0, 1, 2, 3, 4, 5, 6), 7),
        Profile(f"1g.{small}gb+me", 20, 1, 1, (0, 1, 2, 3, 4, 5, 6), 1),
        Profile(f"1g.{one_big}gb", 15, 1, 2, (0, 2, 4, 6), 4),
        Profile(f"2g.{one_big}gb", 14, 2, 2, (0, 2, 4), 3),
        Profile(f"3g.{half}gb", 9, 3, 4, (0, 4), 2),
        Profile(f"4g.{half}gb", 5, 4, 4, (0,), 1),
        Profile(f"7g.{full}gb", 0, 7, 8, (0,), 1),
    )


_A100_40GB = Product("a100-40gb", 8, 7, _eight_slice_profiles(5, 10, 20, 40))
_80GB = Product("80gb", 8, 7, _eight_slice_profiles(10, 20, 40, 80))
_H100_94GB = Product("h100-94gb", 8, 7, _eight_slice_profiles(12, 24, 47, 94))
_H200 = Product("h200-141gb", 8, 7, _eight_slice_profiles(18, 35, 71, 141))
# B200: names, slices, instance limits and placements as go-nvml's dgxb200 mock answers them (the mock gives NVML's
# profile constants, not the ids `nvidia-smi mig -lgip` prints); the GI profile ids are the other 8-memory-slice
# products', not yet read off a B200 (test_mig_oracle.py compares everything but the ids).
_B200 = Product("b200-180gb", 8, 7, _eight_slice_profiles(23, 45, 90, 180))
_A30 = Product("a30-24gb", 4, 4, (
    Profile("1g.6gb", 14, 1, 1, (0, 1, 2, 3), 4),
    Profile("1g.6gb+me", 21, 1, 1, (0, 1, 2, 3), 1),
    Profile("2g.12gb", 5, 2, 2, (0, 2), 2),
    Profile("2g.12gb+me", 6, 2, 2, (0, 2), 1),
    Profile("4g.24gb", 0, 4, 4, (0,), 1),
))

# NVML product names (as nvidia-smi prints them), lower case, without the "nvidia " prefix.
PRODUCTS: Mapping[str, Product] = {
    "a100-sxm4-40gb": _A100_40GB,
    "a100-pcie-40gb": _A100_40GB,
    "a100-sxm4-80gb": _80GB,
    "a100 80gb pcie": _80GB,
    "h100 80gb hbm3": _80GB,
    "h100 pcie": _80GB,
    "h100 nvl": _H100_94GB,
    "h200": _H200,
    "h200 nvl": _H200,
    "b200": _B200,
    "a30": _A30,
}


def product_key(name: str) -> str:
    key = " ".join(str(name).split()).lower()
    return key[len("nvidia "):] if key.startswith("nvidia ") else key


def product(name: str) -> Optional[Product]:
    """The MIG geometry of an NVML product name, or None when the table does not know it."""
    return PRODUCTS.get(product_key(name))


def canonical_profile_name(name: str) -> str:
    """mig-parted and the device plugin write "1g.10gb"; nvidia-smi prints "MIG 1g.10gb"."""
    text = str(name).strip()
    if text.upper().startswith("MIG "):
        text = text[4:].strip()
    return text.lower()


Placement = Tuple[str, int]  # (profile name, start)


def place(geometry: Product, devices: Mapping[str, int]) -> Optional[List[Placement]]:
    """Placements for every instance of the layout, or None when it does not fit.

    Every assignment of allowed starts is searched (largest instances first), so None means no placement exists at
    all. The result is ordered by start.
    """
    profiles: List[Profile] = []
    for name, count in devices.items():
        profile = geometry.profile(name)
        if profile is None:
            return None
        profiles.extend([profile] * int(count))
    profiles.sort(key=lambda p: (-p.size, -p.compute, p.id))
    if sum(p.compute for p in profiles) > geometry.compute_slices:
        return None
    chosen: List[Placement] = []

    def search(index: int, used: int) -> bool:
        if index == len(profiles):
            return True
        profile = profiles[index]
        for start in profile.starts:
            mask = ((1 << profile.size) - 1) << start
            if start + profile.size <= geometry.memory_slices and not used & mask:
                chosen.append((profile.name, start))
                if search(index + 1, used | mask):
                    return True
                chosen.pop()
        return False

    return sorted(chosen, key=lambda item: item[1]) if search(0, 0) else None


def first_fit(geometry: Product, order: Sequence[str]) -> Optional[List[Placement]]:
    """Where instances created in this order land when each takes the lowest free allowed start, or None."""
    used = 0
    placed: List[Placement] = []
    for name in order:
        profile = geometry.profile(name)
        if profile is None:
            return None
        for start in profile.starts:
            mask = ((1 << profile.size) - 1) << start
            if start + profile.size <= geometry.memory_slices and not used & mask:
                used |= mask
                placed.append((profile.name, start))
                break
        else:
            return None
    return placed


def creation_orders(geometry: Product, devices: Mapping[str, int]) -> List[List[str]]:
    """Distinct orders to create a layout's instances in, the ones lowest-start first-fit can place first.

    NVML chooses where a GPU instance created without a placement goes; NVIDIA's mig-parted therefore tries other
    orders when one fails. The MIG module does the same, starting with the orders that work under first fit.
    """
    names = sorted((canonical_profile_name(n) for n, c in devices.items() for _ in range(int(c))),
                   key=lambda n: (-(geometry.profile(n).size if geometry.profile(n) else 0), n))
    orders = list(dict.fromkeys(itertools.permutations(names)))
    orders.sort(key=lambda order: first_fit(geometry, order) is None)
    return [list(order) for order in orders]


def layout_problems(product_name: str, devices: Mapping[str, int], where: str) -> List[str]:
    """Why a layout cannot be made on one GPU of the product, each message naming `where` (node, GPU) and the fix."""
    geometry = product(product_name)
    if geometry is None:
        return [f"{where}: no MIG profile table for {product_name!r} (known: {', '.join(sorted(PRODUCTS))})"]
    problems: List[str] = []
    for name, count in devices.items():
        profile = geometry.profile(name)
        if profile is None:
            problems.append(f"{where}: profile {name!r} does not exist on {product_name} "
                            f"(its profiles: {', '.join(geometry.profile_names)})")
        elif not isinstance(count, int) or isinstance(count, bool) or count < 0:
            problems.append(f"{where}: profile {name!r} count {count!r} must be a whole number, 0 or more")
        elif count > profile.instances:
            problems.append(f"{where}: profile {name!r} x{count} on {product_name}: at most {profile.instances} "
                            f"fit on one GPU")
    if problems:
        return problems
    if place(geometry, devices) is None:
        compute = sum(geometry.profile(n).compute * c for n, c in devices.items())
        used = ", ".join(f"{n}: {c}" for n, c in sorted(devices.items()))
        problems.append(f"{where}: the layout {{{used}}} does not fit one {product_name} "
                        f"({compute} of {geometry.compute_slices} compute slices; no placement gives every instance "
                        f"its own memory slices; fits for example: {', '.join(example_layouts(geometry))})")
    return problems


def example_layouts(geometry: Product) -> List[str]:
    """A few layouts that fit, for error messages: each profile alone at its most, and a balanced mix."""
    names = [p for p in geometry.profiles if "+me" not in p.name]
    examples = [f"{{{p.name}: {p.instances}}}" for p in names]
    if geometry.memory_slices == 8:
        examples.append(f"{{{names[0].name}: 2, {names[2].name}: 1, {names[3].name}: 1}}")
    return examples


def resource_name(profile_name: str) -> str:
    """The device plugin's mixed-strategy resource for a profile: nvidia.com/mig-1g.10gb (+me as .me)."""
    return "nvidia.com/mig-" + canonical_profile_name(profile_name).replace("+", ".")


def counts(names: Sequence[str]) -> Dict[str, int]:
    """Profile name -> how many, from a list of MIG device profile names."""
    result: Dict[str, int] = {}
    for name in names:
        key = canonical_profile_name(name)
        result[key] = result.get(key, 0) + 1
    return result
