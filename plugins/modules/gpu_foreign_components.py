#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_foreign_components
short_description: Find the GPU Operator and any device plugin, GFD or DCGM exporter this project did not deploy
description:
  - Read-only. It never changes the cluster and always reports C(changed=false); it runs the same in check mode.
  - Looks for NVIDIA's GPU Operator (its CRDs C(clusterpolicies.nvidia.com) and C(nvidiadrivers.nvidia.com), its
    ClusterPolicy objects) and, in every namespace, for DaemonSets that run one of O(components) and do not carry
    the project's management labels (O(own_labels)). A DaemonSet's component is read from its labels (the GPU
    Operator's C(app), the upstream charts' C(app.kubernetes.io/name)) and its containers' images and commands.
  - A ClusterPolicy counts unless it switches every one of O(components) off (C(spec.devicePlugin.enabled),
    C(spec.gfd.enabled), C(spec.dcgmExporter.enabled)); the CRDs count only when no ClusterPolicy exists.
  - RV(message) names everything found and the two settings that let the user choose (O(skip_setting),
    O(take_over_setting)); the calling role's preflight decides whether to refuse.
  - Requests, over one connection, two CRD reads, one LIST of ClusterPolicies when that CRD exists and one LIST of
    all DaemonSets (paged).
options:
  components:
    description: The components the calling role deploys.
    type: list
    elements: str
    choices: [device-plugin, gpu-feature-discovery, dcgm-exporter]
    required: true
  own_labels:
    description: The labels that mark the project's own objects (every one must match).
    type: dict
    default:
      app.kubernetes.io/managed-by: gpu-cluster
  skip_setting:
    description: The setting that leaves the component to its other owner, for RV(message).
    type: str
    default: ""
  take_over_setting:
    description: The setting that deploys the project's component anyway, for RV(message).
    type: str
    default: ""
  page_size:
    description: Objects per page of the DaemonSet list.
    type: int
    default: 500
extends_documentation_fragment:
  - gpu_ops.cluster.k8s_auth
