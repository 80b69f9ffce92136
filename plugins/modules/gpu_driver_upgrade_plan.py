#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_driver_upgrade_plan
short_description: Plan a rolling driver upgrade of GPU nodes and mark the nodes it takes
description:
  - Reads every node with one paged LIST and works out which GPU nodes a rolling driver upgrade takes, in which
    order and how many at a time (RV(batches)), from what the inventory's hosts reported (O(nodes)) and the nodes'
    state labels (C(gpu-cluster.dev/driver-upgrade-state), the GPU Operator's vocabulary).
  - O(max_unavailable) counts every GPU node that is unschedulable, not only those the rollout takes. A node a
    person cordoned, a quarantined node and a node that failed before each take a slot.
  - A re-run resumes. A node in the middle of an upgrade comes first, a node at the target is skipped, a node
    labelled C(gpu-cluster.dev/driver-upgrade.skip=true) is held back, a node that failed is retried only with
    O(retry_failed).
  - Labels the nodes it takes C(upgrade-required) (a node resumed keeps its state), and a node found at the target
    whose label says otherwise C(upgrade-done). In check mode the labels go to the API server as a server-side dry
    run and RV(summary) is the plan.
options:
  nodes:
    description:
      - Node name to C({needs_upgrade, installed}) for each GPU node the run reached. C(needs_upgrade) is whether its
        installed driver differs from the target; a node missing here is not taken.
    type: dict
    required: true
  target:
    description: The driver the rollout moves to (a branch or a version), for the plan and the nodes' records.
    type: str
    required: true
  order:
    description:
      - Node names to take first, in this order; the others follow by name.
      - A name that is not a GPU node (selected by O(gpu_node_selector), or reported in O(nodes) and in the cluster)
        is refused before any node is labelled.
    type: list
    elements: str
    default: []
  max_unavailable:
    description:
      - How many GPU nodes may be unschedulable at once, a count (C(1)) or a share of the GPU nodes (C("25%"),
        rounded down, at least one).
    type: raw
    default: 1
  retry_failed:
    description: Take the nodes labelled C(upgrade-failed) again.
    type: bool
    default: false
  drain:
    description: Whether each node is fully drained (only for the plan's description of the steps).
    type: bool
    default: false
  gpu_node_selector:
    description: Label selector of the GPU nodes; they and the nodes of O(nodes) are the whole of O(max_unavailable).
    type: str
    default: nvidia.com/gpu.present=true
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
- name: Plan the move of the GPU nodes to branch 590, one node at a time
  gpu_ops.cluster.gpu_driver_upgrade_plan:
    kubeconfig: /etc/kubernetes/admin.conf
    nodes:
      gpu-h100-0: {needs_upgrade: true, installed: "580.105.08"}
      gpu-h100-1: {needs_upgrade: false, installed: "590.48.01"}
    target: "590"
    max_unavailable: 1
"""

RETURN = r"""
queue:
  description: The nodes the rollout takes, in order.
  returned: always
  type: list
  elements: str
batches:
  description: The queue in batches (nodes resumed from a previous run first, together).
  returned: always
  type: list
  elements: list
batch_size:
  description: Nodes upgraded at once (max_unavailable less the GPU nodes already unavailable).
  returned: always
  type: int
resume:
  description: Nodes resumed from their state label.
  returned: always
  type: list
  elements: str
done:
  description: Nodes already at the target.
  returned: always
  type: list
  elements: str
skipped:
  description: Nodes held back by the skip label.
  returned: always
  type: list
  elements: str
failed_before:
  description: Nodes that failed before, left as they are (see O(retry_failed)).
  returned: always
  type: list
  elements: str
unreachable:
  description: Nodes in the middle of an upgrade that the run did not reach.
  returned: always
  type: list
  elements: str
unavailable:
  description: GPU nodes unschedulable outside the queue, counted against O(max_unavailable).
  returned: always
  type: list
  elements: str
blocked:
  description: Why no new node can be taken out (empty when it can).
  returned: always
  type: str
labelled:
  description: Node to the state label this run set (in check mode, would set).
  returned: always
  type: dict
target:
  description: O(target), for the report.
  returned: always
  type: str
counts:
  description: GPU nodes per stage after this run's labels (pending, in_progress, done, failed, skipped).
  returned: always
  type: dict
summary:
  description: The plan in lines a person reads.
  returned: always
  type: list
  elements: str
"""

import copy
import traceback
from typing import Any, Dict, List

from ansible.module_utils.basic import AnsibleModule, missing_required_lib
from ansible_collections.gpu_ops.cluster.plugins.module_utils import gpu_upgrade as upgrade
from ansible_collections.gpu_ops.cluster.plugins.module_utils.k8s_raw import AUTH_ARGSPEC, api_client, call_json, pages

KUBERNETES_IMPORT_ERROR = None
try:
    from kubernetes import config as kube_config
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError as TransportError
except ImportError:
    KUBERNETES_IMPORT_ERROR = traceback.format_exc()

MERGE_PATCH = {"Content-Type": "application/merge-patch+json", "Accept": "application/json"}


def build_argspec() -> Dict[str, Any]:
    spec = copy.deepcopy(AUTH_ARGSPEC)
    spec.update(
        nodes=dict(type="dict", required=True),
        target=dict(type="str", required=True),
        order=dict(type="list", elements="str", default=[]),
        max_unavailable=dict(type="raw", default=1),
        retry_failed=dict(type="bool", default=False),
        drain=dict(type="bool", default=False),
        gpu_node_selector=dict(type="str", default="nvidia.com/gpu.present=true"),
        page_size=dict(type="int", default=500),
    )
    return spec


def input_problems(params: Dict[str, Any]) -> List[str]:
    problems = []
    try:
        upgrade.parse_max_unavailable(params["max_unavailable"])
    except ValueError as exc:
        problems.append(str(exc))
    for name, report in sorted(params["nodes"].items()):
        if not isinstance(report, dict) or not isinstance(report.get("needs_upgrade"), bool):
            problems.append("nodes.%s=%r; allowed: {needs_upgrade: true or false, installed: version}" % (name, report))
    if params["page_size"] < 1:
        problems.append("page_size=%r; allowed: a positive integer" % params["page_size"])
    return problems


def label_changes(nodes: List[Dict[str, Any]], plan: Dict[str, Any]) -> Dict[str, str]:
    """Node -> the state label this run sets: upgrade-required on new queue nodes, upgrade-done on nodes found at
    the target whose label says otherwise."""
    by_name = {upgrade.name_of(node): node for node in nodes}
    changes = {}
    for name in plan["queue"]:
        if name not in plan["resume"] and upgrade.state_of(by_name[name]) != upgrade.REQUIRED:
            changes[name] = upgrade.REQUIRED
    for name in plan["done"]:
        if upgrade.state_of(by_name[name]) not in ("", upgrade.DONE):
            changes[name] = upgrade.DONE
    return changes


def main() -> None:
    module = AnsibleModule(argument_spec=build_argspec(), supports_check_mode=True)
    if KUBERNETES_IMPORT_ERROR is not None:
        module.fail_json(msg=missing_required_lib("kubernetes"), exception=KUBERNETES_IMPORT_ERROR)
    params = module.params
    problems = input_problems(params)
    if problems:
        module.fail_json(msg="; ".join(problems))
    needs = {name: report["needs_upgrade"] for name, report in params["nodes"].items()}
    try:
        api = api_client(params["kubeconfig"], params["context"])
        nodes = [node for page in pages(api, "/api/v1/nodes", params["page_size"]) for node in page.get("items") or []]
        names = {upgrade.name_of(node) for node in nodes}
        selected = [upgrade.name_of(node) for page in pages(
            api, "/api/v1/nodes", params["page_size"], [("labelSelector", params["gpu_node_selector"])])
            for node in page.get("items") or []]
        gpu_nodes = sorted(set(selected) | (set(needs) & names))
        # Before any label: a name that is no GPU node would be skipped, and the rollout start elsewhere.
        problems = upgrade.order_problems(params["order"], gpu_nodes)
        if problems:
            module.fail_json(msg="; ".join(problems))
        plan = upgrade.plan_rollout(nodes, needs, gpu_nodes, params["max_unavailable"], params["order"],
                                    params["retry_failed"])
        changes = label_changes(nodes, plan)
        for name, state in sorted(changes.items()):
            call_json(api, "/api/v1/nodes/%s" % name, "PATCH", [("dryRun", "All")] if module.check_mode else [],
                      MERGE_PATCH, upgrade.state_patch(state))
    except ApiException as exc:
        module.fail_json(msg="the API server refused a node request: %s %s: %s" % (exc.status, exc.reason, exc.body))
    except (TransportError, OSError, kube_config.ConfigException) as exc:
        module.fail_json(msg="cannot reach the cluster: %s" % exc)
    for node in nodes:
        name = upgrade.name_of(node)
        if name in changes:
            node.setdefault("metadata", {}).setdefault("labels", {})[upgrade.STATE_LABEL] = changes[name]
    result = dict(changed=bool(changes), labelled=changes, counts=upgrade.counts(nodes, gpu_nodes), target=params["target"],
                  summary=upgrade.plan_summary(plan, params["target"], params["drain"]), **plan)
    if plan["missing"]:
        module.warn("not in the cluster: %s" % ", ".join(plan["missing"]))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
