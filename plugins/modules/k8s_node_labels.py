#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: k8s_node_labels
short_description: Set the labels a role owns on many Kubernetes nodes, with one LIST and a patch only where needed
description:
  - Reads every node's metadata with one paged LIST (metadata only, no status), works out which nodes lack a wanted
    label value, and sends a JSON merge patch of only the labels that differ, only to those nodes, several at a time.
    A converged cluster of a thousand nodes costs one or two requests, not one round trip per node.
  - Labels others set (GPU feature discovery, the user, another role) are left as they are. A label whose wanted value
    is null is removed when present.
  - In check mode nothing changes; each patch that would be sent goes to the API server as a server-side dry run
    (C(dryRun=All)), so admission and validation judge it as they would the real patch.
  - The result has one entry per changed node in the shape of M(kubernetes.core.k8s)'s multi-object result
    (C(result.results)), each with a before/after diff of the labels that change, so reports that read
    M(kubernetes.core.k8s) results read these too.
options:
  labels:
    description:
      - Node name to the labels to set on it (label key to a string value, or null to remove the label).
    type: dict
    required: true
  missing:
    description: What a wanted node that does not exist is. C(warn) reports it and goes on; C(fail) fails the task.
    type: str
    choices: [warn, fail]
    default: warn
  workers:
    description: Patches sent at the same time.
    type: int
    default: 8
  page_size:
    description: Nodes per page of the LIST.
    type: int
    default: 500
notes:
  - Needs C(list) on nodes, and C(patch) on nodes where a label differs.
seealso:
  - module: kubernetes.core.k8s
extends_documentation_fragment:
  - gpu_ops.cluster.k8s_auth
