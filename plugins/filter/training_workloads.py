# -*- coding: utf-8 -*-
# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)
"""Checks of the training workloads (roles/training_workloads preflight)."""

from __future__ import annotations

import ast
import json
import re
from typing import Any, Dict, List

from ansible_collections.gpu_ops.cluster.plugins.module_utils.input_forms import form_problems
from ansible_collections.gpu_ops.cluster.plugins.module_utils.k8s_values import (
    is_dns_subdomain, is_label_value, parse_quantity, quantity_problem)

VAR = "training_workloads_jobs"
KINDS = ("tensorflow", "pytorch", "pytorch-distributed")
JOB_KEYS = ("name", "kind", "gpus", "workers", "product", "cpu", "memory", "labels", "annotations", "gpu_request",
            "device_class", "selectors")
# How a pod asks for its GPUs: the device plugin's extended resource, or a ResourceClaim (DRA) from a template.
GPU_REQUESTS = ("extended-resource", "claim")
CLAIM_ONLY_KEYS = ("device_class", "selectors")
# Labels the role sets itself (the Job controller sets job-name and the batch.kubernetes.io ones): not a job's to set.
OWN_LABELS = ("app.kubernetes.io/name", "app.kubernetes.io/managed-by", "app.kubernetes.io/part-of", "job-name",
              "controller-uid")
OWN_LABEL_PREFIXES = ("batch.kubernetes.io/",)
# Kueue's queue label (constants.QueueLabel), set on the Job from training_workloads_queue_name.
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# Job names become pod host names (<name>-<index>) and Service names: a DNS-1123 label with room for the index.
_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,48}[a-z0-9])?\Z")


