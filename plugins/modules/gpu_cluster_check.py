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
  - Nodes in DRA mode (an expected node's O(expected_nodes[].allocation_mode), else the node's label
    O(dra.mode_label)=true) advertise no C(nvidia.com/gpu); for them it counts the devices the ResourceSlices of
    O(dra.driver) publish for the node against what it should offer (one C(gpu) device per GPU, or the MIG devices of
    the node's MIG layout) and reports a mismatch with both. It lists the ResourceClaims that Pending pods wait for,
    with the scheduler's reason. ResourceSlices and ResourceClaims are listed (once each) only when a node is in DRA
    mode or a pod uses claims.
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
      allocation_mode:
        description:
          - How the node's GPUs are handed out (the nvidia_dra_driver role's allocation mode). Omitted, the node's
            label O(dra.mode_label) decides; given and different from the label, that is a problem.
        type: str
        choices: [device-plugin, dra]
      mig:
        description:
          - The node's MIG layout, one entry per GPU (from the host facts). With a device plugin MIG strategy other
            than C(none) it gives the advertised MIG resources; in DRA mode the MIG devices the slices must publish.
        type: list
        elements: dict
        suboptions:
          index:
            description: GPU index.
            type: int
            required: true
          enabled:
            description: MIG mode of the GPU.
            type: bool
            required: true
          devices:
            description: MIG devices of the GPU, profile to count.
            type: dict
            default: {}
  sharing_configs:
    description:
      - Named device plugin configs (the k8s-device-plugin C(version v1) file format, as a dict per name), the same
        data the device plugin role deploys. Used to work out what each node should advertise.
    type: dict
    default: {}
  sharing_mps_root:
    description:
      - The C(MPS_ROOT) the device plugin runs with (the device plugin role's C(nvidia_device_plugin_mps_root)); the
        configs are judged in that environment. V('') for a plugin without one.
    type: str
    default: /run/nvidia/mps
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
  dra:
    description: Where the DRA driver publishes the GPUs, and the label that puts a node in DRA mode.
    type: dict
    default: {}
    suboptions:
      driver:
        description: Driver name of the ResourceSlices (C(spec.driver)) and of the allocated devices.
        type: str
        default: gpu.nvidia.com
      mode_label:
        description: Node label whose value C(true) puts the node in DRA mode (set by the nvidia_dra_driver role).
        type: str
        default: nvidia.com/gpu.deploy.dra-driver
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
  - Needs list permission on nodes, pods and resourcequotas cluster-wide, and on resourceslices and resourceclaims
    (C(resource.k8s.io)) where DRA is in use.
  - With a MIG strategy other than C(none) the advertised names depend on each node's MIG layout, so allocatable is
    compared when O(expected_nodes[].mig) gives the layout, else reported but not compared.
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
      - name: gpu-h100-9
        gpus: 2
        allocation_mode: dra
        mig:
          - {index: 0, enabled: true, devices: {1g.10gb: 7}}
          - {index: 1, enabled: false}
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
      C(request_nodes), C(request_pods), C(request_quotas) (and C(request_resourceslices), C(request_resourceclaims)
      where DRA is in use) each LIST (the server's answer and the transfer);
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
            not_deployed; the device plugin dra_mode on a node in DRA mode), allocation_mode (device-plugin or dra),
            dra (null, or in DRA mode driver, found {devices by kind (gpu, mig-<profile>), total, gpus, slices},
            expected (devices by kind, or null without a MIG layout), expected_gpus, allocated) and problems.
          type: dict
        totals:
          description: Per resource name, allocatable and requested over all GPU nodes.
          type: dict
        pending_gpu_pods:
          description: Unscheduled Pending pods that ask for GPU resources, with the scheduler's reason and message.
          type: list
          elements: dict
        pending_claims:
          description:
            - ResourceClaims that Pending, unscheduled pods wait for (not allocated, or not yet made from their
              template), each with namespace, pod, claim, template, exists, requests (request, device_class, count)
              and the scheduler's reason and message from the pod's PodScheduled condition.
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
from ansible_collections.gpu_ops.cluster.plugins.module_utils.gpu_cluster_dra import wants_dra  # noqa: E402
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
            name=dict(type="str", required=True), gpus=dict(type="int"),
            allocation_mode=dict(type="str", choices=["device-plugin", "dra"]),
            mig=dict(type="list", elements="dict", options=dict(
                index=dict(type="int", required=True), enabled=dict(type="bool", required=True),
                devices=dict(type="dict", default={}))))),
        sharing_configs=dict(type="dict", default={}),
        sharing_mps_root=dict(type="str", default="/run/nvidia/mps"),
        default_sharing_config=dict(type="str", default="default"),
        gpu_node_selector=dict(type="str", default="nvidia.com/gpu.present=true"),
        device_plugin=_daemon_spec("device_plugin"),
        dcgm_exporter=_daemon_spec("dcgm_exporter"),
        dra=dict(type="dict", default={}, options=dict(
            driver=dict(type="str", default="gpu.nvidia.com"),
            mode_label=dict(type="str", default="nvidia.com/gpu.deploy.dra-driver"))),
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


