# -*- coding: utf-8 -*-
# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)
"""The cluster side of GPU validation, as pure functions over Kubernetes objects in their JSON form.

The module lists each kind once for the whole cluster (nodes, pods, resource quotas) and hands the raw JSON items to
these functions; nothing here does I/O, so the logic is unit-tested on recorded objects and a thousand nodes cost a
few dictionary passes. What the device plugin should advertise is worked out independently of the lab's
device-plugin double, so the check can catch the double (or a real plugin) getting it wrong.
"""

from __future__ import absolute_import, annotations, division, print_function

import re
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from ansible_collections.gpu_ops.cluster.plugins.module_utils import gpu_cluster_dra, mig_layout
from ansible_collections.gpu_ops.cluster.plugins.module_utils.device_plugin_config import (
    DEFAULT_MPS_ROOT,
    config_problems,
    full_resource_name,
)
from ansible_collections.gpu_ops.cluster.plugins.module_utils.k8s_values import unscheduled

GPU = "nvidia.com/gpu"
RESOURCE_PREFIX = "nvidia.com/"
CONFIG_LABEL = "nvidia.com/device-plugin.config"
_SELECTOR_TERM = re.compile(r"^\s*([A-Za-z0-9./_-]+)\s*(==|=|!=)\s*([A-Za-z0-9._-]*)\s*\Z")


# -- expectations -------------------------------------------------------------------------------------------------


def expected_resources(gpus: int, config: Optional[Mapping[str, Any]],
                       layout: Optional[Mapping[int, Mapping[str, Any]]] = None) -> Dict[str, int]:
    """What a device plugin with this config advertises for `gpus` whole GPUs: resource name -> count.

    Time-slicing and MPS multiply by replicas; renameByDefault advertises `<name>.shared` instead of the name. A
    resource named without its nvidia.com/ prefix is the prefixed one, as the plugin reads it.
    A MIG strategy other than none advertises what the node's MIG layout (GPU index -> {enabled, devices}, from the
    host facts) makes of its GPUs (mig_layout.expected_resources: single as nvidia.com/gpu, mixed as
    nvidia.com/mig-<profile> plus the GPUs without MIG); without a layout nothing is expected and the check reports
    what is advertised.
    """
    if not config:
        return {GPU: gpus}
    strategy = ((config.get("flags") or {}).get("migStrategy") or "none")
    if strategy != "none" and layout is None:
        return {}
    base = mig_layout.expected_resources(strategy, layout, gpus) if strategy != "none" else {GPU: gpus}
    sharing = config.get("sharing") or {}
    for kind in ("timeSlicing", "mps"):
        section = sharing.get(kind)
        if not section:
            continue
        shared = dict(base)
        for resource in section.get("resources") or []:
            name = full_resource_name(resource.get("name"))  # the plugin reads "gpu" as nvidia.com/gpu
            if name in base:
                del shared[name]
                shared[name + ".shared" if section.get("renameByDefault") else name] = \
                    base[name] * int(resource.get("replicas") or 1)
        return shared
    return base


def chosen_config(labels: Mapping[str, str], default_config: str) -> str:
    """The config name the device plugin's config-manager picks for a node: its label, else the default."""
    return labels.get(CONFIG_LABEL) or default_config


# -- objects ------------------------------------------------------------------------------------------------------


def parse_selector(selector: str) -> List[Tuple[str, str, str]]:
    """An equality-based label selector (`a=b,c!=d`) as (key, op, value) terms; ValueError names a bad term."""
    terms = []
    for part in [p for p in (selector or "").split(",") if p.strip()]:
        match = _SELECTOR_TERM.match(part)
        if match is None:
            raise ValueError("label selector %r: term %r is not key=value or key!=value" % (selector, part))
        key, operator, value = match.groups()
        terms.append((key, "!=" if operator == "!=" else "=", value))
    return terms


def matches(labels: Mapping[str, str], terms: Sequence[Tuple[str, str, str]]) -> bool:
    for key, operator, value in terms:
        if (labels.get(key) == value) != (operator == "="):
            return False
    return True


def quantity(value: Any) -> int:
    """Extended resources are whole numbers; anything else (absent, malformed) counts as 0."""
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return 0


