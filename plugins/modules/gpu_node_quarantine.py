#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_node_quarantine
short_description: Taint the GPU nodes whose GPUs failed a health check, and release them once healthy again
description:
  - Takes each checked node's verdict (O(verdicts), from M(gpu_ops.cluster.nvidia_gpu_facts) on the node) and reads
    every node with one paged LIST.
  - An unhealthy node gets the taint O(taint_key)C(=true:)O(taint_effect) and the annotation
    C(gpu-cluster.dev/gpu-health), a JSON object with C(since) and C(problems) (which GPU and why). A quarantined node
    whose reasons change gets the new ones, C(since) kept.
  - A quarantined node is released (its taint and annotation removed) only when its verdict says healthy.
  - Nothing else changes on a node. A cordon (C(spec.unschedulable)) and other taints stay as they are, so a node a
    person cordoned stays cordoned. Nodes without a verdict are left alone, and so are nodes in the middle of a
    rolling driver upgrade (label C(gpu-cluster.dev/driver-upgrade-state) between C(cordon-required) and
    C(uncordon-required)), which the rollout validates itself.
  - Circuit breaker. At most O(max_unhealthy_percent) of the GPU nodes (O(gpu_node_selector)) are quarantined at once,
    those already quarantined included. The unhealthy nodes beyond are reported in RV(held_back), not tainted.
  - Each node is changed by a JSON patch whose first operation tests that its taints are still the ones read, so a
    taint another controller set meanwhile is never lost (the node is reported, the run fails, a re-run applies).
  - In check mode each patch goes to the API server as a server-side dry run (C(dryRun=All)).