def read_dra(api_client: Any, size: int, driver: str, timings: Dict[str, float]
             ) -> Tuple[List[Dict[str, Any]], List[Dict[str, Any]], Optional[str]]:
    """The driver's ResourceSlices and every ResourceClaim (resource.k8s.io/v1), or why they could not be read (an
    API server without DRA, no permission): the rest of the check goes on."""
    try:
        slices = list_all(api_client, "/apis/resource.k8s.io/v1/resourceslices", size, timings, "resourceslices",
                          [("fieldSelector", "spec.driver=%s" % driver)])
        claims = list_all(api_client, "/apis/resource.k8s.io/v1/resourceclaims", size, timings, "resourceclaims")
    except ApiException as exc:
        return [], [], "HTTP %s %s listing resource.k8s.io/v1 objects" % (exc.status, exc.reason)
    return slices, claims, None


def connect(module: AnsibleModule, timings: Dict[str, float]) -> Any:
    started = time.monotonic()
    api_client = k8s_api_client(module.params["kubeconfig"], module.params["context"])
    timings["client"] = time.monotonic() - started
    return api_client


def read_cluster(module: AnsibleModule, timings: Dict[str, float], api_client: Any = None
                 ) -> Dict[str, List[Dict[str, Any]]]:
    """Nodes, pods (not finished) and resource quotas, one LIST each."""
    if api_client is None:
        api_client = connect(module, timings)
    size = module.params["page_size"]
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
        api_client = connect(module, timings)
        objects = read_cluster(module, timings, api_client)
        dra = {"driver": params["dra"]["driver"], "mode_label": params["dra"]["mode_label"], "error": None}
        objects["slices"], objects["claims"] = [], []
        if wants_dra(objects["nodes"], objects["pods"], params["expected_nodes"], dra["mode_label"]):
            objects["slices"], objects["claims"], dra["error"] = read_dra(
                api_client, params["page_size"], dra["driver"], timings)
    except (ApiException, TransportError, OSError, ValueError, kube_config.ConfigException) as exc:
        result = {"healthy": False, "problems": ["cannot read the cluster: %s" % exc], "error": str(exc)}
        if params["fail_on_unmet"]:
            module.fail_json(msg="cannot read the cluster: %s" % exc, ansible_facts={"gpu_cluster": result})
        module.exit_json(changed=False, ansible_facts={"gpu_cluster": result})
    started = time.monotonic()
    facts = check_cluster(
        objects["nodes"], objects["pods"], objects["quotas"],
        expected_nodes=params["expected_nodes"], sharing_configs=params["sharing_configs"],
        sharing_mps_root=params["sharing_mps_root"],
        default_config=params["default_sharing_config"], gpu_node_selector=params["gpu_node_selector"],
        daemons={"device_plugin": params["device_plugin"], "dcgm_exporter": params["dcgm_exporter"]},
        slices=objects["slices"], claims=objects["claims"], dra=dra,
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
