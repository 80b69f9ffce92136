# -*- coding: utf-8 -*-
# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)
"""The DRA side of the cluster check, as pure functions over ResourceSlices, ResourceClaims and pods in their JSON
form (resource.k8s.io/v1).

A node in DRA mode advertises no `nvidia.com/gpu`: NVIDIA's DRA driver (kubernetes-sigs/dra-driver-nvidia-gpu)
publishes its GPUs as devices of ResourceSlices (driver `gpu.nvidia.com`, one pool per node), a whole GPU as a
device of type `gpu`, a MIG-enabled GPU as its MIG devices (type `mig`, with the parent's UUID and the profile). What
the node should offer is worked out from the host's own count and MIG layout, independently of the driver (or the
lab's double), so the check catches either getting it wrong.
"""

from __future__ import absolute_import, annotations, division, print_function

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ansible_collections.gpu_ops.cluster.plugins.module_utils.k8s_values import unscheduled

DRIVER = "gpu.nvidia.com"
MODE_LABEL = "nvidia.com/gpu.deploy.dra-driver"
MODES = ("device-plugin", "dra")


def allocation_mode(wanted: Optional[str], labels: Mapping[str, str], mode_label: str) -> Tuple[str, Optional[str]]:
    """The node's mode (the inventory's when it says, else the node's label) and, when the two disagree, why."""
    labelled = "dra" if labels.get(mode_label) == "true" else "device-plugin"
    if wanted is None:
        return labelled, None
    if wanted != labelled:
        shown = "%s=%s" % (mode_label, labels[mode_label]) if mode_label in labels else "no label %s" % mode_label
        return wanted, ("allocation mode is %s in the inventory, but the node has %s (run the nvidia_dra_driver role)"
                        % (wanted, shown))
    return wanted, None


def _attribute(device: Mapping[str, Any], driver: str, name: str) -> Optional[Any]:
    """An attribute's value, unqualified (the driver's own domain) or qualified with the driver's name."""
    attributes = device.get("attributes") or {}
    value = attributes.get(name, attributes.get("%s/%s" % (driver, name)))
    if not isinstance(value, Mapping):
        return None
    return next(iter(value.values()), None)


def device_kind(device: Mapping[str, Any], driver: str) -> str:
    """`gpu`, `mig-<profile>` or the device's own type: the keys expected and found are counted under."""
    kind = _attribute(device, driver, "type") or "unknown"
    if kind == "mig":
        return "mig-%s" % (_attribute(device, driver, "profile") or "unknown")
    return str(kind)


def _physical_gpu(device: Mapping[str, Any], driver: str) -> Optional[str]:
    """Which physical GPU a gpu or mig device is part of (its UUID, else the gpu-<minor> prefix of its name)."""
    name = str(device.get("name") or "")
    kind = _attribute(device, driver, "type")
    if kind == "gpu":
        return str(_attribute(device, driver, "uuid") or name)
    if kind == "mig":
        return str(_attribute(device, driver, "parentUUID") or name.split("-mig-", 1)[0])
    return None


NodeSlices = Dict[str, List[Mapping[str, Any]]]


def current_slices(slices: Sequence[Mapping[str, Any]], driver: str) -> Tuple[NodeSlices, Dict[str, List[str]]]:
    """Per node, the driver's slices of the newest generation of each of its pools (older generations are stale: the
    scheduler ignores them too); and per node, the pools whose newest generation lacks slices (being rewritten)."""
    # (slice, (node, pool name), pool) of the driver's slices that name a node.
    pooled = [(item, (spec["nodeName"], str(pool.get("name"))), pool)
              for item in slices
              for spec in [item.get("spec") or {}]
              if spec.get("driver") == driver and spec.get("nodeName")
              for pool in [spec.get("pool") or {}]]
    newest: Dict[Tuple[str, str], int] = {}
    for _item, key, pool in pooled:
        newest[key] = max(newest.get(key, 0), int(pool.get("generation") or 0))
    by_node: Dict[str, List[Mapping[str, Any]]] = {}
    seen: Dict[Tuple[str, str], Tuple[int, int]] = {}
    for item, key, pool in pooled:
        spec = item["spec"]
        if int(pool.get("generation") or 0) != newest[key]:
            continue
        by_node.setdefault(spec["nodeName"], []).append(item)
        count, wanted = seen.get(key, (0, int(pool.get("resourceSliceCount") or 1)))
        seen[key] = (count + 1, wanted)
    incomplete: Dict[str, List[str]] = {}
    for (node, pool), (count, wanted) in sorted(seen.items()):
        if count < wanted:
            incomplete.setdefault(node, []).append("pool %s has %d of its %d slices" % (pool, count, wanted))
    return by_node, incomplete