def gpu_resources(resources: Optional[Mapping[str, Any]]) -> Dict[str, int]:
    return {name: quantity(value) for name, value in (resources or {}).items() if name.startswith(RESOURCE_PREFIX)}


def condition(items: Optional[Iterable[Mapping[str, Any]]], kind: str) -> Optional[Mapping[str, Any]]:
    return next((item for item in items or [] if item.get("type") == kind), None)


def node_view(node: Mapping[str, Any]) -> Dict[str, Any]:
    metadata, spec, status = node.get("metadata") or {}, node.get("spec") or {}, node.get("status") or {}
    ready = condition(status.get("conditions"), "Ready")
    return {
        "name": metadata.get("name"),
        "labels": metadata.get("labels") or {},
        "ready": bool(ready and ready.get("status") == "True"),
        "unschedulable": bool(spec.get("unschedulable")),
        "taints": ["%s=%s:%s" % (t.get("key"), t.get("value", ""), t.get("effect")) for t in spec.get("taints") or []],
        "capacity": gpu_resources(status.get("capacity")),
        "allocatable": gpu_resources(status.get("allocatable")),
    }


def pod_gpu_requests(pod: Mapping[str, Any]) -> Dict[str, int]:
    """GPU-like resources a pod asks for (limits, where extended resources must be; requests as the fallback)."""
    wanted: Dict[str, int] = {}
    for container in (pod.get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        asked = dict(gpu_resources(resources.get("requests")))
        asked.update(gpu_resources(resources.get("limits")))
        for name, count in asked.items():
            wanted[name] = wanted.get(name, 0) + count
    return wanted


def pod_view(pod: Mapping[str, Any]) -> Dict[str, Any]:
    metadata, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    reason, message = unscheduled(pod)
    ready = condition(status.get("conditions"), "Ready")
    return {
        "namespace": metadata.get("namespace"),
        "name": metadata.get("name"),
        "labels": metadata.get("labels") or {},
        "node": spec.get("nodeName"),
        "phase": status.get("phase"),
        "ready": bool(ready and ready.get("status") == "True"),
        "deleting": bool(metadata.get("deletionTimestamp")),
        "gpus": pod_gpu_requests(pod),
        "unscheduled_reason": reason,
        "unscheduled_message": message,
    }


def quota_rows(quotas: Iterable[Mapping[str, Any]]) -> List[Dict[str, Any]]:
    """Per namespace and quota, the GPU resources it limits: hard and used."""
    rows = []
    for quota in quotas:
        metadata, status = quota.get("metadata") or {}, quota.get("status") or {}
        hard = status.get("hard") or (quota.get("spec") or {}).get("hard") or {}
        used = status.get("used") or {}
        for key, value in sorted(hard.items()):
            resource = key[len("requests."):] if key.startswith("requests.") else key
            if resource.startswith(RESOURCE_PREFIX):
                rows.append({"namespace": metadata.get("namespace"), "quota": metadata.get("name"), "resource": key,
                             "hard": quantity(value), "used": quantity(used.get(key))})
    return rows


# -- the verdict --------------------------------------------------------------------------------------------------


def daemon_status(pods_on_node: Sequence[Mapping[str, Any]], required: bool) -> str:
    if any(p["phase"] == "Running" and p["ready"] and not p["deleting"] for p in pods_on_node):
        return "running"
    if pods_on_node:
        return "not_ready"
    return "missing" if required else "not_deployed"


def check_cluster(
    nodes: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
    quotas: Sequence[Mapping[str, Any]],
    *,
    expected_nodes: Sequence[Mapping[str, Any]],
    sharing_configs: Mapping[str, Any],
    default_config: str,
    sharing_mps_root: Optional[str] = DEFAULT_MPS_ROOT,
    gpu_node_selector: str,
    daemons: Mapping[str, Mapping[str, Any]],
    slices: Optional[Sequence[Mapping[str, Any]]] = None,
    claims: Optional[Sequence[Mapping[str, Any]]] = None,
    dra: Optional[Mapping[str, Any]] = None,
) -> Dict[str, Any]:
    """Everything the cluster says about its GPUs, with expectations met or not, from one list of each kind.

    `dra` ({driver, mode_label, error}) with the ResourceSlices and ResourceClaims: nodes in DRA mode (the inventory's
    allocation_mode of an expected node, else the node's mode label) are checked on the devices their slices publish
    instead of on nvidia.com/gpu; Pending pods that wait for claims are listed with the scheduler's reason. `error`
    says why the DRA objects could not be read (a problem when a node is in DRA mode)."""
    problems: List[str] = []
    warnings: List[str] = []
    for name, config in sorted(sharing_configs.items()):
        problems.extend(config_problems(name, config, sharing_mps_root))
    node_terms = parse_selector(gpu_node_selector)
    daemon_terms = {name: parse_selector(spec.get("selector") or "") for name, spec in daemons.items()}
    expected = {str(entry["name"]): entry for entry in expected_nodes}
    dra = dict(dra or {})
    driver = dra.get("driver") or gpu_cluster_dra.DRIVER
    mode_label = dra.get("mode_label") or gpu_cluster_dra.MODE_LABEL
    slices_by_node, incomplete_pools = gpu_cluster_dra.current_slices(slices or [], driver)
    held = gpu_cluster_dra.allocated_by_node(claims or [], driver)
    views = {view["name"]: view for view in (node_view(node) for node in nodes)}
    pod_views = [pod_view(pod) for pod in pods]

    daemon_pods: Dict[str, Dict[str, List[Mapping[str, Any]]]] = {name: {} for name in daemons}
    requested: Dict[str, Dict[str, int]] = {}
    pending = []
    for pod in pod_views:
        for name, spec in daemons.items():
            if pod["namespace"] == spec.get("namespace") and pod["node"] and matches(pod["labels"], daemon_terms[name]):
                daemon_pods[name].setdefault(pod["node"], []).append(pod)
        if not pod["gpus"]:
            continue
        if pod["node"] and pod["phase"] not in ("Succeeded", "Failed"):
            per_node = requested.setdefault(pod["node"], {})
            for resource, count in pod["gpus"].items():
                per_node[resource] = per_node.get(resource, 0) + count
        elif not pod["node"] and pod["phase"] == "Pending":
            pending.append({"namespace": pod["namespace"], "name": pod["name"], "requests": pod["gpus"],
                            "reason": pod["unscheduled_reason"], "message": pod["unscheduled_message"]})

    report_nodes: Dict[str, Dict[str, Any]] = {}
    gpu_node_names = sorted(set(expected) | {name for name, view in views.items()
                                             if (node_terms and matches(view["labels"], node_terms))
                                             or view["allocatable"] or view["labels"].get(mode_label) == "true"})
    for name in gpu_node_names:
        view = views.get(name)
        entry = expected.get(name)
        node_problems: List[str] = []
        if view is None:
            problems.append("%s: expected GPU node is not in the cluster" % name)
            report_nodes[name] = {"present": False, "problems": ["not in the cluster"]}
            continue
        config_name = chosen_config(view["labels"], default_config)
        expectation: Dict[str, int] = {}
        mode, mode_problem = gpu_cluster_dra.allocation_mode((entry or {}).get("allocation_mode"), view["labels"],
                                                             mode_label)
        if mode_problem:
            node_problems.append(mode_problem)
        layout = gpu_cluster_dra.layout_from_option((entry or {}).get("mig"))
        dra_view = None
        if mode == "dra":
            gpus = (entry or {}).get("gpus")
            dra_view, dra_problems = gpu_cluster_dra.dra_node_check(
                name, int(gpus) if gpus is not None else None, layout, slices_by_node.get(name, []), driver)
            dra_view["allocated"] = held.get(name, 0)
            if dra.get("error"):
                node_problems.append("ResourceSlices not read: %s" % dra["error"])
            else:
                node_problems.extend(dra_problems)
                if gpus is None and not slices_by_node.get(name):
                    node_problems.append("no ResourceSlice of driver %s for the node (in dra mode)" % driver)
            warnings.extend("%s: %s" % (name, text) for text in incomplete_pools.get(name, []))
            served = {r: c for r, c in view["allocatable"].items() if c}
            if served and dra_view["found"]["total"]:
                node_problems.append("GPUs served twice: the device plugin advertises %s and ResourceSlices publish %d "
                                     "devices" % (", ".join("%s=%d" % i for i in sorted(served.items())),
                                                  dra_view["found"]["total"]))
        elif entry is not None and entry.get("gpus") is not None:
            config = sharing_configs.get(config_name)
            if config_name not in sharing_configs and CONFIG_LABEL in view["labels"]:
                node_problems.append("label %s=%s names no sharing config (known: %s)"
                                     % (CONFIG_LABEL, config_name, ", ".join(sorted(sharing_configs)) or "none"))
            expectation = expected_resources(int(entry["gpus"]), config, layout)
            for resource, count in sorted(expectation.items()):
                have = view["allocatable"].get(resource, 0)
                if have < count:
                    node_problems.append("allocatable %s is %d, expected %d (%d GPUs, config %s)"
                                         % (resource, have, count, int(entry["gpus"]),
                                            config_name if config else "none"))
        if not view["ready"]:
            node_problems.append("node is not Ready")
        if view["unschedulable"]:
            warnings.append("%s: cordoned (unschedulable)" % name)
        for resource in sorted(view["allocatable"]):
            if view["allocatable"][resource] != view["capacity"].get(resource, 0):
                warnings.append("%s: %s allocatable %d differs from capacity %d" % (
                    name, resource, view["allocatable"][resource], view["capacity"].get(resource, 0)))
        daemon_state = {}
        for daemon, spec in sorted(daemons.items()):
            on_node = daemon_pods[daemon].get(name, [])
            if daemon == "device_plugin" and mode == "dra":
                # The DRA driver serves this node's GPUs; the device plugin's DaemonSet stays off it.
                daemon_state[daemon] = "dra_mode"
                if on_node:
                    warnings.append("%s: a device plugin pod runs on a node in dra mode" % name)
                continue
            state = daemon_status(on_node, bool(spec.get("required")))
            daemon_state[daemon] = state
            if state in ("missing", "not_ready"):
                node_problems.append("%s pod %s" % (daemon.replace("_", " "), state.replace("_", " ")))
        problems.extend("%s: %s" % (name, problem) for problem in node_problems)
        used = requested.get(name, {})
        report_nodes[name] = {
            "present": True, "ready": view["ready"], "unschedulable": view["unschedulable"], "taints": view["taints"],
            "capacity": view["capacity"], "allocatable": view["allocatable"], "requested": used,
            "free": {r: view["allocatable"][r] - used.get(r, 0) for r in view["allocatable"]},
            "sharing_config": config_name if config_name in sharing_configs else None,
            "expected": expectation, "daemons": daemon_state, "problems": node_problems,
            "allocation_mode": mode, "dra": dra_view,
        }
    claims_pending = gpu_cluster_dra.pending_claims(pods, claims or []) if dra and not dra.get("error") else []
    if dra.get("error") and not any(n.get("allocation_mode") == "dra" for n in report_nodes.values()):
        warnings.append("ResourceClaims not read: %s" % dra["error"])
    for pod in pending:
        warnings.append("%s/%s: Pending, asks %s: %s" % (
            pod["namespace"], pod["name"], ", ".join("%s=%d" % item for item in sorted(pod["requests"].items())),
            pod["message"] or pod["reason"] or "not scheduled yet"))
    warnings.extend(gpu_cluster_dra.pending_claim_line(row) for row in claims_pending)
    totals: Dict[str, Dict[str, int]] = {}
    for node in report_nodes.values():
        for resource, count in (node.get("allocatable") or {}).items():
            total = totals.setdefault(resource, {"allocatable": 0, "requested": 0})
            total["allocatable"] += count
            total["requested"] += (node.get("requested") or {}).get(resource, 0)
    return {
        "healthy": not problems, "problems": problems, "warnings": warnings,
        "node_count": len(views), "gpu_node_count": sum(1 for n in report_nodes.values() if n["present"]),
        "nodes": report_nodes, "totals": totals, "pending_gpu_pods": pending, "quotas": quota_rows(quotas),
        "pending_claims": claims_pending,
    }
