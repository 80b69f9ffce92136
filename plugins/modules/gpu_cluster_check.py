#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_cluster_check
short_description: Report, as data, whether a Kubernetes cluster advertises and serves every GPU it should
description:
  - Read-only. It never changes the cluster and always reports C(changed=false).
  - Lists nodes, pods and resource quotas once each for the whole cluster (paged), never one call per node, so a
    thousand nodes take seconds.
  - For every GPU node (an expected node, a node matching O(gpu_node_selector), or a node advertising any
    C(nvidia.com/) resource) it reports Ready, cordoned and taints; capacity, allocatable, requested and free of
    C(nvidia.com/gpu) and of shared and MIG resource names; which sharing config the device plugin applies there; and
    whether the device plugin and DCGM exporter pods run on it.
  - Compares allocatable with what was promised, the node's physical GPUs from O(expected_nodes) times the replicas of
    the sharing config its C(nvidia.com/device-plugin.config) label (or O(default_sharing_config)) names, and reports
    every shortfall with both numbers.
  - Lists GPU pods that are Pending and unscheduled with the scheduler's reason, and GPU quota use per namespace.
options:
  expected_nodes:
    description:
      - GPU nodes the cluster must have, with their physical GPU count (from the inventory or the host facts).
    type: list
    elements: dict
    default: []
    suboptions:
      name:
        description: Node name.
        type: str
        required: true
      gpus:
        description: Physical GPUs on the node. Allocatable is not checked when omitted.
        type: int
  sharing_configs:
    description:
      - Named device plugin configs (the k8s-device-plugin C(version v1) file format, as a dict per name), the same
        data the device plugin role deploys. Used to work out what each node should advertise.
    type: dict
    default: {}
  default_sharing_config:
    description: Config name a node without the C(nvidia.com/device-plugin.config) label gets.
    type: str
    default: default
  gpu_node_selector:
    description: Label selector (C(key=value), comma-separated) that marks GPU nodes; empty to rely on resources only.
    type: str
    default: nvidia.com/gpu.present=true
  device_plugin:
    description: Where the device plugin pods are, and whether a GPU node without one is a problem.
    type: dict
    default: {}
    suboptions:
      namespace:
        description: Namespace of the device plugin DaemonSet.
        type: str
        default: nvidia-device-plugin
      selector:
        description: Label selector of its pods.
        type: str
        default: app.kubernetes.io/name=nvidia-device-plugin
      required:
        description: A GPU node without a running, Ready pod is a problem.
        type: bool
        default: false
  dcgm_exporter:
    description: Where the DCGM exporter pods are, and whether a GPU node without one is a problem.
    type: dict
    default: {}
    suboptions:
      namespace:
        description: Namespace of the DCGM exporter DaemonSet.
        type: str
        default: gpu-monitoring
      selector:
        description: Label selector of its pods.
        type: str
        default: app.kubernetes.io/name=dcgm-exporter
      required:
        description: A GPU node without a running, Ready pod is a problem.
        type: bool
        default: false
  fail_on_unmet:
    description: Fail the task, with the whole result, when any problem is found. When false, only report.
    type: bool
    default: false
  page_size:
    description: Objects per page of each LIST.
    type: int
    default: 500
notes:
  - Supports check mode; the module makes no changes in either mode.
  - Needs list permission on nodes, pods and resourcequotas cluster-wide.
  - With a MIG strategy other than C(none) the advertised names depend on each node's MIG layout, so allocatable is
    reported but not compared.
extends_documentation_fragment:
  - gpu_ops.cluster.k8s_auth
author:
  - GPU platform team (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Check what the cluster advertises against the GPU nodes of the inventory
  gpu_ops.cluster.gpu_cluster_check:
    kubeconfig: /var/lib/gpu-lab/pki/admin.kubeconfig
    expected_nodes:
      - {name: gpu-h100-0, gpus: 8}
      - {name: gpu-a100-0, gpus: 4}
    sharing_configs:
      default: {version: v1}
      time-sliced:
        version: v1
        sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 4}]}}
    device_plugin: {required: true}
    fail_on_unmet: true
