# -*- coding: utf-8 -*-
# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)
"""Rolling driver upgrades of GPU nodes: the plan (which nodes, in which order and batches) and each node's steps,
worked out from the nodes as they are. Pure functions; the modules gpu_driver_upgrade_plan and gpu_node_upgrade do
the requests.

Each node's state is a label with the GPU Operator's vocabulary (under this project's prefix, so the two never write
each other's labels): upgrade-required -> cordon-required -> wait-for-jobs-required -> pod-deletion-required ->
[drain-required] -> validation-required -> uncordon-required -> upgrade-done, or upgrade-failed. A re-run resumes from
the labels: a node in one of the middle states comes first, a done node is skipped, a failed one only retried when
asked. A node labelled with SKIP_LABEL=true is held back. The annotation records what the rollout found before it
cordoned the node (a person's own cordon, the node's allocatable GPUs), so the release undoes only the rollout's own
cordon and checks that the GPUs are back.
"""

from __future__ import absolute_import, annotations, division, print_function

import json
import math
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from ansible_collections.gpu_ops.cluster.plugins.module_utils.k8s_values import json_annotation

STATE_LABEL = "gpu-cluster.dev/driver-upgrade-state"
SKIP_LABEL = "gpu-cluster.dev/driver-upgrade.skip"
ANNOTATION_KEY = "gpu-cluster.dev/driver-upgrade"

REQUIRED = "upgrade-required"
CORDON = "cordon-required"
WAIT_FOR_JOBS = "wait-for-jobs-required"
POD_DELETION = "pod-deletion-required"
DRAIN = "drain-required"
VALIDATION = "validation-required"
UNCORDON = "uncordon-required"
DONE = "upgrade-done"
FAILED = "upgrade-failed"
# The health quarantine (module_utils/gpu_quarantine) leaves a node in these states to the rollout.
IN_PROGRESS = (CORDON, WAIT_FOR_JOBS, POD_DELETION, DRAIN, VALIDATION, UNCORDON)
STATES = (REQUIRED,) + IN_PROGRESS + (DONE, FAILED)

# A MIG reconfiguration (the nvidia_mig role) takes a node out the same way, with the GPU Operator's MIG manager's
# labels: the config name it applies and its state. Its record sits in an annotation of its own.
MIG_CONFIG_LABEL = "nvidia.com/mig.config"
MIG_STATE_LABEL = "nvidia.com/mig.config.state"
MIG_ANNOTATION_KEY = "gpu-cluster.dev/mig-reconfigure"
MIG_PENDING = "pending"
MIG_REBOOTING = "rebooting"
MIG_SUCCESS = "success"
MIG_FAILED = "failed"


@dataclass(frozen=True)
class Operation:
    """What takes a node out: the label that shows its state, the annotation of its record, the state each step
    shows and the state once the node is released."""

    state_label: str
    annotation_key: str
    step_states: Mapping[str, str]
    done: str


DRIVER_UPGRADE = Operation(STATE_LABEL, ANNOTATION_KEY, {
    "cordon": CORDON, "wait-for-jobs": WAIT_FOR_JOBS, "pod-deletion": POD_DELETION, "drain": DRAIN,
    "validation-required": VALIDATION, "validate": VALIDATION, "uncordon": UNCORDON, "failed": FAILED}, DONE)
MIG_RECONFIGURE = Operation(MIG_STATE_LABEL, MIG_ANNOTATION_KEY, {
    "cordon": MIG_PENDING, "wait-for-jobs": MIG_PENDING, "pod-deletion": MIG_PENDING, "drain": MIG_PENDING,
    "validation-required": MIG_PENDING, "validate": MIG_PENDING, "uncordon": MIG_PENDING, "failed": MIG_FAILED},
    MIG_SUCCESS)
OPERATIONS = {"driver-upgrade": DRIVER_UPGRADE, "mig-reconfigure": MIG_RECONFIGURE}