def found_devices(node_slices: Sequence[Mapping[str, Any]], driver: str) -> Dict[str, Any]:
    """What the node's slices publish: {devices: {kind: count}, total, gpus (physical GPUs covered), slices}."""
    kinds: Dict[str, int] = {}
    gpus = set()
    total = 0
    for item in node_slices:
        for device in (item.get("spec") or {}).get("devices") or []:
            total += 1
            kind = device_kind(device, driver)
            kinds[kind] = kinds.get(kind, 0) + 1
            physical = _physical_gpu(device, driver)
            if physical is not None:
                gpus.add(physical)
    return {"devices": kinds, "total": total, "gpus": len(gpus), "slices": len(node_slices)}


def layout_devices(gpus: int, layout: Optional[Mapping[int, Mapping[str, Any]]]) -> Optional[Dict[str, int]]:
    """What the driver publishes for a node with this MIG layout (GPU index -> {enabled, devices}): a `gpu` device per
    GPU without MIG, its MIG devices (by profile) for a MIG-enabled GPU. None without a layout."""
    if layout is None:
        return None
    devices: Dict[str, int] = {}
    for index in range(gpus):
        final = layout.get(index) or {"enabled": False, "devices": {}}
        if not final.get("enabled"):
            devices["gpu"] = devices.get("gpu", 0) + 1
            continue
        for profile, count in (final.get("devices") or {}).items():
            if int(count):
                devices["mig-" + profile] = devices.get("mig-" + profile, 0) + int(count)
    return devices


def _shown(counts: Mapping[str, int]) -> str:
    return ", ".join("%s=%d" % item for item in sorted(counts.items()) if item[1]) or "none"


def dra_node_check(name: str, gpus: Optional[int], layout: Optional[Mapping[int, Mapping[str, Any]]],
                   node_slices: Sequence[Mapping[str, Any]], driver: str) -> Tuple[Dict[str, Any], List[str]]:
    """The node's DRA view ({found, expected, expected_gpus}) and its problems: the devices its slices publish
    against what it should offer (the MIG layout's devices when known, else one device or MIG set per GPU)."""
    found = found_devices(node_slices, driver)
    expected = layout_devices(gpus, layout) if gpus is not None else None
    view = {"driver": driver, "found": found, "expected": expected, "expected_gpus": gpus}
    problems: List[str] = []
    if gpus is None:
        return view, problems
    if not node_slices:
        wanted = "%s (%d GPUs)" % (_shown(expected), gpus) if expected is not None else "%d GPUs" % gpus
        problems.append("no ResourceSlice of driver %s for the node: found 0 devices, expected %s; is the DRA "
                        "driver's kubelet plugin running there?" % (driver, wanted))
    elif expected is not None:
        if {k: v for k, v in found["devices"].items() if v} != {k: v for k, v in expected.items() if v}:
            problems.append("ResourceSlices of driver %s publish %s, expected %s (%d GPUs, MIG layout from the host "
                            "facts)" % (driver, _shown(found["devices"]), _shown(expected), gpus))
    elif found["gpus"] != gpus:
        problems.append("ResourceSlices of driver %s publish %d devices (%s) of %d GPUs, expected %d GPUs"
                        % (driver, found["total"], _shown(found["devices"]), found["gpus"], gpus))
    return view, problems


def allocated_by_node(claims: Sequence[Mapping[str, Any]], driver: str) -> Dict[str, int]:
    """Devices of the driver that allocated claims hold, per pool (the driver's pools are named after their node)."""
    held: Dict[str, int] = {}
    for claim in claims:
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for result in (allocation.get("devices") or {}).get("results") or []:
            if result.get("driver") == driver and result.get("pool"):
                held[result["pool"]] = held.get(result["pool"], 0) + 1
    return held