author: GPU platform team (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Label the GPU nodes
  gpu_ops.cluster.k8s_node_labels:
    kubeconfig: /etc/kubernetes/admin.conf
    labels:
      gpu-h100-0: {gpu-ops.dev/device-plugin: "true", nvidia.com/device-plugin.config: time-sliced}
      gpu-a100-0: {gpu-ops.dev/device-plugin: "true", nvidia.com/device-plugin.config: null}
"""

RETURN = r"""
changed_nodes:
  description: Nodes whose labels were (in check mode, would be) patched.
  returned: always
  type: list
  elements: str
missing_nodes:
  description: Wanted nodes that the cluster does not have.
  returned: always
  type: list
  elements: str
requests:
  description: API requests the task made, by kind (C(list) pages and C(patch) requests, dry runs included).
  returned: always
  type: dict
  sample: {list: 2, patch: 0}
result:
  description: C(results), one per changed node, each with C(changed), C(result) (the node's name, the owned labels as
    they are after the patch, and its C(gpu-ops.dev/) annotations) and C(diff) (the owned labels before and after).
  returned: always
  type: dict
diff:
  description: Before and after of the owned labels, one entry per changed node.
  returned: when diff mode is on and a node changes
  type: list
  elements: dict
"""

import copy
import json
import threading
import traceback
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ansible.module_utils.basic import AnsibleModule, missing_required_lib
from ansible_collections.gpu_ops.cluster.plugins.module_utils.k8s_raw import AUTH_ARGSPEC, api_client, call_json, pages

KUBERNETES_IMPORT_ERROR = None
try:
    from kubernetes import config as kube_config
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError as TransportError
except ImportError:
    KUBERNETES_IMPORT_ERROR = traceback.format_exc()

# Only the nodes' metadata: a thousand nodes' status (images, conditions, addresses) is most of a full LIST's bytes.
METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
ANNOTATION_PREFIX = "gpu-ops.dev/"


def build_argspec() -> Dict[str, Any]:
    spec = copy.deepcopy(AUTH_ARGSPEC)
    spec.update(
        labels=dict(type="dict", required=True),
        missing=dict(type="str", choices=["warn", "fail"], default="warn"),
        workers=dict(type="int", default=8),
        page_size=dict(type="int", default=500),
    )
    return spec


def label_problems(wanted: Mapping[str, Any]) -> List[str]:
    """What is wrong with the wanted labels' shape, each naming its path (labels.<node>.<key>)."""
    problems = []
    for node, labels in wanted.items():
        if not isinstance(labels, Mapping):
            problems.append("labels.%s=%s; allowed: a mapping of label key to a string or null"
                            % (node, json.dumps(labels, default=str)))
            continue
        for key, value in labels.items():
            if value is not None and not isinstance(value, str):
                problems.append("labels.%s.%s=%s; allowed: a string (quote numbers and booleans) or null"
                                % (node, key, json.dumps(value, default=str)))
    return problems


def label_patches(wanted: Mapping[str, Mapping[str, Optional[str]]],
                  current: Mapping[str, Mapping[str, str]]) -> Tuple[Dict[str, Dict[str, Optional[str]]], List[str]]:
    """Per node, the labels to send (only those that differ; null removes) and the wanted nodes that do not exist."""
    patches: Dict[str, Dict[str, Optional[str]]] = {}
    missing: List[str] = []
    for node in sorted(wanted):
        if node not in current:
            missing.append(node)
            continue
        have = current[node]
        patch = {key: value for key, value in wanted[node].items()
                 if (value is None and key in have) or (value is not None and have.get(key) != value)}
        if patch:
            patches[node] = patch
    return patches, missing


def node_entry(node: str, patch: Mapping[str, Optional[str]], labels: Mapping[str, str],
               annotations: Mapping[str, str], owned: Mapping[str, Optional[str]]) -> Dict[str, Any]:
    """One changed node as kubernetes.core.k8s reports an object: the result and a diff of the owned labels."""
    before = {key: labels[key] for key in owned if key in labels}
    after = {key: value for key, value in {**before, **patch}.items() if value is not None}
    return {
        "changed": True,
        "method": "patch",
        "result": {"apiVersion": "v1", "kind": "Node", "metadata": {
            "name": node, "labels": after,
            "annotations": {k: v for k, v in annotations.items() if k.startswith(ANNOTATION_PREFIX)}}},
        "diff": {"before": {"metadata": {"labels": before}}, "after": {"metadata": {"labels": after}}},
    }


class Nodes:
    """The node calls, made with the client's own transport (auth, TLS, proxies from the kubeconfig)."""

    def __init__(self, kubeconfig: Optional[str], context: Optional[str], workers: int) -> None:
        self.api = api_client(kubeconfig, context, workers)
        self.requests = {"list": 0, "patch": 0}
        self._count = threading.Lock()

    def metadata(self, page_size: int) -> Dict[str, Tuple[Dict[str, str], Dict[str, str]]]:
        """Every node's (labels, annotations), page by page."""
        out: Dict[str, Tuple[Dict[str, str], Dict[str, str]]] = {}
        for page in pages(self.api, "/api/v1/nodes", page_size, headers={"Accept": METADATA_LIST}):
            self.requests["list"] += 1
            for item in page.get("items") or []:
                meta = item.get("metadata") or {}
                out[meta.get("name", "")] = (meta.get("labels") or {}, meta.get("annotations") or {})
        return out

    def patch(self, node: str, labels: Mapping[str, Optional[str]], dry_run: bool) -> Optional[str]:
        """None, or why the API server refused this node's patch."""
        with self._count:
            self.requests["patch"] += 1
        try:
            call_json(self.api, "/api/v1/nodes/%s" % node, "PATCH", [("dryRun", "All")] if dry_run else [],
                      {"Content-Type": "application/merge-patch+json", "Accept": "application/json"},
                      body={"metadata": {"labels": dict(labels)}})
        except ApiException as exc:
            return "%s: %s %s: %s" % (node, exc.status, exc.reason, exc.body)
        return None


def main() -> None:
    module = AnsibleModule(argument_spec=build_argspec(), supports_check_mode=True)
    if KUBERNETES_IMPORT_ERROR is not None:
        module.fail_json(msg=missing_required_lib("kubernetes"), exception=KUBERNETES_IMPORT_ERROR)
    params = module.params
    problems = label_problems(params["labels"])
    for option in ("workers", "page_size"):
        if params[option] < 1:
            problems.append("%s=%r; allowed: a positive integer" % (option, params[option]))
    if problems:
        module.fail_json(msg="; ".join(problems))
    wanted = params["labels"]
    try:
        nodes = Nodes(params["kubeconfig"], params["context"], params["workers"])
        current = nodes.metadata(params["page_size"])
        patches, missing = label_patches(wanted, {name: labels for name, (labels, _) in current.items()})
        if missing and params["missing"] == "fail":
            module.fail_json(msg="nodes not in the cluster: %s" % ", ".join(missing), missing_nodes=missing)
        with ThreadPoolExecutor(max_workers=params["workers"]) as pool:
            refused = [why for why in pool.map(lambda node: nodes.patch(node, patches[node], module.check_mode),
                                               sorted(patches)) if why]
        if refused:
            module.fail_json(msg="the API server refused the labels of %d of %d nodes: %s"
                             % (len(refused), len(patches), "; ".join(refused)), requests=nodes.requests)
    except ApiException as exc:
        module.fail_json(msg="the API server refused a node request: %s %s: %s" % (exc.status, exc.reason, exc.body))
    except (TransportError, OSError, ValueError, kube_config.ConfigException) as exc:
        module.fail_json(msg="cannot reach the cluster: %s" % exc)
    for node in missing:
        module.warn("node %s is not in the cluster; its labels were not set" % node)
    entries = [node_entry(node, patches[node], *current[node], owned=wanted[node]) for node in sorted(patches)]
    result: Dict[str, Any] = {
        "changed": bool(entries), "changed_nodes": sorted(patches), "missing_nodes": missing,
        "requests": nodes.requests, "result": {"results": entries},
    }
    if module._diff and entries:
        result["diff"] = [dict(entry["diff"], before_header="Node/%s" % node, after_header="Node/%s" % node)
                          for node, entry in zip(sorted(patches), entries)]
    module.exit_json(**result)


if __name__ == "__main__":
    main()