# Pods that end on their own: nothing to wait for or evict.
FINISHED_PHASES = ("Succeeded", "Failed")


def labels_of(node: Mapping[str, Any]) -> Dict[str, str]:
    return dict((node.get("metadata") or {}).get("labels") or {})


def name_of(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def state_of(node: Mapping[str, Any]) -> str:
    return labels_of(node).get(STATE_LABEL, "")


def taken_out(node: Mapping[str, Any]) -> bool:
    """A node in the middle of a driver rollout or a MIG reconfiguration: its GPUs are in flux."""
    labels = labels_of(node)
    return labels.get(STATE_LABEL) in IN_PROGRESS or labels.get(MIG_STATE_LABEL) in (MIG_PENDING, MIG_REBOOTING)


def is_cordoned(node: Mapping[str, Any]) -> bool:
    return bool((node.get("spec") or {}).get("unschedulable"))


def record_of(node: Mapping[str, Any], key: str = ANNOTATION_KEY) -> Optional[Dict[str, Any]]:
    """What the rollout recorded on the node when it cordoned it (None: not cordoned by a rollout)."""
    return json_annotation(node, key)


def parse_max_unavailable(value: Any, path: str = "max_unavailable") -> Tuple[Optional[int], Optional[float]]:
    """(count, None) or (None, percent) from 2 or "2" or "25%"; ValueError naming the value and what is allowed."""
    allowed = "allowed: a whole number of nodes (1 or more) or a percentage of the GPU nodes such as \"25%\""
    if isinstance(value, bool):
        raise ValueError("%s=%r; %s" % (path, value, allowed))
    if isinstance(value, int):
        if value < 1:
            raise ValueError("%s=%r; %s" % (path, value, allowed))
        return value, None
    text = str(value).strip()
    if text.endswith("%"):
        try:
            percent = float(text[:-1])
        except ValueError:
            raise ValueError("%s=%r; %s" % (path, value, allowed))
        if not 0 < percent <= 100:
            raise ValueError("%s=%r; %s" % (path, value, allowed))
        return None, percent
    if text.isdigit() and int(text) >= 1:
        return int(text), None
    raise ValueError("%s=%r; %s" % (path, value, allowed))


def unavailable_budget(max_unavailable: Any, gpu_node_count: int) -> int:
    """How many GPU nodes may be unschedulable at once: a count, or a share of the GPU nodes rounded down but at least
    one (as a Deployment's maxUnavailable, except that a rollout with no room at all would never start)."""
    count, percent = parse_max_unavailable(max_unavailable)
    if count is not None:
        return count
    return max(1, int(math.floor(gpu_node_count * percent / 100.0 + 1e-9)))


def order_problems(order: Any, gpu_nodes: Sequence[str], path: str = "order") -> List[str]:
    """One message per name in order that is not a GPU node; [] for an order that is not a list of names (its form is
    the caller's check). The plan would skip such a name and start on another node than the canary the user meant."""
    if not isinstance(order, (list, tuple)):
        return []
    known = sorted(set(gpu_nodes))
    allowed = ("allowed: names of GPU nodes (%s)" % ", ".join(known)) if known else "allowed: [] (no GPU nodes)"
    return ["%s[%d]=%s is not a GPU node; %s" % (path, index, json.dumps(name, default=str), allowed)
            for index, name in enumerate(order) if name not in known]


def plan_rollout(nodes: Sequence[Mapping[str, Any]], needs_upgrade: Mapping[str, bool], gpu_nodes: Sequence[str],
                 max_unavailable: Any, order: Sequence[str] = (), retry_failed: bool = False) -> Dict[str, Any]:
    """Which nodes the rollout takes, in which order, how many at a time.

    nodes: the cluster's Node objects. needs_upgrade: for each node the inventory can reach, whether its installed
    driver differs from the target. gpu_nodes: every GPU node's name (the budget's whole). A GPU node already
    unschedulable and outside the queue (a person's cordon, a quarantined or failed node) takes a slot of
    max_unavailable, so the rollout never makes more GPU nodes unavailable than allowed. Returns {queue, batch_size,
    batches, resume, done, skipped, failed_before, unreachable, missing, budget, unavailable, blocked} ("failed" would
    make Ansible read a module's result as failed)."""
    by_name = {name_of(node): node for node in nodes}
    result: Dict[str, Any] = {"queue": [], "resume": [], "done": [], "skipped": [], "failed_before": [],
                              "unreachable": [],
                              "missing": [], "batches": [], "batch_size": 0, "blocked": ""}
    rank = {name: index for index, name in enumerate(order)}
    wanted = []
    for name in sorted(set(gpu_nodes) | set(needs_upgrade), key=lambda n: (rank.get(n, len(rank)), n)):
        node = by_name.get(name)
        if node is None:
            if name in needs_upgrade:
                result["missing"].append(name)
            continue
        state = state_of(node)
        if name not in needs_upgrade:
            if state in IN_PROGRESS or state == REQUIRED:
                result["unreachable"].append(name)
            continue
        if labels_of(node).get(SKIP_LABEL) == "true":
            result["skipped"].append(name)
        elif state in IN_PROGRESS:
            result["resume"].append(name)
        elif state == FAILED and not retry_failed:
            result["failed_before"].append(name)
        elif needs_upgrade[name] or state in (REQUIRED, FAILED):
            wanted.append(name)
        else:
            result["done"].append(name)
    result["queue"] = result["resume"] + wanted
    queued = set(result["queue"])
    budget = unavailable_budget(max_unavailable, len(gpu_nodes))
    # Unschedulable GPU nodes the rollout does not take now; a node it resumes is counted in its batch.
    unavailable = sorted(name for name in gpu_nodes if name in by_name and is_cordoned(by_name[name])
                         and name not in queued)
    room = budget - len(unavailable)
    result.update(budget=budget, unavailable=unavailable)
    if wanted and room < 1:
        # Nodes resumed are already out and go on; no other node may be taken out.
        result["blocked"] = ("max_unavailable allows %d GPU node(s) unavailable at once and %d already are (%s): "
                             "%s not taken out" % (budget, len(unavailable), ", ".join(unavailable), ", ".join(wanted)))
        result["queue"] = list(result["resume"])
        wanted = []
    size = max(room, 1)
    result["batch_size"] = size if result["queue"] else 0
    # Nodes resumed are already out: all of them go first, in one batch, with new nodes only where room is left.
    first = result["resume"] + wanted[:max(0, size - len(result["resume"]))]
    rest = wanted[len(first) - len(result["resume"]):]
    result["batches"] = ([first] if first else []) + [rest[index:index + size] for index in range(0, len(rest), size)]
    return result


def steps_for(drain: bool) -> List[str]:
    """The states a node goes through, in order, from cordon to done."""
    return [CORDON, WAIT_FOR_JOBS, POD_DELETION] + ([DRAIN] if drain else []) + [VALIDATION, UNCORDON, DONE]


def plan_summary(plan: Mapping[str, Any], target: str, drain: bool) -> List[str]:
    """Lines a person reads: the batches and what each node goes through, and the nodes left alone and why."""
    lines = []
    if plan.get("blocked"):
        lines.append("blocked: " + plan["blocked"])
    for index, batch in enumerate(plan.get("batches") or [], start=1):
        steps = " -> ".join(steps_for(drain))
        lines.append("batch %d: %s -> driver %s (%s)" % (index, ", ".join(batch), target, steps))
    for key, what in (("resume", "resumed from their state label"), ("done", "already at the target (skipped)"),
                      ("skipped", "held back by %s=true" % SKIP_LABEL),
                      ("failed_before", "failed before, left cordoned (retry with retry_failed)"),
                      ("unreachable", "in the middle of an upgrade but not reachable (left as they are)"),
                      ("missing", "not in the cluster")):
        if plan.get(key):
            lines.append("%s: %s" % (what, ", ".join(plan[key])))
    if plan.get("unavailable"):
        lines.append("already unavailable, counted against max_unavailable=%d: %s"
                     % (plan.get("budget", 0), ", ".join(plan["unavailable"])))
    if not lines:
        lines.append("no GPU node needs the upgrade")
    return lines


# --- one node ---------------------------------------------------------------------------------------------------

# DRA drivers whose devices are GPUs (NVIDIA's DRA driver serves whole GPUs and MIG devices under this name).
GPU_DRA_DRIVERS = ("gpu.nvidia.com",)


def gpu_claims(claims: Sequence[Mapping[str, Any]], drivers: Sequence[str] = GPU_DRA_DRIVERS) -> Set[str]:
    """"namespace/name" of the ResourceClaims (resource.k8s.io/v1) allocated devices of a GPU DRA driver."""
    found = set()
    for claim in claims:
        results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
        if any(result.get("driver") in drivers for result in results):
            meta = claim.get("metadata") or {}
            found.add("%s/%s" % (meta.get("namespace"), meta.get("name")))
    return found


def claim_refs(pod: Mapping[str, Any]) -> List[str]:
    """"namespace/name" of the ResourceClaims a pod uses: named ones and those made from its templates."""
    namespace = (pod.get("metadata") or {}).get("namespace")
    names = [entry.get("resourceClaimName") for entry in (pod.get("spec") or {}).get("resourceClaims") or []]
    names += [entry.get("resourceClaimName") for entry in (pod.get("status") or {}).get("resourceClaimStatuses") or []]
    return ["%s/%s" % (namespace, name) for name in names if name]


def gpu_request(pod: Mapping[str, Any], prefix: str = "nvidia.com/", claims: Set[str] = frozenset()) -> bool:
    """Whether the pod uses GPUs: a container asks for a resource under the prefix (device plugin), or the pod holds
    a ResourceClaim allocated by a GPU DRA driver (`claims`, from gpu_claims)."""
    if claims and any(ref in claims for ref in claim_refs(pod)):
        return True
    spec = pod.get("spec") or {}
    for container in (spec.get("containers") or []) + (spec.get("initContainers") or []):
        resources = container.get("resources") or {}
        for kind in ("requests", "limits"):
            if any(str(key).startswith(prefix) for key in (resources.get(kind) or {})):
                return True
    return False


def is_daemonset_pod(pod: Mapping[str, Any]) -> bool:
    return any(owner.get("kind") == "DaemonSet" for owner in (pod.get("metadata") or {}).get("ownerReferences") or [])


def is_mirror_pod(pod: Mapping[str, Any]) -> bool:
    return "kubernetes.io/config.mirror" in ((pod.get("metadata") or {}).get("annotations") or {})


def pods_to_move(pods: Sequence[Mapping[str, Any]], drain: bool, prefix: str = "nvidia.com/",
                 leaving: bool = False, claims: Set[str] = frozenset()) -> List[Dict[str, Any]]:
    """The pods an upgrade takes off the node: the GPU pods still running (any pod but DaemonSets' and static ones
    for a full drain). Pods that finished are not moved, nor those already being deleted unless `leaving` (to wait
    until they are gone)."""
    chosen = []
    for pod in pods:
        if (pod.get("status") or {}).get("phase") in FINISHED_PHASES:
            continue
        if (pod.get("metadata") or {}).get("deletionTimestamp") and not leaving:
            continue
        if is_daemonset_pod(pod) or is_mirror_pod(pod):
            continue
        if drain or gpu_request(pod, prefix, claims):
            chosen.append(dict(pod))
    return chosen


def pod_ref(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return "%s/%s" % (meta.get("namespace", ""), meta.get("name", ""))


def gpu_allocatable(node: Mapping[str, Any], prefix: str = "nvidia.com/") -> Dict[str, str]:
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    return {str(key): str(value) for key, value in allocatable.items() if str(key).startswith(prefix)}


def is_ready(node: Mapping[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (node.get("status") or {}).get("conditions") or [])


def quantity(value: Any) -> float:
    """A Kubernetes quantity as a number (GPU counts are plain integers; the usual suffixes are read too)."""
    text = str(value)
    factors = {"Ki": 1024, "Mi": 1024 ** 2, "Gi": 1024 ** 3, "Ti": 1024 ** 4, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
               "m": 1e-3}
    for suffix, factor in sorted(factors.items(), key=lambda item: -len(item[0])):
        if text.endswith(suffix):
            return float(text[:-len(suffix)]) * factor
    return float(text)


def missing_allocatable(recorded: Mapping[str, str], node: Mapping[str, Any], prefix: str = "nvidia.com/"
                        ) -> List[str]:
    """Each recorded GPU resource the node now advertises less of: "nvidia.com/gpu: 8 before, 7 now"."""
    now = gpu_allocatable(node, prefix)
    short = []
    for key, before in sorted(recorded.items()):
        if quantity(now.get(key, "0")) < quantity(before):
            short.append("%s: %s before, %s now" % (key, before, now.get(key, "0")))
    return short


def cordon_ops(node: Mapping[str, Any], target: str, now: str, prefix: str = "nvidia.com/",
               operation: Operation = DRIVER_UPGRADE) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """(merge patch that cordons the node, labels it cordon-required and records what it was, the record). A node
    the rollout cordoned before (resumed) keeps its first record, so a person's cordon is still known."""
    record = record_of(node, operation.annotation_key)
    if record is None:
        record = {"cordoned_before": is_cordoned(node), "allocatable": gpu_allocatable(node, prefix),
                  "target": target, "started": now}
    patch = {"metadata": {"labels": {operation.state_label: operation.step_states["cordon"]},
                          "annotations": {operation.annotation_key: json.dumps(record, sort_keys=True)}},
             "spec": {"unschedulable": True}}
    return patch, record


def uncordon_ops(node: Mapping[str, Any], operation: Operation = DRIVER_UPGRADE) -> Dict[str, Any]:
    """Merge patch that releases the node: done, the record gone, the cordon lifted only if the rollout set it."""
    record = record_of(node, operation.annotation_key) or {}
    patch: Dict[str, Any] = {"metadata": {"labels": {operation.state_label: operation.done},
                                          "annotations": {operation.annotation_key: None}}}
    if not record.get("cordoned_before"):
        patch["spec"] = {"unschedulable": None}
    return patch


def state_patch(state: str, operation: Operation = DRIVER_UPGRADE) -> Dict[str, Any]:
    return {"metadata": {"labels": {operation.state_label: state}}}


def short_allocatable(expected: Mapping[str, Any], node: Mapping[str, Any]) -> List[str]:
    """Each expected resource the node advertises less of: "nvidia.com/mig-1g.10gb: 14 expected, 0 now"."""
    now = dict((node.get("status") or {}).get("allocatable") or {})
    return ["%s: %s expected, %s now" % (key, want, now.get(key, "0"))
            for key, want in sorted(expected.items()) if quantity(now.get(key, "0")) < quantity(want)]


def counts(nodes: Sequence[Mapping[str, Any]], gpu_nodes: Sequence[str]) -> Dict[str, int]:
    """GPU nodes per rollout stage, for the metrics: pending, in_progress, done, failed, skipped."""
    by_name = {name_of(node): node for node in nodes}
    out = {"pending": 0, "in_progress": 0, "done": 0, "failed": 0, "skipped": 0}
    for name in gpu_nodes:
        node = by_name.get(name)
        if node is None:
            continue
        state = state_of(node)
        if labels_of(node).get(SKIP_LABEL) == "true":
            out["skipped"] += 1
        elif state in IN_PROGRESS:
            out["in_progress"] += 1
        elif state == DONE:
            out["done"] += 1
        elif state == FAILED:
            out["failed"] += 1
        elif state == REQUIRED:
            out["pending"] += 1
    return out
