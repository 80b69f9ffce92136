#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_k8s_access
short_description: Refuse a kubeconfig that cannot do a cluster role's job, with the reason, before anything changes
description:
  - Read-only. It never changes the cluster and always reports C(changed=false); it runs the same in check mode.
  - Loads the kubeconfig and, when its user authenticates with a client certificate, reads the certificate's validity
    (with the C(cryptography) library); an expired certificate is refused before any request, naming the date.
  - Makes one request, C(GET /version). A server certificate the kubeconfig's CA did not sign, refused credentials
    (401), a server that does not answer, each fails the task with one sentence naming the kubeconfig, the cluster,
    the user and the server URL.
  - Asks who the API server takes the user for (a C(SelfSubjectReview); the kubeconfig's user name on servers older
    than 1.28), then sends one C(SelfSubjectAccessReview) per verb of every need, over one connection, and fails
    listing every permission the user lacks as C(verb group/resource in namespace), with who needs it.
  - Needs marked O(needs[].when_served) are checked only when the server serves their API group (a ServiceMonitor
    is only applied when the Prometheus Operator's CRD is there); one discovery request (C(GET /apis)) for them all.
options:
  needs:
    description:
      - What the run will do through the API server. Each verb of each entry is one access review; duplicates are
        checked once.
    type: list
    elements: dict
    default: []
    suboptions:
      verbs:
        description: The verbs, as RBAC names them (C(get), C(list), C(create), C(patch), C(update), C(delete), ...).
        type: list
        elements: str
        required: true
      group:
        description: API group; empty for the core group (namespaces, configmaps, ...).
        type: str
        default: ""
      resource:
        description: Plural resource name, such as C(daemonsets).
        type: str
        required: true
      subresource:
        description: Subresource, such as C(status).
        type: str
      namespace:
        description: Namespace. Omitted for a cluster-scoped resource, or for the namespaced one in every namespace.
        type: str
      name:
        description: Object name, when the permission may be limited to one object.
        type: str
      by:
        description: Who needs it (a role name), for the message.
        type: str
      when_served:
        description: Check it only when the server serves the API group (an optional API such as a CRD's).
        type: bool
        default: false
  timeout:
    description: Seconds to wait for each answer of the API server.
    type: int
    default: 10
notes:
  - Supports check mode; the module makes no changes in either mode.
  - Any authenticated user may create SelfSubjectReviews and SelfSubjectAccessReviews (the bootstrap ClusterRole
    C(system:basic-user)), so the check needs no permission of its own.
  - An access review answers for RBAC as the server's authorizers see it, not for admission (quotas, Pod Security),
    nor for the C(escalate) and C(bind) rules of writing RBAC objects; the API server still judges those.
requirements:
  - The C(cryptography) library to read a client certificate's dates (without it, an expired certificate is reported
    from the server's 401).
extends_documentation_fragment:
  - gpu_ops.cluster.k8s_auth
author:
  - GPU platform team (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Check that the kubeconfig can apply the device plugin
  gpu_ops.cluster.gpu_k8s_access:
    kubeconfig: /var/lib/gpu-lab/pki/admin.kubeconfig
    needs:
      - {resource: namespaces, verbs: [get, create, patch]}
      - {resource: nodes, verbs: [get, patch]}
      - {group: apps, resource: daemonsets, namespace: nvidia-device-plugin, verbs: [get, create, patch]}
      - {group: monitoring.coreos.com, resource: servicemonitors, namespace: gpu-monitoring, verbs: [get, create, patch],
         when_served: true}
"""

RETURN = r"""
user:
  description: The user name as the API server sees it (from the kubeconfig when the server could not say).
  returned: always
  type: str
  sample: gpu-lab-admin
groups:
  description: The user's groups as the API server sees them (empty when the server could not say).
  returned: always
  type: list
  elements: str
cluster:
  description: The kubeconfig's cluster name of the context used.
  returned: always
  type: str
server:
  description: The API server URL.
  returned: always
  type: str
  sample: https://127.0.0.1:16443
server_version:
  description: The server's git version, from GET /version (empty when it was not reached).
  returned: always
  type: str
checked:
  description: Access reviews sent.
  returned: always
  type: int
skipped_groups:
  description: API groups of O(needs[].when_served) needs that the server does not serve (not checked).
  returned: always
  type: list
  elements: str
denied:
  description: Each missing permission, as C(verb group/resource in namespace).
  returned: always
  type: list
  elements: str
  sample: ["create apps/daemonsets in namespace nvidia-device-plugin"]
"""

import copy
import datetime
import traceback
from typing import Any, Dict, List, Optional, Tuple

from ansible.module_utils.basic import AnsibleModule, missing_required_lib
from ansible_collections.gpu_ops.cluster.plugins.module_utils.k8s_access import (
    certificate_problem,
    denied_message,
    describe_check,
    expand_needs,
    need_problems,
    resource_attributes,
    status_reason,
    transport_reason,
)
from ansible_collections.gpu_ops.cluster.plugins.module_utils.k8s_raw import AUTH_ARGSPEC, call_json

KUBERNETES_IMPORT_ERROR = None
try:
    from kubernetes import client as kube_client
    from kubernetes import config as kube_config
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError as TransportError
except ImportError:
    KUBERNETES_IMPORT_ERROR = traceback.format_exc()

CRYPTOGRAPHY_IMPORT_ERROR = None
try:
    from cryptography import x509
except ImportError:
    CRYPTOGRAPHY_IMPORT_ERROR = traceback.format_exc()


def build_argspec() -> Dict[str, Any]:
    spec = copy.deepcopy(AUTH_ARGSPEC)
    spec.update(
        needs=dict(type="list", elements="dict", default=[], options=dict(
            verbs=dict(type="list", elements="str", required=True),
            group=dict(type="str", default=""),
            resource=dict(type="str", required=True),
            subresource=dict(type="str"),
            namespace=dict(type="str"),
            name=dict(type="str"),
            by=dict(type="str"),
            when_served=dict(type="bool", default=False),
        )),
        timeout=dict(type="int", default=10),
    )
    return spec


class Refused(Exception):
    """The kubeconfig cannot do the job; the message says why."""


def load(kubeconfig: Optional[str], context: Optional[str]) -> Tuple[Any, Dict[str, str]]:
    """The client configuration and the names a message needs (kubeconfig path, context, cluster, user, server)."""
    path = kubeconfig or kube_config.kube_config.KUBE_CONFIG_DEFAULT_LOCATION
    try:
        contexts, active = kube_config.list_kube_config_contexts(config_file=path)
        chosen = next((item for item in contexts if item["name"] == context), None) if context else active
        if chosen is None:
            raise Refused(f"{path} has no context {context} (it has {', '.join(item['name'] for item in contexts)})")
        configuration = kube_client.Configuration()
        kube_config.load_kube_config(config_file=path, context=context, client_configuration=configuration,
                                     persist_config=False)
    except kube_config.ConfigException as exc:
        raise Refused(f"cannot use the kubeconfig {path}: {exc}") from exc
    except OSError as exc:
        raise Refused(f"cannot read the kubeconfig {path}: {exc}") from exc
    names = {"kubeconfig": path, "context": chosen["name"], "cluster": chosen["context"].get("cluster", ""),
             "user": chosen["context"].get("user", ""), "server": configuration.host}
    return configuration, names


def check_client_certificate(configuration: Any, names: Dict[str, str]) -> None:
    if not configuration.cert_file or CRYPTOGRAPHY_IMPORT_ERROR:
        return
    try:
        with open(configuration.cert_file, "rb") as handle:
            certificate = x509.load_pem_x509_certificate(handle.read())
    except (OSError, ValueError) as exc:
        raise Refused(f"the client certificate of user {names['user']} in {names['kubeconfig']} cannot be read: "
                      f"{exc}") from exc
    problem = certificate_problem(names["user"], names["kubeconfig"], certificate.not_valid_before_utc,
                                  certificate.not_valid_after_utc, datetime.datetime.now(datetime.timezone.utc))
    if problem:
        raise Refused(problem)


def first_request(api_client: Any, names: Dict[str, str], timeout: int) -> str:
    """GET /version: reaches the server, verifies its certificate, authenticates the user."""
    try:
        return call_json(api_client, "/version", timeout=timeout).get("gitVersion", "")
    except ApiException as exc:
        raise Refused(status_reason(exc.status, names["user"], names["kubeconfig"], names["cluster"], names["server"],
                                    exc.body or "")) from exc
    except TransportError as exc:
        cause = getattr(exc, "reason", None) or exc
        raise Refused(transport_reason(f"{type(cause).__name__}: {cause}", names["kubeconfig"], names["cluster"],
                                       names["server"])) from exc


def whoami(api_client: Any, names: Dict[str, str], timeout: int) -> Tuple[str, List[str]]:
    """The user and groups the API server authenticated; the kubeconfig's user name where SelfSubjectReview is missing."""
    try:
        review = call_json(api_client, "/apis/authentication.k8s.io/v1/selfsubjectreviews", "POST",
                           body={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
                           timeout=timeout)
    except ApiException as exc:
        if exc.status in (403, 404):
            return names["user"], []
        raise
    info = (review.get("status") or {}).get("userInfo") or {}
    return info.get("username") or names["user"], list(info.get("groups") or [])


def served_groups(api_client: Any, timeout: int) -> List[str]:
    """The API groups the server serves (one request: GET /apis)."""
    groups = call_json(api_client, "/apis", timeout=timeout).get("groups") or []
    return [group.get("name", "") for group in groups]


def review(api_client: Any, checks: List[Tuple[str, ...]], timeout: int) -> Tuple[List[Any], Dict[Any, str]]:
    """One SelfSubjectAccessReview per check; the denied checks and the authorizer's reasons."""
    denied, reasons = [], {}
    for check in checks:
        answer = call_json(api_client, "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", "POST",
                           body={"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                                 "spec": {"resourceAttributes": resource_attributes(check)}}, timeout=timeout)
        status = answer.get("status") or {}
        if not status.get("allowed"):
            denied.append(check)
            reason = status.get("reason") or status.get("evaluationError") or ""
            if reason:
                reasons[check] = reason
    return denied, reasons


def main() -> None:
    module = AnsibleModule(argument_spec=build_argspec(), supports_check_mode=True)
    if KUBERNETES_IMPORT_ERROR:
        module.fail_json(msg=missing_required_lib("kubernetes"), exception=KUBERNETES_IMPORT_ERROR)
    needs = module.params["needs"]
    problems = need_problems(needs)
    if problems:
        module.fail_json(msg="; ".join(problems))

    result: Dict[str, Any] = {"changed": False, "user": "", "groups": [], "cluster": "", "server": "",
                              "server_version": "", "checked": 0, "skipped_groups": [], "denied": []}
    try:
        configuration, names = load(module.params["kubeconfig"], module.params["context"])
        result.update(cluster=names["cluster"], server=names["server"], user=names["user"])
        check_client_certificate(configuration, names)
        timeout = module.params["timeout"]
        with kube_client.ApiClient(configuration) as api_client:
            result["server_version"] = first_request(api_client, names, timeout)
            result["user"], result["groups"] = whoami(api_client, names, timeout)
            optional = sorted({need["group"] for need in needs if need["when_served"]})
            served = served_groups(api_client, timeout) if optional else []
            result["skipped_groups"] = [group for group in optional if group not in served]
            wanted = [need for need in needs if not need["when_served"] or need["group"] in served]
            checks, needed_by = expand_needs(wanted)
            denied, reasons = review(api_client, checks, timeout)
    except Refused as exc:
        module.fail_json(msg=str(exc), **result)
    except (ApiException, TransportError) as exc:
        module.fail_json(msg=f"the access check failed: {exc}", **result)
    result["checked"] = len(checks)
    result["denied"] = [describe_check(check) for check in denied]
    if denied:
        module.fail_json(msg=denied_message(result["user"], result["groups"], names["kubeconfig"], denied, needed_by,
                                            reasons), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