options:
  verdicts:
    description:
      - Node name to its verdict, C({healthy, problems}) as M(gpu_ops.cluster.nvidia_gpu_facts) reports them. A
        node is unhealthy when C(healthy) is false or C(problems) is not empty.
    type: dict
    required: true
  reported_problems:
    description:
      - Node name to problems another source reported (M(gpu_ops.cluster.gpu_prometheus_health), the DCGM
        exporter's series). Such a node is unhealthy, with or without a verdict; only its verdict releases it.
    type: dict
    default: {}
  gpu_node_selector:
    description:
      - Label selector of the GPU nodes. They and the nodes of O(verdicts) are the whole that
        O(max_unhealthy_percent) is a share of.
    type: str
    default: nvidia.com/gpu.present=true
  max_unhealthy_percent:
    description: Share of the GPU nodes, 0 to 100, that may be quarantined at once.
    type: int
    default: 20
  taint_key:
    description: Key of the quarantine taint.
    type: str
    default: gpu-cluster.dev/gpu-unhealthy
  taint_effect:
    description: Effect of the quarantine taint. C(NoExecute) also evicts the pods already on the node.
    type: str
    choices: [NoSchedule, NoExecute]
    default: NoSchedule
  page_size:
    description: Nodes per page of the LIST.
    type: int
    default: 500
notes:
  - Needs C(list) and C(patch) on nodes.
extends_documentation_fragment:
  - gpu_ops.cluster.k8s_auth
author: GPU platform team (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Quarantine the GPU nodes whose GPUs failed the health check
  gpu_ops.cluster.gpu_node_quarantine:
    kubeconfig: /etc/kubernetes/admin.conf
    verdicts:
      gpu-h100-0: {healthy: false, problems: ["GPU 3 (0000:5d:00): expected no GPU Xid error since boot, found Xid 79"]}
      gpu-h100-1: {healthy: true, problems: []}
    max_unhealthy_percent: 25
"""

RETURN = r"""
quarantined:
  description: Nodes tainted by this run (in check mode, that would be).
  returned: always
  type: list
  elements: str
released:
  description: Quarantined nodes whose verdict is healthy again, taint and annotation removed.
  returned: always
  type: list
  elements: str
updated:
  description: Quarantined nodes whose reasons changed (annotation rewritten, still tainted).
  returned: always
  type: list
  elements: str
kept:
  description: Quarantined nodes still unhealthy for the same reasons (unchanged).
  returned: always
  type: list
  elements: str
held_back:
  description: Unhealthy nodes the circuit breaker left untainted.
  returned: always
  type: list
  elements: str
upgrading:
  description: Nodes with a verdict left alone because a rolling driver upgrade has them (its state label).
  returned: always
  type: list
  elements: str
missing_nodes:
  description: Nodes with a verdict that the cluster does not have.
  returned: always
  type: list
  elements: str
limit:
  description: The most GPU nodes that may be quarantined at once.
  returned: always
  type: int
summary:
  description: The above in lines a person reads.
  returned: always
  type: list
  elements: str
result:
  description:
    - One entry per node changed (in check mode, that would be), shaped like M(kubernetes.core.k8s)'s per-object
      results, so drift reports name each node.
  returned: always
  type: dict
  contains:
    results:
      description: C(changed), C(result) (the Node's C(kind) and C(metadata.name)) and C(diff) (C(before) and
        C(after) of the node's taints and health annotation).
      type: list
      elements: dict
"""

import copy
import datetime
import traceback
from typing import Any, Dict, List

from ansible.module_utils.basic import AnsibleModule, missing_required_lib
from ansible_collections.gpu_ops.cluster.plugins.module_utils.gpu_quarantine import node_changes, plan, summary, with_reported
from ansible_collections.gpu_ops.cluster.plugins.module_utils.k8s_raw import AUTH_ARGSPEC, api_client, call_json, pages

KUBERNETES_IMPORT_ERROR = None
try:
    from kubernetes import config as kube_config
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError as TransportError
except ImportError:
    KUBERNETES_IMPORT_ERROR = traceback.format_exc()


def build_argspec() -> Dict[str, Any]:
    spec = copy.deepcopy(AUTH_ARGSPEC)
    spec.update(
        verdicts=dict(type="dict", required=True),
        reported_problems=dict(type="dict", default={}),
        gpu_node_selector=dict(type="str", default="nvidia.com/gpu.present=true"),
        max_unhealthy_percent=dict(type="int", default=20),
        taint_key=dict(type="str", default="gpu-cluster.dev/gpu-unhealthy", no_log=False),
        taint_effect=dict(type="str", choices=["NoSchedule", "NoExecute"], default="NoSchedule"),
        page_size=dict(type="int", default=500),
    )
    return spec


def input_problems(params: Dict[str, Any]) -> List[str]:
    problems = []
    if not 0 <= params["max_unhealthy_percent"] <= 100:
        problems.append("max_unhealthy_percent=%r; allowed: 0 to 100" % params["max_unhealthy_percent"])
    if params["page_size"] < 1:
        problems.append("page_size=%r; allowed: a positive integer" % params["page_size"])
    for node, verdict in sorted(params["verdicts"].items()):
        if not isinstance(verdict, dict) or not isinstance(verdict.get("healthy"), bool) \
                or not isinstance(verdict.get("problems", []), list):
            problems.append("verdicts.%s=%r; allowed: {healthy: true or false, problems: [text, ...]}"
                            % (node, verdict))
    for node, reported in sorted(params["reported_problems"].items()):
        if not isinstance(reported, list):
            problems.append("reported_problems.%s=%r; allowed: a list of problems (text)" % (node, reported))
    return problems


def list_nodes(api: Any, page_size: int, selector: str = "") -> List[Dict[str, Any]]:
    query = [("labelSelector", selector)] if selector else []
    return [node for page in pages(api, "/api/v1/nodes", page_size, query) for node in page.get("items") or []]


def main() -> None:
    module = AnsibleModule(argument_spec=build_argspec(), supports_check_mode=True)
    if KUBERNETES_IMPORT_ERROR is not None:
        module.fail_json(msg=missing_required_lib("kubernetes"), exception=KUBERNETES_IMPORT_ERROR)
    params = module.params
    problems = input_problems(params)
    if problems:
        module.fail_json(msg="; ".join(problems))
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    try:
        api = api_client(params["kubeconfig"], params["context"])
        nodes = list_nodes(api, params["page_size"])
        # The GPU nodes: those the selector names, and every node with a verdict (the inventory's GPU nodes).
        names = {node["metadata"]["name"] for node in nodes}
        selected = list_nodes(api, params["page_size"], params["gpu_node_selector"])
        verdicts = with_reported(params["verdicts"], params["reported_problems"])
        gpu_nodes = sorted({node["metadata"]["name"] for node in selected} | (set(verdicts) & names))
        decided = plan(nodes, verdicts, gpu_nodes, params["max_unhealthy_percent"], now,
                       params["taint_key"], params["taint_effect"])
        refused = []
        for node, operations in sorted(decided["patches"].items()):
            try:
                call_json(api, "/api/v1/nodes/%s" % node, "PATCH",
                          [("dryRun", "All")] if module.check_mode else [],
                          {"Content-Type": "application/json-patch+json", "Accept": "application/json"}, operations)
            except ApiException as exc:
                refused.append("%s: %s %s: %s" % (node, exc.status, exc.reason, (exc.body or "")[:300]))
    except ApiException as exc:
        module.fail_json(msg="the API server refused a node request: %s %s: %s" % (exc.status, exc.reason, exc.body))
    except (TransportError, OSError, ValueError, kube_config.ConfigException) as exc:
        module.fail_json(msg="cannot reach the cluster: %s" % exc)
    result: Dict[str, Any] = {
        "changed": bool(decided["patches"]), "quarantined": decided["quarantine"], "released": decided["release"],
        "updated": decided["update"], "kept": decided["keep"], "held_back": decided["held_back"],
        "missing_nodes": decided["missing"], "upgrading": decided["upgrading"], "limit": decided["limit"],
        "summary": summary(decided, len(gpu_nodes)),
    }
    changes = node_changes(nodes, decided["patches"])
    result["result"] = {"results": changes}
    result["diff"] = [change["diff"] for change in changes]
    for node in decided["missing"]:
        module.warn("node %s has a verdict but is not in the cluster" % node)
    if decided["held_back"]:
        module.warn(result["summary"][-1])
    if refused:
        module.fail_json(msg="the API server refused the quarantine of %d node(s) (a node whose taints changed since "
                             "they were read is left for a re-run): %s" % (len(refused), "; ".join(refused)),
                         **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