author:
  - GPU platform team (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Look for another device plugin or the GPU Operator before deploying ours
  gpu_ops.cluster.gpu_foreign_components:
    kubeconfig: /etc/kubernetes/admin.conf
    components: [device-plugin, gpu-feature-discovery]
    skip_setting: nvidia_device_plugin_enabled
    take_over_setting: nvidia_device_plugin_take_over
  register: foreign

- name: Refuse unless the user chose to deploy anyway
  ansible.builtin.assert:
    that: foreign.found | length == 0
    fail_msg: "{{ foreign.message }}"
"""

RETURN = r"""
found:
  description: What another owner runs of O(components), one entry per object and component.
  returned: always
  type: list
  elements: dict
  contains:
    kind:
      description: C(DaemonSet), C(ClusterPolicy) or C(CustomResourceDefinition).
      type: str
    namespace:
      description: The namespace (empty for cluster-scoped objects).
      type: str
    name:
      description: The object's name.
      type: str
    component:
      description: The component it runs.
      type: str
    owner:
      description: C(GPU Operator) or C(unknown).
      type: str
    why:
      description: Why it counts, for a person.
      type: str
  sample:
    - {kind: DaemonSet, namespace: gpu-operator, name: nvidia-device-plugin-daemonset, component: device-plugin,
       owner: GPU Operator, why: "the GPU Operator's (label app=nvidia-device-plugin-daemonset)"}
objects:
  description: Each object of RV(found) once, as C(Kind namespace/name) (C(Kind name) when cluster-scoped).
  returned: always
  type: list
  elements: str
  sample: ["DaemonSet gpu-operator/nvidia-device-plugin-daemonset", "ClusterPolicy cluster-policy"]
operator:
  description: What of the GPU Operator the cluster has, whatever O(components).
  returned: always
  type: dict
  contains:
    crds:
      description: The operator's CRDs the cluster serves.
      type: list
      elements: str
    cluster_policies:
      description: The names of the ClusterPolicy objects.
      type: list
      elements: str
    daemonsets:
      description: The operator's DaemonSets as C(namespace/name).
      type: list
      elements: str
message:
  description: One sentence naming what was found and the settings that let the user choose; empty when nothing was.
  returned: always
  type: str
"""

import copy
import traceback
from typing import Any, Dict, List

from ansible.module_utils.basic import AnsibleModule, missing_required_lib
from ansible_collections.gpu_ops.cluster.plugins.module_utils import gpu_operator
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
        components=dict(type="list", elements="str", required=True, choices=list(gpu_operator.COMPONENTS)),
        own_labels=dict(type="dict", default=dict(gpu_operator.OWN_LABELS_DEFAULT)),
        skip_setting=dict(type="str", default=""),
        take_over_setting=dict(type="str", default=""),
        page_size=dict(type="int", default=500),
    )
    return spec


def read_crd(api: Any, name: str) -> Dict[str, Any]:
    """The CRD, or {} when the cluster has none of that name."""
    try:
        return call_json(api, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/%s" % name)
    except ApiException as exc:
        if exc.status == 404:
            return {}
        raise


def read_cluster(api: Any, page_size: int) -> Dict[str, Any]:
    crds = {name: read_crd(api, name) for name in gpu_operator.OPERATOR_CRDS}
    policies: List[Dict[str, Any]] = []
    policy_crd = crds.get(gpu_operator.CLUSTER_POLICY_CRD) or {}
    version = gpu_operator.served_version(policy_crd) if policy_crd else None
    if version:
        group = (policy_crd.get("spec") or {}).get("group", "nvidia.com")
        plural = ((policy_crd.get("spec") or {}).get("names") or {}).get("plural", "clusterpolicies")
        policies = [item for page in pages(api, "/apis/%s/%s/%s" % (group, version, plural), page_size)
                    for item in page.get("items") or []]
    daemonsets = [item for page in pages(api, "/apis/apps/v1/daemonsets", page_size)
                  for item in page.get("items") or []]
    return {"crds": sorted(name for name, crd in crds.items() if crd), "cluster_policies": policies,
            "daemonsets": daemonsets}


def main() -> None:
    module = AnsibleModule(argument_spec=build_argspec(), supports_check_mode=True)
    if KUBERNETES_IMPORT_ERROR is not None:
        module.fail_json(msg=missing_required_lib("kubernetes"), exception=KUBERNETES_IMPORT_ERROR)
    params = module.params
    own_labels = {str(key): str(value) for key, value in params["own_labels"].items()}
    try:
        cluster = read_cluster(api_client(params["kubeconfig"], params["context"]), params["page_size"])
    except ApiException as exc:
        module.fail_json(msg="the API server refused a request while looking for the GPU Operator and other GPU "
                             "components: %s %s: %s" % (exc.status, exc.reason, exc.body), changed=False)
    except (TransportError, OSError, ValueError, kube_config.ConfigException) as exc:
        module.fail_json(msg="cannot reach the cluster: %s" % exc, changed=False)
    found = gpu_operator.find(params["components"], cluster["crds"], cluster["cluster_policies"],
                              cluster["daemonsets"], own_labels)
    operator = {
        "crds": cluster["crds"],
        "cluster_policies": sorted((item.get("metadata") or {}).get("name", "") for item in cluster["cluster_policies"]),
        "daemonsets": sorted("%s/%s" % ((item.get("metadata") or {}).get("namespace", ""),
                                        (item.get("metadata") or {}).get("name", ""))
                             for item in cluster["daemonsets"] if gpu_operator.operator_app(item)),
    }
    module.exit_json(changed=False, found=found, objects=gpu_operator.objects(found), operator=operator,
                     message=gpu_operator.refusal(found, params["components"], params["skip_setting"] or "the skip switch",
                                                  params["take_over_setting"] or "the take-over switch"))


if __name__ == "__main__":
    main()
