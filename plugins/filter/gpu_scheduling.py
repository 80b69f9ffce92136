# -*- coding: utf-8 -*-
# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)
"""GPU node labels from a node's GPU facts (the labels GPU feature discovery would set) and the checks of the
gpu_scheduling role's labels and RuntimeClass settings."""

from __future__ import annotations

import re
from typing import Any, Dict, List

from ansible_collections.gpu_ops.cluster.plugins.module_utils.k8s_values import is_dns_label, is_dns_subdomain, is_label_key, is_label_value


def label_value(text: str) -> str:
    """A product name as GPU feature discovery writes it: spaces become '-', other characters a label value cannot
    hold are dropped, at most 63 characters ("NVIDIA H100 80GB HBM3" -> "NVIDIA-H100-80GB-HBM3")."""
    value = re.sub(r"[^-A-Za-z0-9_.]", "", re.sub(r"\s+", "-", text.strip()))[:63]
    return value.strip("-_.")


def gpu_node_labels(facts: Any) -> Dict[str, str]:
    """GFD-style labels from ansible_facts['nvidia_gpu'] (nvidia_gpu_facts); {} when the facts hold no GPU."""
    if not isinstance(facts, dict) or not facts.get("gpu_count") or not facts.get("gpus"):
        return {}
    first = facts["gpus"][0]
    labels = {"nvidia.com/gpu.count": str(facts["gpu_count"])}
    if first.get("name"):
        labels["nvidia.com/gpu.product"] = label_value(first["name"])
    if first.get("memory_total_mib"):
        labels["nvidia.com/gpu.memory"] = str(int(first["memory_total_mib"]))
    if facts.get("driver_version"):
        labels["nvidia.com/cuda.driver-version.full"] = label_value(str(facts["driver_version"]))
    return labels


POOL_LABEL = "gpu-cluster.dev/pool"


def gpu_nodes_labels(nodes: Any, hostvars: Any, from_facts: bool = True, extra: Any = None) -> Dict[str, Dict[str, Any]]:
    """{node: labels} for every GPU node in one pass: nvidia.com/gpu.present, the GFD-style labels of its facts
    (when from_facts), its pool (host variable gpu_scheduling_node_pool) and the extra labels, later ones winning.

    Values are passed through as they are (a pool given as a number stays a number) for gpu_scheduling_problems to
    name; one expression instead of a set_fact loop, whose cost grows with the square of the number of nodes.
    """
    labels: Dict[str, Dict[str, Any]] = {}
    for node in nodes or []:
        host = hostvars[node]
        node_labels: Dict[str, Any] = {"nvidia.com/gpu.present": "true"}
        if from_facts:
            node_labels.update(gpu_node_labels((host.get("ansible_facts") or {}).get("nvidia_gpu")))
        if "gpu_scheduling_node_pool" in host:
            node_labels[POOL_LABEL] = host["gpu_scheduling_node_pool"]
        node_labels.update(extra or {})
        labels[node] = node_labels
    return labels


def gpu_scheduling_problems(node_labels: Dict[str, Dict[str, Any]], runtime_class: Any, handler: Any) -> List[str]:
    """Every problem of the labels the role would set ({node: {key: value}}) and of the RuntimeClass settings."""
    problems = []
    for node, labels in sorted(node_labels.items()):
        for key, value in sorted(labels.items(), key=lambda item: str(item[0])):
            if not is_label_key(key):
                problems.append("label key %r for node %s; allowed: [prefix/]name, name of 1-63 letters, digits, "
                                "'-', '_' or '.'" % (key, node))
            if not is_label_value(value):
                problems.append("label %s=%r for node %s; allowed: a string of at most 63 letters, digits, '-', '_' "
                                "or '.', starting and ending with a letter or digit (gpu_scheduling_node_pool and "
                                "gpu_scheduling_extra_labels values are strings)" % (key, value, node))
    if not is_dns_subdomain(runtime_class):
        problems.append("gpu_scheduling_runtime_class_name=%r; allowed: a lower-case DNS name" % (runtime_class,))
    if not is_dns_label(handler):
        problems.append("gpu_scheduling_runtime_handler=%r; allowed: a DNS label (the runtime name in containerd or "
                        "CRI-O, e.g. nvidia)" % (handler,))
    return problems


class FilterModule:
    def filters(self) -> Dict[str, Any]:
        return {"gpu_node_labels": gpu_node_labels, "gpu_nodes_labels": gpu_nodes_labels,
                "gpu_scheduling_problems": gpu_scheduling_problems}
