#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_prometheus_health
short_description: GPU health problems per node from the DCGM exporter's series in Prometheus
description:
  - Asks a Prometheus server (its HTTP API, C(/api/v1/query)) for the DCGM exporter's health fields and returns, per
    node, the GPUs with a problem. C(DCGM_FI_DEV_XID_ERRORS) (the last Xid a GPU reported) other than the codes of
    O(xid_ignore), C(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL) (uncorrected ECC errors), C(DCGM_FI_DEV_RETIRED_PENDING) (pages
    pending retirement) and C(DCGM_FI_DEV_ROW_REMAP_FAILURE) above zero are problems.
  - The node is the series' O(node_label) label (for the exporter's host label, C(hostname) or C(Hostname), either
    form). A series without it is left out.
  - A Prometheus that cannot be asked is reported in RV(error), not as a failure, so the health check goes on with
    what the nodes themselves report.
  - Reads only; check mode does the same.
options:
  url:
    description: Base URL of the Prometheus server, for example C(http://prometheus.monitoring:9090).
    type: str
    required: true
  node_label:
    description:
      - Label of the series that names the node (C(node) where Prometheus relabels it from the exporter pod's node).
      - C(hostname) or C(Hostname), the exporter's own host label (renamed from C(Hostname) to C(hostname) in exporter
        4.6.0-4.8.3), reads either form, so exporters of both sides of the rename are all found.
    type: str
    default: node
  xid_ignore:
    description: Xid codes of the application's making, not the GPU's (the NVIDIA device plugin's list).
    type: list
    elements: int
    default: [13, 31, 43, 45, 68, 109]
  bearer_token:
    description: Bearer token for a Prometheus behind authentication.
    type: str
  validate_certs:
    description: Verify the server's TLS certificate.
    type: bool
    default: true
  timeout:
    description: Seconds each query may take.
    type: int
    default: 10
requirements: []
author: GPU platform team (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Read the DCGM exporter's health fields
  gpu_ops.cluster.gpu_prometheus_health:
    url: http://prometheus.monitoring:9090
  register: dcgm_health
"""

RETURN = r"""
problems:
  description: Node name to its GPUs' problems (nodes without a problem are not listed).
  returned: always
  type: dict
queries:
  description: The queries asked.
  returned: always
  type: list
  elements: str
error:
  description: Why Prometheus could not be asked (empty when it was).
  returned: always
  type: str
"""

import json
from typing import Any, Dict, List
from urllib.parse import urlencode

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import open_url
from ansible_collections.gpu_ops.cluster.plugins.module_utils.gpu_dcgm_health import QUERIES, merge, series_problems


def query(params: Dict[str, Any], expression: str) -> List[Dict[str, Any]]:
    headers = {"Accept": "application/json"}
    if params["bearer_token"]:
        headers["Authorization"] = "Bearer %s" % params["bearer_token"]
    url = "%s/api/v1/query?%s" % (params["url"].rstrip("/"), urlencode({"query": expression}))
    response = open_url(url, headers=headers, validate_certs=params["validate_certs"], timeout=params["timeout"])
    body = json.loads(response.read())
    if body.get("status") != "success" or (body.get("data") or {}).get("resultType") != "vector":
        raise ValueError("%s: %s" % (expression, body.get("error") or body))
    return body["data"]["result"]


def main() -> None:
    module = AnsibleModule(argument_spec=dict(
        url=dict(type="str", required=True),
        node_label=dict(type="str", default="node"),
        xid_ignore=dict(type="list", elements="int", default=[13, 31, 43, 45, 68, 109]),
        bearer_token=dict(type="str", no_log=True),
        validate_certs=dict(type="bool", default=True),
        timeout=dict(type="int", default=10),
    ), supports_check_mode=True)
    params = module.params
    if not params["url"].startswith(("http://", "https://")):
        module.fail_json(msg="url=%r; allowed: http://host:port or https://host:port" % params["url"])
    parts = []
    try:
        for field, what in QUERIES:
            parts.append(series_problems(field, what, query(params, field), params["node_label"],
                                         params["xid_ignore"]))
    except Exception as exc:  # any transport or answer problem: reported, the host verdicts still count
        module.exit_json(changed=False, problems={}, queries=[field for field, _ in QUERIES],
                         error="cannot ask %s: %s" % (params["url"], exc))
    module.exit_json(changed=False, problems=merge(*parts), queries=[field for field, _ in QUERIES], error="")


if __name__ == "__main__":
    main()
