#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: k8s_objects_info
short_description: Read several kinds of Kubernetes objects in one module run
description:
  - Reads each query (an object by name, or the objects of a kind that match label selectors, in one namespace or in
    all) and returns the answers in the order asked. One process and one connection for what would otherwise be one
    M(kubernetes.core.k8s_info) run per query (about 0.4 s of CPU each, most of it importing the client).
  - Each kind is resolved to its resource through the API server's discovery of its group and version, asked once
    per group and version. A kind the cluster does not serve (its CRD is not installed) is an answer, not an error,
    C(api_found=false) with no resources, as M(kubernetes.core.k8s_info) reports it.
  - Read-only; runs in check mode as in a real run.
options:
  queries:
    description: What to read, in order.
    type: list
    elements: dict
    required: true
    suboptions:
      api_version:
        description: The kind's group and version (C(v1), C(apps/v1), C(apiextensions.k8s.io/v1)).
        type: str
        required: true
      kind:
        description: The kind, as it appears in objects (C(Namespace), C(CustomResourceDefinition)).
        type: str
        required: true
      name:
        description: One object by name; without it, every object of the kind that matches the label selectors.
        type: str
      namespace:
        description: The namespace of a namespaced kind; without it, all namespaces. Ignored for cluster-scoped kinds.
        type: str
      label_selectors:
        description: Label selectors (C(key=value), C(key!=value), C(key)), all of which must match.
        type: list
        elements: str
        default: []
      field_selectors:
        description: Field selectors (C(status.phase=Pending), C(type=Warning)), all of which must match.
        type: list
        elements: str
        default: []
      ref:
        description: Anything; returned unchanged with the answer (in C(query)), so a caller pairs answers with what
          asked for them.
        type: raw
notes:
  - Needs C(get) (by name) or C(list) on each kind read.
seealso:
  - module: kubernetes.core.k8s_info
extends_documentation_fragment:
  - gpu_ops.cluster.k8s_auth
author: GPU platform team (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Look up a namespace and two CRDs in one go
  gpu_ops.cluster.k8s_objects_info:
    kubeconfig: /etc/kubernetes/admin.conf
    queries:
      - {api_version: v1, kind: Namespace, name: monitoring}
      - {api_version: apiextensions.k8s.io/v1, kind: CustomResourceDefinition, name: servicemonitors.monitoring.coreos.com}
      - {api_version: apps/v1, kind: Deployment, namespace: monitoring, label_selectors: [app.kubernetes.io/name=grafana]}
  register: found
"""

RETURN = r"""
results:
  description: One answer per query, in the order asked.
  returned: always
  type: list
  elements: dict
  contains:
    query:
      description: The query as given (defaults filled in).
      type: dict
    api_found:
      description: Whether the cluster serves the kind.
      type: bool
    resources:
      description: The objects found, as the API server returns them (none when the named object does not exist).
      type: list
      elements: dict
requests:
  description: API requests the task made (discovery included).
  returned: always
  type: int
"""

import copy
import traceback
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ansible.module_utils.basic import AnsibleModule, missing_required_lib
from ansible_collections.gpu_ops.cluster.plugins.module_utils.k8s_raw import AUTH_ARGSPEC, api_client, call_json

KUBERNETES_IMPORT_ERROR = None
try:
    from kubernetes import config as kube_config
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError as TransportError
except ImportError:
    KUBERNETES_IMPORT_ERROR = traceback.format_exc()


def build_argspec() -> Dict[str, Any]:
    spec = copy.deepcopy(AUTH_ARGSPEC)
    spec.update(queries=dict(type="list", elements="dict", required=True, options=dict(
        api_version=dict(type="str", required=True),
        kind=dict(type="str", required=True),
        name=dict(type="str"),
        namespace=dict(type="str"),
        label_selectors=dict(type="list", elements="str", default=[]),
        field_selectors=dict(type="list", elements="str", default=[]),
        ref=dict(type="raw"),
    )))
    return spec


def group_version_path(api_version: str) -> str:
    """The discovery path of a group and version: the core group under /api, every other under /apis."""
    return "/api/%s" % api_version if "/" not in api_version else "/apis/%s" % api_version


def find_resource(discovery: Mapping[str, Any], kind: str) -> Optional[Tuple[str, bool]]:
    """(plural, namespaced) of the kind in an APIResourceList, or None; subresources (``pods/log``) never match."""
    for resource in discovery.get("resources") or []:
        if resource.get("kind") == kind and "/" not in resource.get("name", ""):
            return resource["name"], bool(resource.get("namespaced"))
    return None


def object_path(api_version: str, plural: str, namespaced: bool, query: Mapping[str, Any]) -> str:
    """The REST path of the query: one object by name, or the collection, in its namespace or across all."""
    path = group_version_path(api_version)
    if namespaced and query.get("namespace"):
        path += "/namespaces/%s" % query["namespace"]
    path += "/%s" % plural
    if query.get("name"):
        path += "/%s" % query["name"]
    return path


class Reader:
    """The reads, with the client's own transport (auth, TLS, proxies from the kubeconfig); discovery asked once per
    group and version."""

    def __init__(self, kubeconfig: Optional[str], context: Optional[str]) -> None:
        self.api = api_client(kubeconfig, context)
        self.requests = 0
        self._discovery: Dict[str, Optional[Mapping[str, Any]]] = {}

    def _get(self, path: str, query: List[Tuple[str, Any]]) -> Optional[Dict[str, Any]]:
        """The decoded answer, or None when the server says 404."""
        self.requests += 1
        try:
            return call_json(self.api, path, "GET", query)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def resource(self, api_version: str, kind: str) -> Optional[Tuple[str, bool]]:
        if api_version not in self._discovery:
            self._discovery[api_version] = self._get(group_version_path(api_version), [])
        discovery = self._discovery[api_version]
        return find_resource(discovery, kind) if discovery is not None else None

    def answer(self, query: Mapping[str, Any]) -> Dict[str, Any]:
        found = self.resource(query["api_version"], query["kind"])
        if found is None:
            return {"query": dict(query), "api_found": False, "resources": []}
        plural, namespaced = found
        params = [(param, ",".join(query[option])) for option, param in
                  (("label_selectors", "labelSelector"), ("field_selectors", "fieldSelector")) if query.get(option)]
        body = self._get(object_path(query["api_version"], plural, namespaced, query), params)
        if body is None:
            resources: List[Dict[str, Any]] = []
        elif query.get("name"):
            resources = [body]
        else:
            kind = query["kind"]
            # A LIST's items carry no apiVersion and kind; k8s_info's answers do.
            resources = [dict(item, apiVersion=query["api_version"], kind=kind) for item in body.get("items") or []]
        return {"query": dict(query), "api_found": True, "resources": resources}


def main() -> None:
    module = AnsibleModule(argument_spec=build_argspec(), supports_check_mode=True)
    if KUBERNETES_IMPORT_ERROR is not None:
        module.fail_json(msg=missing_required_lib("kubernetes"), exception=KUBERNETES_IMPORT_ERROR)
    params = module.params
    try:
        reader = Reader(params["kubeconfig"], params["context"])
        results = [reader.answer(query) for query in params["queries"]]
    except ApiException as exc:
        module.fail_json(msg="the API server refused a read: %s %s: %s" % (exc.status, exc.reason, exc.body))
    except (TransportError, OSError, ValueError, kube_config.ConfigException) as exc:
        module.fail_json(msg="cannot reach the cluster: %s" % exc)
    module.exit_json(changed=False, results=results, requests=reader.requests)


if __name__ == "__main__":
    main()
