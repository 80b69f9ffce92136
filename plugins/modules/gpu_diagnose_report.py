#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)
"""Turn what the diagnose playbook collected into one redacted archive, a JSON report and a summary."""

from __future__ import absolute_import, annotations, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: gpu_diagnose_report
short_description: Write the diagnose archive and report, naming known GPU failure signatures
description:
  - Takes what C(gpu_diagnose_node) and the cluster reads collected, redacts secrets (passwords, tokens, keys,
    credentials in configs, logs and pods' env), matches the known failure signatures (a missing C(nvidia) runtime,
    a driver/library version mismatch, C(Insufficient nvidia.com/gpu), unresolvable CDI devices, NVML not loaded,
    Pod Security refusals, an exhausted quota) to their causes and fixes, and writes into O(report_dir) one
    C(diagnose-<UTC time>.tar.gz) holding every collected file, C(diagnose.json) and C(diagnose.txt) (also written
    beside the archive, the latest run's).
  - Runs on the controller. The report is the playbook's output, written in check mode too; the module reports no
    change because nothing of the managed hosts or cluster changed.
options:
  nodes:
    description: Per GPU node, C(files) (file name to text, from C(gpu_diagnose_node)) and C(facts) (C(nvidia_gpu_facts)).
    type: dict
    default: {}
  inventory_nodes:
    description: Every GPU node of the inventory; one without an entry in O(nodes) is reported as not collected.
    type: list
    elements: str
    default: []
  cluster:
    description:
      - The raw LISTs read from the API server; keys C(nodes), C(device_plugin_pods), C(dcgm_exporter_pods),
        C(pending_pods), C(events), C(resource_quotas), C(runtime_classes); C(error) when the cluster could not be read.
    type: dict
    default: {}
  logs:
    description: Pod logs read through the API server, C(namespace/pod/container) to text (or why it could not be read).
    type: dict
    default: {}
  gpu_node_selector:
    description: Label selector that also marks GPU nodes (besides the inventory's and those advertising GPUs).
    type: str
    default: nvidia.com/gpu.present=true
  report_dir:
    description: Absolute directory on the controller the archive and report are written to (created when missing).
    type: path
    required: true
notes:
  - Supports check mode (it writes the report in both modes; see above).
author:
  - GPU platform team (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Write the diagnose archive
  gpu_ops.cluster.gpu_diagnose_report:
    nodes: "{{ collected_nodes }}"
    cluster: "{{ collected_cluster }}"
    report_dir: /srv/reports
  delegate_to: localhost
"""

RETURN = r"""
findings:
  description: Each known failure signature found, with C(id), C(title), C(cause), C(fix), C(names), C(count),
    C(sources) and C(evidence) (up to five C(source)/C(line) pairs).
  returned: always
  type: list
  elements: dict
observations:
  description:
    - Other things found wrong that are no known signature (the facts module's problems, nodes not collected).
    - A node whose running driver is on a branch past its end of life on the report's day, with the validation
      report's line (module_utils/support_matrix.py), a warning, never a finding.
  returned: always
  type: list
  elements: str
summary:
  description: The summary a person reads.
  returned: always
  type: str
archive:
  description: Path of the archive.
  returned: always
  type: str
report:
  description: Path of the JSON report.
  returned: always
  type: str
"""

import io
import json
import os
import tarfile
import time
from typing import Any, Dict, Mapping

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpu_ops.cluster.plugins.module_utils.gpu_diagnose import (
    cluster_sources,
    cluster_view,
    match_signatures,
    node_observations,
    redact_data,
    redact_text,
    summary_text,
)
from ansible_collections.gpu_ops.cluster.plugins.module_utils.support_matrix import parse_day


def build_argspec() -> Dict[str, Any]:
    return dict(
        nodes=dict(type="dict", default={}),
        inventory_nodes=dict(type="list", elements="str", default=[]),
        cluster=dict(type="dict", default={}),
        logs=dict(type="dict", default={}),
        gpu_node_selector=dict(type="str", default="nvidia.com/gpu.present=true"),
        report_dir=dict(type="path", required=True),
    )


def build(params: Mapping[str, Any], stamp: str) -> Dict[str, Any]:
    """The report and the archive's files (name to text), every text redacted before it is matched or written."""
    nodes = params.get("nodes") or {}
    inventory = list(params.get("inventory_nodes") or [])
    files: Dict[str, str] = {}
    sources = []
    observations = []
    today = parse_day(stamp)  # the report's own time judges the driver branches (one clock for the whole report)
    for name in sorted(set(inventory) | set(nodes)):
        entry = nodes.get(name) or {}
        facts = redact_data(entry.get("facts") or {})
        if entry:
            files["nodes/%s/nvidia_gpu_facts.json" % name] = json.dumps(facts, indent=2, sort_keys=True) + "\n"
            if facts.get("error"):
                sources.append({"source": "node %s: nvidia_gpu_facts" % name, "text": str(facts["error"])})
        for file_name, text in sorted((entry.get("files") or {}).items()):
            clean = redact_text(str(text))
            files["nodes/%s/%s" % (name, file_name)] = clean
            sources.append({"source": "node %s: %s" % (name, file_name), "text": clean})
        observations += node_observations(name, facts, today)
    raw_cluster = redact_data(params.get("cluster") or {})
    logs = {name: redact_text(str(text)) for name, text in (params.get("logs") or {}).items()}
    view = cluster_view(raw_cluster, params.get("gpu_node_selector") or "", inventory)
    if raw_cluster.get("error"):
        observations.append("cluster: not read: %s" % raw_cluster["error"])
    for key in ("nodes", "device_plugin_pods", "dcgm_exporter_pods", "pending_pods", "events", "resource_quotas",
                "runtime_classes"):
        files["cluster/%s.json" % key] = json.dumps(raw_cluster.get(key) or [], indent=2, sort_keys=True) + "\n"
    files["cluster/gpu-view.json"] = json.dumps(view, indent=2, sort_keys=True) + "\n"
    for name, text in sorted(logs.items()):
        files["cluster/logs/%s.log" % name.replace("/", "_")] = text
    sources += cluster_sources(view, logs)
    for quota in view["gpu_quotas"]:
        if quota["exhausted"]:
            observations.append("quota %s: %s fully used" % (quota["quota"], ", ".join(
                "%s %s of %s" % (key, quota["used"].get(key), quota["hard"][key]) for key in quota["exhausted"])))
    report = {"time": stamp, "nodes_collected": sorted(nodes), "findings": match_signatures(sources),
              "observations": observations, "cluster": view}
    return {"report": report, "files": files}


def write_archive(path: str, files: Mapping[str, str], top: str) -> None:
    """A tar.gz of the files under one top directory, written to a scratch name and renamed (never half a file)."""
    scratch = path + ".part"
    with tarfile.open(scratch, "w:gz") as archive:
        for name, text in sorted(files.items()):
            data = text.encode("utf-8")
            info = tarfile.TarInfo("%s/%s" % (top, name))
            info.size = len(data)
            info.mtime = int(time.time())
            info.mode = 0o644
            archive.addfile(info, io.BytesIO(data))
    os.replace(scratch, path)


def write_report(params: Mapping[str, Any], now: float) -> Dict[str, Any]:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    built = build(params, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)))
    report_dir = params["report_dir"]
    os.makedirs(report_dir, mode=0o755, exist_ok=True)
    top = "diagnose-%s" % stamp
    archive = os.path.join(report_dir, top + ".tar.gz")
    report = dict(built["report"], archive=archive)
    summary = summary_text(report)
    files = dict(built["files"])
    files["diagnose.json"] = json.dumps(report, indent=2, sort_keys=True) + "\n"
    files["diagnose.txt"] = summary
    write_archive(archive, files, top)
    report_path = os.path.join(report_dir, "diagnose.json")
    for name in ("diagnose.json", "diagnose.txt"):
        target = os.path.join(report_dir, name)
        with open(target + ".part", "w", encoding="utf-8") as handle:
            handle.write(files[name])
        os.replace(target + ".part", target)
    return {"findings": report["findings"], "observations": report["observations"], "summary": summary,
            "archive": archive, "report": report_path}


def main() -> None:
    module = AnsibleModule(argument_spec=build_argspec(), supports_check_mode=True)
    if not os.path.isabs(module.params["report_dir"]):
        module.fail_json(msg="report_dir=%r is not an absolute path; allowed: an absolute directory on the controller"
                         % module.params["report_dir"])
    try:
        result = write_report(module.params, time.time())
    except OSError as error:
        module.fail_json(msg="cannot write the diagnose report to %s: %s" % (module.params["report_dir"], error))
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
