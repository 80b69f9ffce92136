# -*- coding: utf-8 -*-
# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)
"""What the GPU health quarantine does to each node, worked out from the nodes as they are and each node's verdict.

A node whose GPUs fail the health check gets a NoSchedule taint (TAINT_KEY, value "true") and an annotation
(ANNOTATION_KEY) that says which GPU and why, and since when. Nothing else of the node changes: its other taints, a
cordon (spec.unschedulable) and its labels stay as they are, so a cordon a person set is never undone. A quarantined
node is released (the taint and the annotation removed) only when a verdict says it is healthy again. A circuit
breaker keeps at most a share of the GPU nodes quarantined: a fault that every node reports at once is more likely a
broken check, a driver roll-out or the exporter than that many failed GPUs, so beyond the share the nodes are only
reported (held_back).
"""

from __future__ import absolute_import, annotations, division, print_function

import copy
import json
import math
from typing import Any, Dict, List, Mapping, Optional, Sequence

from ansible_collections.gpu_ops.cluster.plugins.module_utils.gpu_upgrade import taken_out
from ansible_collections.gpu_ops.cluster.plugins.module_utils.k8s_values import json_annotation

TAINT_KEY = "gpu-cluster.dev/gpu-unhealthy"
ANNOTATION_KEY = "gpu-cluster.dev/gpu-health"


def is_quarantined(node: Mapping[str, Any], taint_key: str = TAINT_KEY) -> bool:
    return any(taint.get("key") == taint_key for taint in (node.get("spec") or {}).get("taints") or [])


def annotation_of(node: Mapping[str, Any]) -> Optional[Dict[str, Any]]:
    """What the quarantine recorded on the node (None: nothing, or not a JSON object)."""
    return json_annotation(node, ANNOTATION_KEY)


def pointer(*parts: str) -> str:
    """A JSON pointer (RFC 6901) to a member: '/' and '~' in a key escaped."""
    return "".join("/" + part.replace("~", "~0").replace("/", "~1") for part in parts)