def _requests(claim: Mapping[str, Any]) -> List[Dict[str, Any]]:
    """A claim's requests as {request, device_class, count} (firstAvailable: each alternative, named request/sub)."""
    rows = []
    for request in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
        alternatives = [(request.get("name"), request.get("exactly") or {})] if request.get("exactly") else \
            [("%s/%s" % (request.get("name"), sub.get("name")), sub) for sub in request.get("firstAvailable") or []]
        for name, exactly in alternatives:
            mode = exactly.get("allocationMode") or "ExactCount"
            rows.append({"request": name, "device_class": exactly.get("deviceClassName"),
                         "count": "All" if mode == "All" else int(exactly.get("count") or 1)})
    return rows


def pending_claims(pods: Sequence[Mapping[str, Any]], claims: Sequence[Mapping[str, Any]]) -> List[Dict[str, Any]]:
    """Claims that Pending, unscheduled pods wait for (not allocated, or not made from their template yet), each with
    the pod and the scheduler's reason and message from the pod's PodScheduled condition."""
    by_name = {((c.get("metadata") or {}).get("namespace"), (c.get("metadata") or {}).get("name")): c for c in claims}
    rows = []
    for pod in pods:
        metadata, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
        if spec.get("nodeName") or status.get("phase") != "Pending" or not spec.get("resourceClaims"):
            continue
        reason, message = unscheduled(pod)
        made = {entry.get("name"): entry.get("resourceClaimName") for entry in status.get("resourceClaimStatuses") or []}
        namespace = metadata.get("namespace")
        for ref in spec["resourceClaims"]:
            claim_name = ref.get("resourceClaimName") or made.get(ref.get("name"))
            claim = by_name.get((namespace, claim_name)) if claim_name else None
            if claim is not None and (claim.get("status") or {}).get("allocation"):
                continue
            rows.append({
                "namespace": namespace, "pod": metadata.get("name"), "claim": claim_name,
                "template": ref.get("resourceClaimTemplateName"), "exists": claim is not None,
                "requests": _requests(claim) if claim is not None else [],
                "reason": reason,
                "message": message,
            })
    return rows


def pending_claim_line(row: Mapping[str, Any]) -> str:
    asked = ", ".join("%s: %s x %s" % (r["request"], r["device_class"], r["count"]) for r in row["requests"])
    what = ("claim %s (%s)" % (row["claim"], asked or "no requests") if row["exists"]
            else "claim %s from template %s, not made yet" % (row["claim"] or "?", row["template"] or "?"))
    why = row["message"] or row["reason"] or "not scheduled yet"
    return "%s/%s: Pending on %s: %s" % (row["namespace"], row["pod"], what, why)


def wants_dra(nodes: Sequence[Mapping[str, Any]], pods: Sequence[Mapping[str, Any]],
              expected_nodes: Sequence[Mapping[str, Any]], mode_label: str) -> bool:
    """Whether the check needs the DRA objects: a node in dra mode (inventory or label) or a pod that uses claims."""
    if any(entry.get("allocation_mode") == "dra" for entry in expected_nodes):
        return True
    if any(((n.get("metadata") or {}).get("labels") or {}).get(mode_label) == "true" for n in nodes):
        return True
    return any((p.get("spec") or {}).get("resourceClaims") for p in pods)


def layout_from_option(entries: Optional[Sequence[Mapping[str, Any]]]) -> Optional[Dict[int, Dict[str, Any]]]:
    """The module's `mig` suboption (a list of {index, enabled, devices}) as mig_layout's GPU index -> final state."""
    if entries is None:
        return None
    return {int(entry["index"]): {"enabled": bool(entry.get("enabled")),
                                  "devices": {str(k): int(v) for k, v in (entry.get("devices") or {}).items()}}
            for entry in entries}


def layout_from_facts(gpus: Sequence[Mapping[str, Any]]) -> Optional[List[Dict[str, Any]]]:
    """A host's MIG layout from nvidia_gpu_facts (per GPU: MIG mode now, its MIG devices' profiles), as the module's
    `mig` suboption; None when a MIG-enabled GPU's device profiles are not all known."""
    layout = []
    for gpu in gpus:
        enabled = gpu.get("mig_mode_current") == "enabled"
        profiles = [device.get("profile") for device in gpu.get("mig_devices") or []] if enabled else []
        if None in profiles or gpu.get("index") is None:
            return None
        counts: Dict[str, int] = {}
        for profile in profiles:
            counts[profile] = counts.get(profile, 0) + 1
        layout.append({"index": int(gpu["index"]), "enabled": enabled, "devices": counts})
    return layout
