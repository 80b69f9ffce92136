# -*- coding: utf-8 -*-
# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)
"""Filters of the nvidia_dra_driver role: its inputs checked before any change, and the CEL selectors of its
DeviceClasses built in one place (the templates and the tests use the same strings)."""

from __future__ import annotations

import json
from typing import Any, Dict, List, Mapping

from ansible_collections.gpu_ops.cluster.plugins.module_utils import input_forms

ALLOCATION_MODES = ("device-plugin", "dra")
DRIVER = "gpu.nvidia.com"
# The classes the driver itself defines (kubernetes-sigs/dra-driver-nvidia-gpu's chart): product classes must not
# take their names.
DRIVER_CLASSES = ("gpu.nvidia.com", "mig.nvidia.com")


def dra_device_selector(device_type: str, product: str | None = None) -> str:
    """CEL for the driver's devices of one type ('gpu' or 'mig'), optionally of one product (its productName)."""
    expression = f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == '{device_type}'"
    if product is not None:
        expression += f" && device.attributes['{DRIVER}'].productName == '{product}'"
    return expression


def dra_allocation_mode_problems(modes: Mapping[str, Any], variable: str) -> List[str]:
    """One message per node (or '(the cluster)') whose mode is not device-plugin or dra."""
    allowed = " or ".join(ALLOCATION_MODES)
    return [f"{variable}={json.dumps(mode, default=str)} on {node} is not an allocation mode; allowed: {allowed}"
            for node, mode in modes.items() if mode not in ALLOCATION_MODES]


def dra_product_class_problems(classes: Any, variable: str) -> List[str]:
    """Problems of the product classes: a list of {name, product}, names DNS subdomains, unique and not the driver's
    own classes; products one line without quotes or backslashes (they go into a CEL string literal)."""
    if not isinstance(classes, list):
        return [f"{variable}={json.dumps(classes, default=str)} is not a list; allowed: a list of {{name, product}}"]
    problems: List[str] = []
    seen: Dict[str, int] = {}
    for index, entry in enumerate(classes):
        at = f"{variable}[{index}]"
        if not isinstance(entry, Mapping) or set(entry) != {"name", "product"}:
            problems.append(f"{at}={json.dumps(entry, default=str)} is not a product class; allowed: "
                            "a mapping with exactly the keys name and product")
            continue
        name, product = entry["name"], entry["product"]
        problems.extend(input_forms.form_problems(f"{at}.name", "dns_subdomain", name))
        if name in DRIVER_CLASSES:
            problems.append(f"{at}.name={json.dumps(name)} is the driver's own class; allowed: any other name")
        elif isinstance(name, str) and name in seen:
            problems.append(f"{at}.name={json.dumps(name)} is also {variable}[{seen[name]}].name; allowed: "
                            "a name used once")
        if isinstance(name, str):
            seen.setdefault(name, index)
        if not isinstance(product, str) or not product.strip() or any(c in product for c in "'\"\\\n\r"):
            problems.append(f"{at}.product={json.dumps(product, default=str)} is not a product name; allowed: the "
                            "GPU's name as NVML reports it (one line, no quotes or backslashes), e.g. "
                            "\"NVIDIA H100 80GB HBM3\"")
    return problems


class FilterModule:
    def filters(self) -> Dict[str, Any]:
        return {"dra_device_selector": dra_device_selector, "dra_allocation_mode_problems": dra_allocation_mode_problems,
                "dra_product_class_problems": dra_product_class_problems}
