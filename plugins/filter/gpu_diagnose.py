# -*- coding: utf-8 -*-
# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)
"""Filters of the diagnose role (roles/gpu_diagnose/tasks/cluster.yml): which pod logs to read, and what was read.

The signature matching and redaction live in plugins/module_utils/gpu_diagnose.py (the report module uses them)."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

from ansible.errors import AnsibleFilterError


def gpu_diagnose_log_targets(pods: Optional[List[Mapping[str, Any]]]) -> List[Dict[str, str]]:
    """One {namespace, pod, container} per container (init containers too) of the pods given."""
    targets = []
    for pod in pods or []:
        if not isinstance(pod, Mapping):
            raise AnsibleFilterError("gpu_diagnose_log_targets: %r is not a pod object" % (pod,))
        metadata = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        for container in (spec.get("initContainers") or []) + (spec.get("containers") or []):
            targets.append({"namespace": metadata.get("namespace", ""), "pod": metadata.get("name", ""),
                            "container": container.get("name", "")})
    return targets


def gpu_diagnose_log_texts(results: Optional[List[Mapping[str, Any]]]) -> Dict[str, str]:
    """namespace/pod/container to the log's text, or to why it could not be read, from k8s_log's loop results."""
    texts: Dict[str, str] = {}
    for result in results or []:
        target = result.get("__gpu_diagnose_log") or {}
        if not target or result.get("skipped"):
            continue
        name = "%s/%s/%s" % (target.get("namespace"), target.get("pod"), target.get("container"))
        if result.get("failed") or "log" not in result:
            texts[name] = "(log not read: %s)\n" % " ".join(str(result.get("msg") or "no reason given").split())[:500]
        else:
            texts[name] = str(result.get("log") or "")
    return texts


class FilterModule:
    def filters(self) -> Dict[str, Any]:
        return {"gpu_diagnose_log_targets": gpu_diagnose_log_targets, "gpu_diagnose_log_texts": gpu_diagnose_log_texts}
