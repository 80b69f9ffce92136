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
# The DeviceClasses NVIDIA's DRA driver chart defines (kubernetes-sigs/dra-driver-nvidia-gpu,
# deployments/helm/dra-driver-nvidia-gpu/templates/deviceclass-{gpu,mig,vfio-gpu,compute-domain-daemon,
# compute-domain-default-channel}.yaml, v0.4.0 on): reserved, so a product class must not take one of their names,
# even where this role does not create the class (a cluster may run the chart, or enable it later).
DRIVER_CLASSES = ("gpu.nvidia.com", "mig.nvidia.com", "vfio.gpu.nvidia.com", "compute-domain-daemon.nvidia.com",
                  "compute-domain-default-channel.nvidia.com")


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


def _branch_of(version: Any) -> int | None:
    """The branch (major number) of a driver branch or version: "580" -> 580, "565.57.01" -> 565; None otherwise.
    It judges any leading number ("99" is refused) where support_matrix.branch_of takes three digits or more and
    leaves the rest unjudged; kept so, since nothing else in this role checks the branch's form."""
    head = str(version or "").strip().split(".", 1)[0]
    return int(head) if head.isdigit() else None


def dra_node_support_problems(nodes: Any, hostvars: Mapping[str, Any], node_role_defaults: Mapping[str, Any],
                              min_branch: int) -> List[str]:
    """One message per node in dra mode whose container runtime gets no CDI spec or whose driver branch is older than
    the DRA driver supports. What the node roles are told comes from the node's inventory (hostvars), else their
    defaults (node_role_defaults); the branch, when the inventory leaves it to the OS, from the node's facts
    (nvidia_gpu_facts' driver_version, e.g. from the fact cache) when known."""
    problems: List[str] = []
    for node in nodes or []:
        node_vars = hostvars.get(node) or {}
        cdi = node_vars.get("nvidia_container_toolkit_cdi", node_role_defaults.get("nvidia_container_toolkit_cdi"))
        if cdi != "auto":
            problems.append(
                f"nvidia_container_toolkit_cdi={json.dumps(cdi, default=str)} on {node}: dra mode needs CDI in the "
                "node's container runtime (the DRA driver hands GPUs to containers as CDI devices); allowed: \"auto\" "
                f"(the container toolkit generates the CDI spec), or leave {node} in device-plugin mode")
        branch = node_vars.get("nvidia_driver_branch", node_role_defaults.get("nvidia_driver_branch"))
        # A branch the inventory names is judged; left to the OS's default, the driver the node's facts report.
        installed = None if str(branch or "").strip() else \
            ((node_vars.get("ansible_facts") or {}).get("nvidia_gpu") or {}).get("driver_version")
        number = _branch_of(branch if installed is None else installed)
        if number is None or number >= min_branch:
            continue
        if installed is None:
            problems.append(
                f"nvidia_driver_branch={json.dumps(branch, default=str)} on {node}: the DRA driver for GPUs "
                f"supports driver branch {min_branch} or newer; allowed: \"{min_branch}\" or a newer branch, or "
                f"leave {node} in device-plugin mode")
        else:
            problems.append(
                f"nvidia_driver_branch={json.dumps(branch, default=str)} on {node} (the OS's default branch) and its "
                f"facts report driver {installed}: the DRA driver for GPUs supports driver branch {min_branch} or "
                f"newer; allowed: nvidia_driver_branch \"{min_branch}\" or newer, or leave {node} in device-plugin mode")
    return problems


def dra_product_class_problems(classes: Any, variable: str) -> List[str]:
    """Problems of the product classes: a list of {name, product}, names DNS subdomains, unique and none of the
    driver's classes (DRIVER_CLASSES); products one line without quotes or backslashes (they go into a CEL string literal)."""
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
            problems.append(f"{at}.name={json.dumps(name)} is a DeviceClass NVIDIA's DRA driver defines; allowed: a "
                            f"name other than {', '.join(DRIVER_CLASSES)}")
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
                "dra_product_class_problems": dra_product_class_problems,
                "dra_node_support_problems": dra_node_support_problems}