def taint_ops(node: Mapping[str, Any], taints: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """JSON patch operations that set spec.taints to `taints`, only if they are still what this run read (a test
    operation): a node's status moves with every heartbeat, its taints do not, so this is the precondition that
    matters, and a taint another controller added meanwhile is never lost."""
    current = (node.get("spec") or {}).get("taints")
    if current is None:
        return [{"op": "add", "path": "/spec/taints", "value": taints}]
    return [{"op": "test", "path": "/spec/taints", "value": current},
            {"op": "replace", "path": "/spec/taints", "value": taints}]


def annotation_ops(node: Mapping[str, Any], value: Optional[str]) -> List[Dict[str, Any]]:
    annotations = (node.get("metadata") or {}).get("annotations")
    if value is None:
        return [{"op": "remove", "path": pointer("metadata", "annotations", ANNOTATION_KEY)}] \
            if annotations and ANNOTATION_KEY in annotations else []
    if annotations is None:
        return [{"op": "add", "path": "/metadata/annotations", "value": {ANNOTATION_KEY: value}}]
    return [{"op": "add", "path": pointer("metadata", "annotations", ANNOTATION_KEY), "value": value}]


def with_reported(verdicts: Mapping[str, Mapping[str, Any]], reported: Mapping[str, Sequence[str]]
                  ) -> Dict[str, Dict[str, Any]]:
    """The verdicts with the problems another source reported (the DCGM exporter's series) added: such a node is
    unhealthy, with a verdict of its own or without one (a node the run could not reach). Only a node's own verdict
    can say it is healthy, so only that releases it."""
    merged = {name: {"healthy": bool(verdict.get("healthy")), "problems": list(verdict.get("problems") or [])}
              for name, verdict in verdicts.items()}
    for name, problems in reported.items():
        if not problems:
            continue
        verdict = merged.setdefault(name, {"healthy": False, "problems": []})
        verdict["healthy"] = False
        verdict["problems"] = verdict["problems"] + [p for p in problems if p not in verdict["problems"]]
    return merged


def plan(nodes: Sequence[Mapping[str, Any]], verdicts: Mapping[str, Mapping[str, Any]], gpu_nodes: Sequence[str],
         max_share: float, now: str, taint_key: str = TAINT_KEY, effect: str = "NoSchedule") -> Dict[str, Any]:
    """{patches: node -> JSON patch operations, quarantine, release, update, keep, held_back, missing, limit}.

    verdicts: node -> {healthy: bool, problems: [str]} for the nodes checked this run; other nodes are left alone.
    gpu_nodes: the names of every GPU node (the circuit breaker's whole). max_share: 0-100 (percent of them that may
    be quarantined at once, those already quarantined included)."""
    by_name = {(node.get("metadata") or {}).get("name"): node for node in nodes}
    limit = int(math.floor(len(gpu_nodes) * max_share / 100.0))
    already = [name for name in gpu_nodes if name in by_name and is_quarantined(by_name[name], taint_key)]
    result: Dict[str, Any] = {"patches": {}, "quarantine": [], "release": [], "update": [], "keep": [],
                              "held_back": [], "missing": [], "upgrading": [], "limit": limit}
    room = limit - len(already)
    for name in sorted(verdicts):
        verdict = verdicts[name]
        node = by_name.get(name)
        if node is None:
            result["missing"].append(name)
            continue
        # A node in the middle of a rolling driver upgrade or a MIG reconfiguration belongs to that operation (it
        # validates the node itself): its driver and GPUs are in flux, so its verdict is not acted on.
        if taken_out(node):
            result["upgrading"].append(name)
            continue
        problems = [str(problem) for problem in verdict.get("problems") or []]
        healthy = bool(verdict.get("healthy")) and not problems
        taints = list((node.get("spec") or {}).get("taints") or [])
        quarantined = is_quarantined(node, taint_key)
        if healthy:
            if quarantined:
                result["release"].append(name)
                result["patches"][name] = taint_ops(node, [t for t in taints if t.get("key") != taint_key]) \
                    + annotation_ops(node, None)
            continue
        recorded = annotation_of(node) or {}
        if quarantined:
            if recorded.get("problems") == problems:
                result["keep"].append(name)
            else:
                result["update"].append(name)
                annotation = {"since": recorded.get("since") or now, "problems": problems}
                result["patches"][name] = annotation_ops(node, json.dumps(annotation, sort_keys=True))
            continue
        if room <= 0:
            result["held_back"].append(name)
            continue
        room -= 1
        result["quarantine"].append(name)
        annotation = {"since": now, "problems": problems}
        result["patches"][name] = taint_ops(node, taints + [{"key": taint_key, "value": "true", "effect": effect}]) \
            + annotation_ops(node, json.dumps(annotation, sort_keys=True))
    return result


def _unescape(part: str) -> str:
    return part.replace("~1", "/").replace("~0", "~")


def apply_patch(document: Mapping[str, Any], operations: Sequence[Mapping[str, Any]]) -> Dict[str, Any]:
    """The document after JSON patch operations (RFC 6902 add, remove, replace and test, on object members: the
    operations plan() makes), as the API server would apply them; ValueError where the server would refuse."""
    result = copy.deepcopy(dict(document))
    for operation in operations:
        parts = [_unescape(part) for part in operation["path"].split("/")[1:]]
        parent = result
        for part in parts[:-1]:
            if not isinstance(parent.get(part), dict):
                raise ValueError("%s: no object at %s" % (operation["op"], operation["path"]))
            parent = parent[part]
        key, kind = parts[-1], operation["op"]
        if kind == "test":
            if parent.get(key) != operation["value"]:
                raise ValueError("test failed at %s" % operation["path"])
        elif kind in ("add", "replace"):
            if kind == "replace" and key not in parent:
                raise ValueError("replace: nothing at %s" % operation["path"])
            parent[key] = copy.deepcopy(operation["value"])
        elif kind == "remove":
            if key not in parent:
                raise ValueError("remove: nothing at %s" % operation["path"])
            del parent[key]
        else:
            raise ValueError("unsupported operation %r" % kind)
    return result


def health_view(node: Mapping[str, Any]) -> Dict[str, Any]:
    """What the quarantine owns of a node: its taints and the health annotation (for diffs and drift reports)."""
    annotation = ((node.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_KEY)
    return {"spec": {"taints": list((node.get("spec") or {}).get("taints") or [])},
            "metadata": {"annotations": {ANNOTATION_KEY: annotation}}}  # None: no such annotation


def node_changes(nodes: Sequence[Mapping[str, Any]], patches: Mapping[str, Sequence[Mapping[str, Any]]]
                 ) -> List[Dict[str, Any]]:
    """One entry per patched node in the shape of kubernetes.core.k8s's per-object results (the node as `result`,
    `diff` before/after of what the quarantine owns), so a drift report names each node and what would change."""
    by_name = {(node.get("metadata") or {}).get("name"): node for node in nodes}
    changes = []
    for name in sorted(patches):
        node = by_name[name]
        changes.append({
            "changed": True,
            "result": {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}},
            "diff": {"before_header": "Node/%s" % name, "after_header": "Node/%s" % name,
                     "before": health_view(node), "after": health_view(apply_patch(node, patches[name]))},
        })
    return changes


def summary(result: Mapping[str, Any], gpu_node_count: int) -> List[str]:
    """Lines a person reads: what was quarantined, released, held back by the breaker."""
    lines = []
    for key, what in (("quarantine", "quarantined"), ("release", "released (healthy again)"),
                      ("update", "still quarantined, reasons updated"), ("keep", "still quarantined"),
                      ("missing", "not in the cluster"),
                      ("upgrading", "in a rolling driver upgrade (left to it)")):
        if result.get(key):
            lines.append("%s: %s" % (what, ", ".join(result[key])))
    if result.get("held_back"):
        lines.append("held back by the circuit breaker (at most %d of %d GPU nodes quarantined): %s"
                     % (result["limit"], gpu_node_count, ", ".join(result["held_back"])))
    return lines