"""

RETURN = r"""
timings:
  description:
    - Where this module's time went, in seconds. C(start) is the interpreter's start and Ansible's module wrapper
      before the module's own code; C(imports) the kubernetes client's import; C(client) reading the kubeconfig;
      C(request_nodes), C(request_pods), C(request_quotas) each LIST (the server's answer and the transfer);
      C(decode) the JSON decoding of all of them; C(logic) the check itself; C(total) the module process's whole life.
    - Ansible's own start (on the controller) is not in it.
  returned: when the cluster could be read
  type: dict
  sample: {"start": 0.21, "imports": 0.62, "client": 0.03, "request_nodes": 0.41, "decode": 0.09, "logic": 0.16}
ansible_facts:
  description: Facts for the play.
  returned: always
  type: dict
  contains:
    gpu_cluster:
      description: The cluster's GPU state and the verdict.
      returned: always
      type: dict
      contains:
        healthy:
          description: True when no problem was found.
          type: bool
        problems:
          description: Each unmet expectation, prefixed with the node name.
          type: list
          elements: str
          sample: ["gpu-a100-0: allocatable nvidia.com/gpu is 3, expected 4 (4 GPUs, config none)"]
        warnings:
          description: Noteworthy but not failing (cordoned nodes, allocatable below capacity, Pending GPU pods).
          type: list
          elements: str
        node_count:
          description: Nodes in the cluster.
          type: int
        gpu_node_count:
          description: GPU nodes found.
          type: int
        nodes:
          description: Per GPU node, ready, unschedulable, taints, capacity, allocatable, requested, free, expected,
            sharing_config, daemons (device_plugin and dcgm_exporter, each running, not_ready, missing or
            not_deployed) and problems.
          type: dict
        totals:
          description: Per resource name, allocatable and requested over all GPU nodes.
          type: dict
        pending_gpu_pods:
          description: Unscheduled Pending pods that ask for GPU resources, with the scheduler's reason and message.
          type: list
          elements: dict
        quotas:
          description: Per namespace and ResourceQuota, each GPU resource with hard and used.
          type: list
          elements: dict
        error:
          description: Why the cluster could not be read (then healthy is false); null otherwise.
          type: str
"""

import copy
import os
import time
import traceback
from typing import Any, Dict, List, Optional, Sequence, Tuple

STARTED = time.monotonic()

from ansible.module_utils.basic import AnsibleModule, missing_required_lib  # noqa: E402
from ansible_collections.gpu_ops.cluster.plugins.module_utils.gpu_cluster import check_cluster, parse_selector  # noqa: E402
from ansible_collections.gpu_ops.cluster.plugins.module_utils.k8s_raw import AUTH_ARGSPEC, api_client as k8s_api_client, pages  # noqa: E402

KUBERNETES_IMPORT_ERROR = None
try:
    from kubernetes import config as kube_config
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError as TransportError
except ImportError:
    KUBERNETES_IMPORT_ERROR = traceback.format_exc()
IMPORTED = time.monotonic()


def process_age() -> Optional[float]:
    """Seconds since this process started (Linux /proc), or None where that cannot be read."""
    try:
        with open("/proc/self/stat") as handle:
            started_ticks = int(handle.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as handle:
            uptime = float(handle.read().split()[0])
        return uptime - started_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


_DAEMON_DEFAULTS = {
    "device_plugin": {"namespace": "nvidia-device-plugin", "selector": "app.kubernetes.io/name=nvidia-device-plugin"},
    "dcgm_exporter": {"namespace": "gpu-monitoring", "selector": "app.kubernetes.io/name=dcgm-exporter"},
}


def _daemon_spec(name: str) -> Dict[str, Any]:
    defaults = _DAEMON_DEFAULTS[name]
    return dict(type="dict", default={}, options=dict(
        namespace=dict(type="str", default=defaults["namespace"]),
        selector=dict(type="str", default=defaults["selector"]),
        required=dict(type="bool", default=False),
    ))


def build_argspec() -> Dict[str, Any]:
    spec = copy.deepcopy(AUTH_ARGSPEC)
    spec.update(
        expected_nodes=dict(type="list", elements="dict", default=[], options=dict(
            name=dict(type="str", required=True), gpus=dict(type="int"))),
        sharing_configs=dict(type="dict", default={}),
        default_sharing_config=dict(type="str", default="default"),
        gpu_node_selector=dict(type="str", default="nvidia.com/gpu.present=true"),
        device_plugin=_daemon_spec("device_plugin"),
        dcgm_exporter=_daemon_spec("dcgm_exporter"),
        fail_on_unmet=dict(type="bool", default=False),
        page_size=dict(type="int", default=500),
    )
    return spec


def list_all(api_client: Any, path: str, page_size: int, timings: Optional[Dict[str, float]] = None, name: str = "",
             query: Sequence[Tuple[str, Any]] = ()) -> List[Dict[str, Any]]:
    """Every item of one LIST, page by page, as plain JSON (model objects cost seconds per thousand nodes, and the
    client's API classes import hundreds of them: module_utils/k8s_raw). Adds the seconds of the requests
    (request_<name>: sending, the server's answer, the transfer) and of decoding (decode) to timings."""
    return [item for page in pages(api_client, path, page_size, query, timings={} if timings is None else timings,
                                   name=name)
            for item in page.get("items") or []]


def read_cluster(module: AnsibleModule, timings: Dict[str, float]) -> Dict[str, List[Dict[str, Any]]]:
    started = time.monotonic()
    api_client = k8s_api_client(module.params["kubeconfig"], module.params["context"])
    size = module.params["page_size"]
    timings["client"] = time.monotonic() - started
    return {
        "nodes": list_all(api_client, "/api/v1/nodes", size, timings, "nodes"),
        # Finished pods hold no GPU; leaving them out server-side keeps big clusters' lists small.
        "pods": list_all(api_client, "/api/v1/pods", size, timings, "pods",
                         [("fieldSelector", "status.phase!=Succeeded,status.phase!=Failed")]),
        "quotas": list_all(api_client, "/api/v1/resourcequotas", size, timings, "quotas"),
    }


def main() -> None:
    module = AnsibleModule(argument_spec=build_argspec(), supports_check_mode=True)
    if KUBERNETES_IMPORT_ERROR is not None:
        module.fail_json(msg=missing_required_lib("kubernetes"), exception=KUBERNETES_IMPORT_ERROR)
    params = module.params
    for option in ("gpu_node_selector",):
        try:
            parse_selector(params[option])
        except ValueError as exc:
            module.fail_json(msg="%s: %s" % (option, exc))
    for daemon in ("device_plugin", "dcgm_exporter"):
        try:
            parse_selector(params[daemon]["selector"])
        except ValueError as exc:
            module.fail_json(msg="%s.selector: %s" % (daemon, exc))
    if params["page_size"] < 1:
        module.fail_json(msg="page_size=%r: allowed is a positive integer" % params["page_size"])
    age = process_age()
    timings: Dict[str, float] = {"start": (age - (time.monotonic() - STARTED)) if age is not None else 0.0,
                                 "imports": IMPORTED - STARTED}
    try:
        objects = read_cluster(module, timings)
    except (ApiException, TransportError, OSError, ValueError, kube_config.ConfigException) as exc:
        result = {"healthy": False, "problems": ["cannot read the cluster: %s" % exc], "error": str(exc)}
        if params["fail_on_unmet"]:
            module.fail_json(msg="cannot read the cluster: %s" % exc, ansible_facts={"gpu_cluster": result})
        module.exit_json(changed=False, ansible_facts={"gpu_cluster": result})
    started = time.monotonic()
    facts = check_cluster(
        objects["nodes"], objects["pods"], objects["quotas"],
        expected_nodes=params["expected_nodes"], sharing_configs=params["sharing_configs"],
        default_config=params["default_sharing_config"], gpu_node_selector=params["gpu_node_selector"],
        daemons={"device_plugin": params["device_plugin"], "dcgm_exporter": params["dcgm_exporter"]},
    )
    timings["logic"] = time.monotonic() - started
    age = process_age()
    timings["total"] = age if age is not None else time.monotonic() - STARTED
    timings = {key: round(value, 3) for key, value in timings.items()}
    facts["error"] = None
    if params["fail_on_unmet"] and not facts["healthy"]:
        module.fail_json(msg="GPU cluster check failed: " + "; ".join(facts["problems"]),
                         ansible_facts={"gpu_cluster": facts}, timings=timings)
    module.exit_json(changed=False, ansible_facts={"gpu_cluster": facts}, timings=timings)


if __name__ == "__main__":
    main()