def _count(value: Any, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def training_workload_problems(jobs: Any, gpu_request: Any = "extended-resource", queue_name: Any = "") -> List[str]:
    """Every problem of training_workloads_jobs, naming the entry, the value and what is allowed.

    gpu_request: the role-wide way of asking for GPUs (training_workloads_gpu_request), which a job's own gpu_request
    overrides. queue_name: training_workloads_queue_name, which a job's own Kueue queue label must not contradict.
    """
    if gpu_request not in GPU_REQUESTS:
        return ["training_workloads_gpu_request=%r; allowed: %s" % (gpu_request, ", ".join(GPU_REQUESTS))]
    if not isinstance(jobs, list) or not jobs:
        return ["%s=%r; allowed: a non-empty list of {name, kind, gpus, product, cpu, memory}" % (VAR, jobs)]
    problems: List[str] = []
    seen: Dict[str, int] = {}
    for index, job in enumerate(jobs):
        path = "%s[%d]" % (VAR, index)
        if not isinstance(job, dict):
            problems.append("%s=%r; allowed: a mapping" % (path, job))
            continue
        problems.extend("%s.%s is not a known key; allowed: %s" % (path, key, ", ".join(JOB_KEYS))
                        for key in job if key not in JOB_KEYS)
        name = job.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            problems.append("%s.name=%r; allowed: a DNS-1123 label starting with a letter, at most 50 characters"
                            % (path, name))
        elif name in seen:
            problems.append("%s.name=%r repeats %s[%d]" % (path, name, VAR, seen[name]))
        else:
            seen[name] = index
        if job.get("kind") not in KINDS:
            problems.append("%s.kind=%r; allowed: %s" % (path, job.get("kind"), ", ".join(KINDS)))
        if not _count(job.get("gpus"), 1):
            problems.append("%s.gpus=%r; allowed: a whole number >= 1" % (path, job.get("gpus")))
        if job.get("kind") == "pytorch-distributed" and not _count(job.get("workers", 2), 2):
            problems.append("%s.workers=%r; allowed: a whole number >= 2" % (path, job.get("workers")))
        claim = job.get("gpu_request", gpu_request) == "claim"
        problems.extend(_gpu_request_problems(path, job, gpu_request))
        # Through a claim the device class and selectors choose the GPU; the product's node label is optional then.
        product_optional = claim and job.get("product") in (None, "")
        if not product_optional and not is_label_value(job.get("product"), allow_empty=False):
            problems.append("%s.product=%r; allowed: a GPU product label value such as NVIDIA-H100-80GB-HBM3%s"
                            % (path, job.get("product"), " (optional with gpu_request: claim)" if claim else ""))
        for key in ("cpu", "memory"):
            problem = quantity_problem("%s.%s" % (path, key), job.get(key), strings_only=True, positive=True)
            if problem:
                problems.append(problem)
        problems.extend(_metadata_problems(path, job))
        problems.extend(_queue_problems(path, job, queue_name))
    return problems


def _queue_problems(path: str, job: Dict[str, Any], queue_name: Any) -> List[str]:
    """The role puts training_workloads_queue_name on the Job (Kueue admits the Job by it); a job's own queue label
    goes on the Job's pods as well, so a different one would leave the Job and its pods in two queues."""
    labels = job.get("labels") if isinstance(job.get("labels"), dict) else {}
    own = labels.get(QUEUE_LABEL)
    if not queue_name or own is None or own == queue_name:
        return []
    values = (path, QUEUE_LABEL, own, queue_name, queue_name, own)
    return ["%s.labels[%r]=%r contradicts training_workloads_queue_name=%r (the Job would be queued in %r, its pods "
            "labelled %r); allowed: leave the label out, or the same queue name" % values]


def _gpu_request_problems(path: str, job: Dict[str, Any], default: str) -> List[str]:
    """gpu_request, and with claims the DeviceClass and the CEL selectors of the job's ResourceClaimTemplate."""
    request = job.get("gpu_request", default)
    if request not in GPU_REQUESTS:
        return ["%s.gpu_request=%r; allowed: %s" % (path, request, ", ".join(GPU_REQUESTS))]
    if request != "claim":
        return ["%s.%s is only used with gpu_request: claim; allowed: leave it out, or set gpu_request: claim"
                % (path, key) for key in CLAIM_ONLY_KEYS if key in job]
    problems: List[str] = []
    if "device_class" in job and not is_dns_subdomain(job["device_class"]):
        problems.append("%s.device_class=%r; allowed: a DeviceClass name (a DNS subdomain) such as gpu.nvidia.com, "
                        "mig.nvidia.com or a product class" % (path, job["device_class"]))
    selectors = job.get("selectors", [])
    if not isinstance(selectors, list):
        problems.append("%s.selectors=%r; allowed: a list of CEL expressions" % (path, selectors))
    else:
        problems.extend("%s.selectors[%d]=%r; allowed: a CEL expression on the device, such as "
                        "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H100 80GB HBM3'"
                        % (path, index, selector) for index, selector in enumerate(selectors)
                        if not isinstance(selector, str) or not selector.strip())
    return problems


def training_workloads_claim_plan(existing: Any, wanted: List[Dict[str, Any]], listed: List[str]) -> Dict[str, List[str]]:
    """Which of the role's ResourceClaimTemplates in the namespace to delete before the apply.

    existing: the templates there with the role's labels (k8s_info resources); wanted: the templates this run applies;
    listed: the names of the jobs in training_workloads_jobs. A template's spec is immutable, so one whose request
    changed is replaced (deleted, then applied again); one of a listed job that no longer asks through a claim (or
    whose jobs are deleted with state absent) is removed. Templates of jobs left out of the list stay, as their Jobs do.
    """
    wanted_specs = {item["metadata"]["name"]: item.get("spec") for item in wanted}
    replace, remove = [], []
    for item in existing or []:
        name = item.get("metadata", {}).get("name")
        if name in wanted_specs:
            if item.get("spec") != wanted_specs[name]:
                replace.append(name)
        elif name in listed:
            remove.append(name)
    return {"replace": sorted(replace), "remove": sorted(remove)}


def _controller_owned(key: Any) -> bool:
    return any(str(key).startswith(prefix) for prefix in OWN_LABEL_PREFIXES)


def _metadata_problems(path: str, job: Dict[str, Any]) -> List[str]:
    """The optional labels (Job and pods) and annotations (pods) of one workload."""
    problems: List[str] = []
    labels = job.get("labels", {})
    problems.extend(form_problems("%s.labels" % path, "labels", labels))
    if isinstance(labels, dict):
        problems.extend("%s.labels[%r] is set by the role or the Job controller; allowed: any other label key"
                        % (path, key) for key in labels if key in OWN_LABELS or _controller_owned(key))
    annotations = job.get("annotations", {})
    problems.extend(form_problems("%s.annotations" % path, "annotations", annotations))
    if isinstance(annotations, dict):
        problems.extend("%s.annotations[%r] is set by the Job controller; allowed: any other annotation key"
                        % (path, key) for key in annotations if _controller_owned(key))
    return problems


_BODY = re.compile(r"(b'.*'|b\".*\"|\{.*\})\s*$", re.S)


def _server_message(result: Dict[str, Any]) -> str:
    """The API server's own words from a failed kubernetes.core.k8s result: its msg ends with the response body (the
    Status object, as the bytes' repr or as text), whose message is returned; else the module's msg."""
    text = str(result.get("msg") or result.get("reason") or "refused")
    found = _BODY.search(text)
    if found:
        try:
            body = found.group(1)
            if body.startswith("b"):
                body = ast.literal_eval(body).decode("utf-8", "replace")
            status = json.loads(body)
            if isinstance(status, dict) and status.get("message"):
                return str(status["message"])
        except (ValueError, SyntaxError):
            pass
    return text


def training_workloads_dry_run_problems(results: Any, jobs: Any) -> List[str]:
    """One message per claim template the API server refused in the preflight's dry run, naming the job it was
    rendered from as the user wrote it (training_workloads_jobs[i]) and the server's reason (its field path, the CEL
    compiler's error)."""
    index = {job.get("name"): i for i, job in enumerate(jobs or []) if isinstance(job, dict)}
    problems = []
    for result in results or []:
        # The task runs with failed_when: false, which sets failed to false: a refusal is a result without the
        # object (result) and with the module's message.
        if not isinstance(result, dict) or result.get("skipped") or "result" in result or not result.get("msg"):
            continue
        name = ((result.get("training_workloads_claim_template") or {}).get("metadata") or {}).get("name")
        where = f"{VAR}[{index[name]}] ({name})" if name in index else f"the claim template {name}"
        problems.append(f"{where}: the API server refuses its ResourceClaimTemplate (dry run, nothing applied): "
                        f"{_server_message(result)}")
    return problems


def _allocatable(node: Any, resource: str) -> int:
    """A node's allocatable count of an extended resource (0 when it has none or the value is not a quantity)."""
    value = parse_quantity((((node or {}).get("status") or {}).get("allocatable") or {}).get(resource))
    return int(value) if value is not None else 0


def training_workloads_fit_problems(jobs: Any, nodes: Any, device_classes: Any, gpu_request: str = "extended-resource",
                                    device_class: str = "gpu.nvidia.com", gpu_resource: str = "nvidia.com/gpu",
                                    product_label: str = "nvidia.com/gpu.product") -> List[str]:
    """What the cluster cannot give a job however long it waits, naming the input as the user wrote it: a pod asking
    more GPUs (training_workloads_gpu_resource) than any node of its product has allocatable, a product no node has,
    a claim's DeviceClass the cluster does not have.

    nodes: the cluster's Node objects (none: nothing to judge, as on a cluster whose GPU nodes an autoscaler adds).
    device_classes: the DeviceClass objects, or None where the cluster does not serve resource.k8s.io/v1.
    """
    problems: List[str] = []
    nodes = [node for node in nodes or [] if isinstance(node, dict)]
    class_names = None if device_classes is None else sorted(
        ((item.get("metadata") or {}).get("name", "") for item in device_classes if isinstance(item, dict)))
    for index, job in enumerate(jobs or []):
        if not isinstance(job, dict) or not _count(job.get("gpus"), 1):
            continue
        path = "%s[%d]" % (VAR, index)
        if job.get("gpu_request", gpu_request) == "claim":
            if class_names is None:
                continue  # the role's own check names the missing API
            name = job.get("device_class", device_class)
            if name not in class_names:
                where = "%s.device_class" % path if "device_class" in job else "training_workloads_device_class"
                problems.append("%s=%r names no DeviceClass of the cluster (it has: %s); allowed: one of those, or "
                                "a class the DRA driver role creates (nvidia_dra_driver_product_classes) once it has "
                                "run" % (where, name, ", ".join(class_names) or "none"))
            continue
        if not nodes:
            continue
        product = job.get("product")
        offered = [(_allocatable(node, gpu_resource), (node.get("metadata") or {}).get("name", "")) for node in nodes
                   if ((node.get("metadata") or {}).get("labels") or {}).get(product_label) == product]
        offered = [entry for entry in offered if entry[0] > 0]
        if not offered:
            products = sorted({((node.get("metadata") or {}).get("labels") or {}).get(product_label) for node in nodes
                               if _allocatable(node, gpu_resource) > 0} - {None})
            problems.append("%s.product=%r: no node labelled %s=%r has %s allocatable (products with it: %s); "
                            "allowed: one of those products" % (path, product, product_label, product, gpu_resource,
                                                                ", ".join(products) or "none"))
            continue
        largest, node_name = max(offered)
        if job["gpus"] > largest:
            problems.append("%s.gpus=%d: more than any node labelled %s=%r can give one pod (largest: %d %s "
                            "allocatable on %s); allowed: at most %d per pod (a pytorch-distributed job spreads "
                            "more over several pods)" % (path, job["gpus"], product_label, product, largest,
                                                         gpu_resource, node_name, largest))
    return problems


class FilterModule:
    def filters(self) -> Dict[str, Any]:
        return {"training_workload_problems": training_workload_problems,
                "training_workloads_claim_plan": training_workloads_claim_plan,
                "training_workloads_dry_run_problems": training_workloads_dry_run_problems,
                "training_workloads_fit_problems": training_workloads_fit_problems}
