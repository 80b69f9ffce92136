# -*- coding: utf-8 -*-
# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)
"""GPU node labels from a node's GPU facts (the labels GPU feature discovery would set), the checks of the
gpu_scheduling role's labels and RuntimeClass settings, and its GPU bin-packing scheduler profile."""

from __future__ import annotations

import re
from typing import Any, Dict, List, Mapping

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


# Resource names as the API server accepts them in a scheduler's scoring list: cpu, memory, ephemeral-storage or an
# extended resource <domain>/<name> (nvidia.com/gpu, nvidia.com/gpu.shared, nvidia.com/mig-1g.10gb).
_RESOURCE_NAME = re.compile(r"^(cpu|memory|ephemeral-storage|[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)$")
BINPACK_STRATEGIES = ("MostAllocated", "RequestedToCapacityRatio")
BINPACK_MODES = ("second_scheduler", "profile")


def gpu_binpack_problems(settings: Mapping[str, Any]) -> List[str]:
    """Every problem of the bin-packing settings ({input name: value}), each naming the input (and the key path
    inside it), its value and what is allowed."""
    problems = []
    mode = settings.get("gpu_scheduling_binpack_mode")
    if mode not in BINPACK_MODES:
        problems.append("gpu_scheduling_binpack_mode=%r; allowed: %s" % (mode, ", ".join(BINPACK_MODES)))
    name = settings.get("gpu_scheduling_binpack_scheduler_name")
    if not is_dns_subdomain(name) or name == "default-scheduler":
        problems.append("gpu_scheduling_binpack_scheduler_name=%r; allowed: a lower-case DNS name other than "
                        "default-scheduler (the schedulerName workloads choose)" % (name,))
    strategy = settings.get("gpu_scheduling_binpack_strategy")
    if strategy not in BINPACK_STRATEGIES:
        problems.append("gpu_scheduling_binpack_strategy=%r; allowed: %s" % (strategy, ", ".join(BINPACK_STRATEGIES)))
    resources = settings.get("gpu_scheduling_binpack_resources")
    if not isinstance(resources, list) or not resources:
        problems.append("gpu_scheduling_binpack_resources=%r; allowed: a non-empty list of {name, weight} such as "
                        "[{name: nvidia.com/gpu, weight: 10}]" % (resources,))
        return problems
    seen = set()
    for index, resource in enumerate(resources):
        where = "gpu_scheduling_binpack_resources[%d]" % index
        if not isinstance(resource, Mapping) or set(resource) - {"name", "weight"} or "name" not in resource:
            problems.append("%s=%r; allowed: {name: <resource name>, weight: <1-100>}" % (where, resource))
            continue
        if not isinstance(resource["name"], str) or not _RESOURCE_NAME.match(resource["name"]):
            problems.append("%s.name=%r; allowed: cpu, memory, ephemeral-storage or an extended resource such as "
                            "nvidia.com/gpu" % (where, resource["name"]))
        elif resource["name"] in seen:
            problems.append("%s.name=%r is listed twice" % (where, resource["name"]))
        seen.add(resource.get("name"))
        weight = resource.get("weight", 1)
        if isinstance(weight, bool) or not isinstance(weight, int) or not 1 <= weight <= 100:
            problems.append("%s.weight=%r; allowed: an integer 1-100" % (where, weight))
    if not any(isinstance(r, Mapping) and str(r.get("name", "")).startswith("nvidia.com/") for r in resources):
        problems.append("gpu_scheduling_binpack_resources=%r names no GPU resource; allowed: a list with at least one "
                        "nvidia.com/ resource (nvidia.com/gpu, nvidia.com/gpu.shared, nvidia.com/mig-<profile>)"
                        % ([r.get("name") if isinstance(r, Mapping) else r for r in resources],))
    return problems


def gpu_binpack_profile(scheduler_name: str, strategy: str, resources: List[Mapping[str, Any]]) -> Dict[str, Any]:
    """One KubeSchedulerConfiguration profile that packs GPU pods: NodeResourcesFit scores nodes by how full they
    would be (MostAllocated, or RequestedToCapacityRatio rising from 0 at empty to 10 at full) on the given resources,
    and NodeResourcesBalancedAllocation, which favours the emptier node, is off."""
    weighted = [{"name": r["name"], "weight": int(r.get("weight", 1))} for r in resources]
    scoring: Dict[str, Any] = {"type": strategy, "resources": weighted}
    if strategy == "RequestedToCapacityRatio":
        scoring["requestedToCapacityRatio"] = {"shape": [{"utilization": 0, "score": 0},
                                                         {"utilization": 100, "score": 10}]}
    return {"schedulerName": scheduler_name,
            "plugins": {"score": {"disabled": [{"name": "NodeResourcesBalancedAllocation"}]}},
            "pluginConfig": [{"name": "NodeResourcesFit", "args": {"scoringStrategy": scoring}}]}


def gpu_binpack_scheduler_config(scheduler_name: str, strategy: str, resources: List[Mapping[str, Any]],
                                 mode: str = "second_scheduler", kubeconfig: str = "",
                                 namespace: str = "kube-system") -> Dict[str, Any]:
    """The whole KubeSchedulerConfiguration (kubescheduler.config.k8s.io/v1) of the bin-packing scheduler.

    second_scheduler: one profile, leader election on a lease named after the scheduler (replicas may run side by
    side), the in-cluster connection. profile: the cluster's own default-scheduler profile unchanged plus the
    bin-packing one, for a kube-scheduler the user runs (kubeadm: its kubeconfig /etc/kubernetes/scheduler.conf)."""
    config: Dict[str, Any] = {"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration"}
    if mode == "profile":
        config["clientConnection"] = {"kubeconfig": kubeconfig or "/etc/kubernetes/scheduler.conf"}
        config["profiles"] = [{"schedulerName": "default-scheduler"},
                              gpu_binpack_profile(scheduler_name, strategy, resources)]
        return config
    if kubeconfig:
        config["clientConnection"] = {"kubeconfig": kubeconfig}
    config["enableProfiling"] = False
    config["leaderElection"] = {"leaderElect": True, "resourceName": scheduler_name, "resourceNamespace": namespace}
    config["profiles"] = [gpu_binpack_profile(scheduler_name, strategy, resources)]
    return config


class FilterModule:
    def filters(self) -> Dict[str, Any]:
        return {"gpu_node_labels": gpu_node_labels, "gpu_nodes_labels": gpu_nodes_labels,
                "gpu_scheduling_problems": gpu_scheduling_problems, "gpu_binpack_problems": gpu_binpack_problems,
                "gpu_binpack_scheduler_config": gpu_binpack_scheduler_config}
