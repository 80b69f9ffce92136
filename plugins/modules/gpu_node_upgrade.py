#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_node_upgrade
short_description: One cluster-side step of a GPU node's driver upgrade (cordon, wait, evict, drain, validate, release)
description:
  - Moves one node through the rolling upgrade's states, each shown on the node as the label
    C(gpu-cluster.dev/driver-upgrade-state) before the step runs, so a re-run resumes where one stopped.
  - C(cordon) records on the node (annotation C(gpu-cluster.dev/driver-upgrade)) whether it was already
    unschedulable and the GPUs it advertises, then cordons it.
  - C(wait-for-jobs) waits up to O(wait_timeout) seconds for the GPU pods on the node (those matching
    O(pod_selector) when given) to finish. Pods still running then are left to the next step.
  - C(pod-deletion) evicts the GPU pods still running through the Eviction API, so PodDisruptionBudgets decide. An
    eviction the API server refuses (HTTP 429) is tried again until O(eviction_timeout), then the step fails naming
    the pod and the server's reason. Nothing is ever deleted or forced.
  - C(drain) evicts every other pod the same way, except DaemonSets' and static pods.
  - C(validate) waits up to O(validation_timeout) for the node to be Ready and to advertise at least the GPUs
    recorded at the cordon.
  - C(uncordon) lifts the cordon only when the rollout set it (a person's cordon stays), removes the record and
    labels the node C(upgrade-done).
  - C(failed) labels the node C(upgrade-failed) and leaves it cordoned with its record, for a person or a re-run.
  - In check mode nothing is sent and the result says what the step would do.
options:
  node:
    description: The node's name.
    type: str
    required: true
  step:
    description: The step to run.
    type: str
    required: true
    choices: [cordon, wait-for-jobs, pod-deletion, drain, validation-required, validate, uncordon, failed]
  operation:
    description:
      - What takes the node out. C(driver-upgrade) shows each step as C(gpu-cluster.dev/driver-upgrade-state) and
        records in the annotation C(gpu-cluster.dev/driver-upgrade).
      - C(mig-reconfigure) (the nvidia_mig role) shows C(nvidia.com/mig.config.state) as the GPU Operator's MIG
        manager does (C(pending) during the steps, C(success) at the release, C(failed)) and records in the
        annotation C(gpu-cluster.dev/mig-reconfigure).
    type: str
    choices: [driver-upgrade, mig-reconfigure]
    default: driver-upgrade
  expected_allocatable:
    description:
      - For C(validate), the GPU resources the node must advertise (at least), instead of those recorded at the
        cordon; a MIG layout changes which resources a node has.
    type: dict
  target:
    description: What the operation moves the node to (the driver, the MIG config), recorded at the cordon.
    type: str
    default: ""
  pod_selector:
    description: Label selector of the pods C(wait-for-jobs) waits for (among the GPU pods). Empty, every GPU pod.
    type: str
    default: ""
  gpu_resource_prefix:
    description: A pod asking for a resource with this prefix is a GPU pod; a node's resources with it are its GPUs.
    type: str
    default: nvidia.com/
  gpu_dra_drivers:
    description:
      - DRA drivers whose devices are GPUs. A pod holding a ResourceClaim allocated by one of them is a GPU pod, as
        one asking for a resource under O(gpu_resource_prefix) is.
    type: list
    elements: str
    default: [gpu.nvidia.com]
  wait_timeout:
    description: Seconds C(wait-for-jobs) waits. 0 does not wait.
    type: int
    default: 0
  eviction_timeout:
    description: Seconds an eviction is retried while refused, and the evicted pods are waited for.
    type: int
    default: 300
  validation_timeout:
    description: Seconds C(validate) waits for the node to be Ready with its GPUs.
    type: int
    default: 300
  poll_interval:
    description: Seconds between reads while waiting.
    type: float
    default: 2
notes:
  - Needs C(get) and C(patch) on nodes, C(list) on pods, C(create) on C(pods/eviction), and C(list) on
    C(resourceclaims.resource.k8s.io) to recognise pods with DRA-allocated GPUs (without it they are not, with a
    warning).
extends_documentation_fragment:
  - gpu_ops.cluster.k8s_auth
author: GPU platform team (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Evict the GPU pods still on the node
  gpu_ops.cluster.gpu_node_upgrade:
    node: gpu-h100-0
    step: pod-deletion
    eviction_timeout: 600
  delegate_to: localhost
"""

RETURN = r"""
state:
  description: The node's state label after the step.
  returned: always
  type: str
waited:
  description: Seconds the step waited.
  returned: always
  type: float
evicted:
  description: Pods (C(namespace/name)) evicted by the step.
  returned: always
  type: list
  elements: str
remaining:
  description: GPU pods still running when C(wait-for-jobs) stopped waiting.
  returned: always
  type: list
  elements: str
record:
  description: What the rollout recorded on the node at its cordon.
  returned: always
  type: dict
"""

import copy
import datetime
import time
import traceback
from typing import Any, Callable, Dict, List, Optional

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
STEPS = sorted(upgrade.DRIVER_UPGRADE.step_states)


class StepFailed(Exception):
    pass


class Node:
    """The requests one node's steps make."""

    def __init__(self, api: Any, name: str, params: Dict[str, Any]) -> None:
        self.api, self.name, self.params = api, name, params
        self.warnings: List[str] = []
        self.path = "/api/v1/nodes/%s" % name

    def read(self) -> Dict[str, Any]:
        return call_json(self.api, self.path)

    def patch(self, body: Dict[str, Any]) -> Dict[str, Any]:
        return call_json(self.api, self.path, "PATCH", [], MERGE_PATCH, body)

    def gpu_claims(self) -> set:
        """ResourceClaims allocated by a GPU DRA driver; none where the cluster serves no resource.k8s.io/v1."""
        try:
            claims = [c for page in pages(self.api, "/apis/resource.k8s.io/v1/resourceclaims", 500, [])
                      for c in page.get("items") or []]
        except ApiException as exc:
            if exc.status == 404:
                return set()
            if exc.status == 403:
                self.warnings.append("cannot list resourceclaims (%s): pods with DRA-allocated GPUs are not "
                                     "recognised as GPU pods; grant list on resourceclaims.resource.k8s.io" % exc.reason)
                return set()
            raise
        return upgrade.gpu_claims(claims, self.params.get("gpu_dra_drivers") or upgrade.GPU_DRA_DRIVERS)

    def pods(self, selector: str = "") -> List[Dict[str, Any]]:
        query = [("fieldSelector", "spec.nodeName=%s" % self.name)] + ([("labelSelector", selector)] if selector else [])
        return [pod for page in pages(self.api, "/api/v1/pods", 500, query) for pod in page.get("items") or []]

    def evict(self, pod: Dict[str, Any]) -> Optional[str]:
        """None when the eviction was accepted (or the pod is gone), else the server's reason for refusing it."""
        meta = pod["metadata"]
        body = {"apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": meta["name"], "namespace": meta["namespace"]}}
        try:
            call_json(self.api, "/api/v1/namespaces/%s/pods/%s/eviction" % (meta["namespace"], meta["name"]), "POST",
                      body=body)
        except ApiException as exc:
            if exc.status == 404:
                return None
            if exc.status == 429:
                return message_of(exc)
            raise
        return None


def message_of(exc: Any) -> str:
    import json

    try:
        return str(json.loads(exc.body).get("message") or exc.reason)
    except (TypeError, ValueError, AttributeError):
        return str(exc.reason)


def wait_until(condition: Callable[[], bool], timeout: float, interval: float) -> float:
    """Seconds waited; stops when condition() holds or timeout passes (condition checked at least once)."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started >= timeout:
            break
        time.sleep(interval)
    return round(time.monotonic() - started, 1)


def move_pods(node: Node, drain: bool, result: Dict[str, Any]) -> None:
    """Evict the pods the step moves, retrying refused evictions, then wait until they are gone."""
    params = node.params
    prefix = params["gpu_resource_prefix"]
    deadline = time.monotonic() + params["eviction_timeout"]
    refused: Dict[str, str] = {}
    while True:
        todo = upgrade.pods_to_move(node.pods(), drain, prefix, claims=node.gpu_claims())
        refused = {}
        for pod in todo:
            reason = node.evict(pod)
            ref = upgrade.pod_ref(pod)
            if reason is None:
                if ref not in result["evicted"]:
                    result["evicted"].append(ref)
            else:
                refused[ref] = reason
        if not refused or time.monotonic() >= deadline:
            break
        time.sleep(params["poll_interval"])
    if refused:
        raise StepFailed("eviction refused for %d s, nothing forced: %s; the node stays cordoned"
                         % (params["eviction_timeout"],
                            "; ".join("%s: %s" % (ref, why) for ref, why in sorted(refused.items()))))
    leaving: List[str] = []
    claims = node.gpu_claims()

    def gone() -> bool:
        still = upgrade.pods_to_move(node.pods(), drain, prefix, leaving=True, claims=claims)
        leaving[:] = [upgrade.pod_ref(pod) for pod in still]
        return not leaving
    result["waited"] += wait_until(gone, max(0.0, deadline - time.monotonic()), params["poll_interval"])
    if leaving:
        raise StepFailed("evicted pods still on the node after %d s: %s"
                         % (params["eviction_timeout"], ", ".join(leaving)))


def run_step(node: Node, step: str, now: str) -> Dict[str, Any]:
    params = node.params
    prefix = params["gpu_resource_prefix"]
    operation = upgrade.OPERATIONS[params.get("operation") or "driver-upgrade"]
    result: Dict[str, Any] = {"changed": True, "state": operation.step_states[step], "waited": 0.0, "evicted": [],
                              "remaining": [], "record": {}}
    current = node.read()
    result["record"] = upgrade.record_of(current, operation.annotation_key) or {}
    if step == "cordon":
        patch, record = upgrade.cordon_ops(current, params["target"], now, prefix, operation)
        node.patch(patch)
        result["record"] = record
        return result
    if step == "uncordon":
        node.patch(upgrade.state_patch(operation.step_states["uncordon"], operation))
        node.patch(upgrade.uncordon_ops(current, operation))
        result["state"] = operation.done
        return result
    node.patch(upgrade.state_patch(operation.step_states[step], operation))
    if step == "wait-for-jobs":
        claims = node.gpu_claims()

        def finished() -> bool:
            running = upgrade.pods_to_move(node.pods(params["pod_selector"]), False, prefix, claims=claims)
            result["remaining"] = [upgrade.pod_ref(pod) for pod in running]
            return not running
        result["waited"] = wait_until(finished, params["wait_timeout"], params["poll_interval"])
    elif step in ("pod-deletion", "drain"):
        move_pods(node, step == "drain", result)
    elif step == "validate":
        recorded = result["record"].get("allocatable") or {}
        expected = params.get("expected_allocatable")
        why: List[str] = []

        def back() -> bool:
            latest = node.read()
            why[:] = ([] if upgrade.is_ready(latest) else ["the node is not Ready"]) \
                + (upgrade.short_allocatable(expected, latest) if expected
                   else upgrade.missing_allocatable(recorded, latest, prefix))
            return not why
        result["waited"] = wait_until(back, params["validation_timeout"], params["poll_interval"])
        if why:
            raise StepFailed("after %d s: %s" % (params["validation_timeout"], "; ".join(why)))
    return result


def build_argspec() -> Dict[str, Any]:
    spec = copy.deepcopy(AUTH_ARGSPEC)
    spec.update(
        node=dict(type="str", required=True),
        step=dict(type="str", required=True, choices=STEPS),
        operation=dict(type="str", choices=sorted(upgrade.OPERATIONS), default="driver-upgrade"),
        expected_allocatable=dict(type="dict"),
        gpu_dra_drivers=dict(type="list", elements="str", default=list(upgrade.GPU_DRA_DRIVERS)),
        target=dict(type="str", default=""),
        pod_selector=dict(type="str", default=""),
        gpu_resource_prefix=dict(type="str", default="nvidia.com/"),
        wait_timeout=dict(type="int", default=0),
        eviction_timeout=dict(type="int", default=300),
        validation_timeout=dict(type="int", default=300),
        poll_interval=dict(type="float", default=2.0),
    )
    return spec


def main() -> None:
    module = AnsibleModule(argument_spec=build_argspec(), supports_check_mode=True)
    if KUBERNETES_IMPORT_ERROR is not None:
        module.fail_json(msg=missing_required_lib("kubernetes"), exception=KUBERNETES_IMPORT_ERROR)
    params = module.params
    for key in ("wait_timeout", "eviction_timeout", "validation_timeout"):
        if params[key] < 0:
            module.fail_json(msg="%s=%r; allowed: 0 or more seconds" % (key, params[key]))
    if module.check_mode:
        module.exit_json(changed=True, state=upgrade.OPERATIONS[params["operation"]].step_states[params["step"]], waited=0.0, evicted=[], remaining=[],
                         record={}, msg="(predicted) %s on %s" % (params["step"], params["node"]))
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    try:
        node = Node(api_client(params["kubeconfig"], params["context"]), params["node"], params)
        result = run_step(node, params["step"], now)
        for warning in node.warnings:
            module.warn(warning)
    except StepFailed as exc:
        module.fail_json(msg="%s %s: %s" % (params["node"], params["step"], exc),
                         state=upgrade.OPERATIONS[params["operation"]].step_states[params["step"]])
    except ApiException as exc:
        module.fail_json(msg="%s %s: the API server refused a request: %s %s: %s"
                         % (params["node"], params["step"], exc.status, exc.reason, exc.body))
    except (TransportError, OSError, ValueError, kube_config.ConfigException) as exc:
        module.fail_json(msg="cannot reach the cluster: %s" % exc)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
