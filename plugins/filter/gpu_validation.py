# -*- coding: utf-8 -*-
# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)
"""Filters that turn the validation results into one report: the verdict, every problem, and a readable summary.

Used by roles/gpu_validation/tasks/report.yml; plain functions so they are unit-tested without Ansible.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

from ansible.errors import AnsibleFilterError

from ansible_collections.gpu_ops.cluster.plugins.module_utils import support_matrix
from ansible_collections.gpu_ops.cluster.plugins.module_utils.gpu_cluster_dra import MODES, layout_from_facts


def gpu_expected_counts(nodes: Optional[List[str]], hostvars: Mapping[str, Any]) -> Dict[str, Optional[int]]:
    """The GPUs each GPU node must have: the inventory's gpu_validation_expected_gpu_count where it is set, else
    what the node's own facts counted (nvidia_gpu_facts, e.g. from the fact cache), else None (not known).

    The one place this is worked out: the validation's cluster check and Prometheus's GPU-missing alert read it."""
    counts: Dict[str, Optional[int]] = {}
    for node in nodes or []:
        node_vars = hostvars.get(node) or {}
        expected = node_vars.get("gpu_validation_expected_gpu_count")
        if expected is None:
            facts = (node_vars.get("ansible_facts") or {}).get("nvidia_gpu") or {}
            expected = facts.get("gpu_count")
        try:
            counts[node] = None if expected is None else int(expected)
        except (TypeError, ValueError) as exc:
            raise AnsibleFilterError("hostvars[%r].gpu_validation_expected_gpu_count=%r is not a whole number"
                                     % (node, expected)) from exc
    return counts


def gpu_expected_nodes(nodes: Optional[List[str]], hostvars: Mapping[str, Any],
                       allocation_modes: Optional[Mapping[str, Any]] = None) -> List[Dict[str, Any]]:
    """The cluster check's expected_nodes: per GPU node its GPU count (gpu_expected_counts), its allocation mode where
    allocation_modes names it (device-plugin or dra; else the node's label decides), and its MIG layout where the
    node's own facts (nvidia_gpu_facts) give one (per GPU: MIG mode and its MIG devices' profiles)."""
    modes = dict(allocation_modes or {})
    for node, mode in sorted(modes.items()):
        if mode not in MODES:
            raise AnsibleFilterError("gpu_validation_allocation_modes[%r]=%r is not an allocation mode; allowed: %s"
                                     % (node, mode, " or ".join(MODES)))
    entries = []
    for node, count in gpu_expected_counts(nodes, hostvars).items():
        entry: Dict[str, Any] = {"name": node, "gpus": count}
        if node in modes:
            entry["allocation_mode"] = modes[node]
        facts = ((hostvars.get(node) or {}).get("ansible_facts") or {}).get("nvidia_gpu") or {}
        layout = layout_from_facts(facts["gpus"]) if facts.get("gpus") and not facts.get("error_kind") else None
        if layout is not None:
            entry["mig"] = layout
        entries.append(entry)
    return entries


def _host_line(name: str, facts: Mapping[str, Any]) -> tuple[str, List[str]]:
    if not facts:
        return "%s: not checked" % name, []
    if facts.get("error_kind"):
        message = " ".join(str(facts.get("error") or "").split())
        advice = facts.get("advice")
        problem = "%s: %s: %s%s" % (name, facts["error_kind"], message, " (%s)" % advice if advice else "")
        return problem, [problem]
    gpus = facts.get("gpus") or []
    products = sorted({str(gpu.get("name")) for gpu in gpus if gpu.get("name")})
    line = "%s: %d GPU(s) %s, driver %s (%s)" % (
        name, facts.get("gpu_count", len(gpus)), "/".join(products) or "-", facts.get("driver_version") or "-",
        "healthy" if facts.get("healthy") else "unhealthy")
    problems = ["%s: %s" % (name, problem) for problem in facts.get("problems") or []]
    return line, problems


def driver_eol_warnings(hosts: Mapping[str, Any], today: Any = "") -> List[str]:
    """'<host>: driver <version>: <support_matrix's line>' for each host whose running driver's branch is past its end
    of life on today ("YYYY-MM-DD"; empty: the controller's date, UTC). Warnings, never problems."""
    try:
        day = support_matrix.parse_day(today) if today else support_matrix.utc_today()
    except ValueError as exc:
        raise AnsibleFilterError("gpu_validation_report: today=%r is not a YYYY-MM-DD date" % (today,)) from exc
    warnings = [support_matrix.node_driver_eol_warning(name, (hosts[name] or {}).get("driver_version"), day)
                for name in sorted(hosts)]
    return [warning for warning in warnings if warning]


def gpu_validation_report(hosts: Optional[Mapping[str, Any]], cluster: Optional[Mapping[str, Any]],
                          smoke: Optional[Mapping[str, Any]], today: Any = "") -> Dict[str, Any]:
    """The whole validation as data: {passed, problems, warnings, hosts, cluster, smoke, summary}. A host's driver on
    a branch past its end of life is a warning (support_matrix.driver_branch_eol_warning), not a problem."""
    if hosts is not None and not isinstance(hosts, Mapping):
        raise AnsibleFilterError("gpu_validation_report: hosts must be a mapping of host name to nvidia_gpu facts, "
                                 "got %r" % (hosts,))
    hosts = dict(hosts or {})
    cluster = dict(cluster or {})
    smoke = dict(smoke or {})
    problems: List[str] = []
    lines = ["GPU validation", "", "Hosts (nvidia_gpu_facts):"]
    for name in sorted(hosts):
        line, host_problems = _host_line(name, hosts[name] or {})
        lines.append("  " + line)
        problems.extend(host_problems)
    if not hosts:
        lines.append("  none checked")

    lines += ["", "Cluster (gpu_cluster_check):"]
    if cluster:
        problems.extend(cluster.get("problems") or [])
        for name, node in sorted((cluster.get("nodes") or {}).items()):
            if not node.get("present", True):
                lines.append("  %s: not in the cluster" % name)
                continue
            state = "Ready" if node.get("ready") else "NotReady"
            cordoned = ", cordoned" if node.get("unschedulable") else ""
            dra = node.get("dra")
            if node.get("allocation_mode") == "dra" and dra:
                found = dra.get("found") or {}
                published = ", ".join("%s=%s" % item for item in sorted((found.get("devices") or {}).items())) or "none"
                if dra.get("expected") is not None:
                    wanted = ", ".join("%s=%s" % item for item in sorted(dra["expected"].items())) or "none"
                elif dra.get("expected_gpus") is not None:
                    wanted = "%s GPUs" % dra["expected_gpus"]
                else:
                    wanted = "-"
                lines.append("  %s: %s, dra mode, ResourceSlice devices %s on %s GPUs (expected %s), %s allocated%s"
                             % (name, state, published, found.get("gpus", 0), wanted, dra.get("allocated", 0),
                                cordoned))
                continue
            advertised = ", ".join("%s=%s" % item for item in sorted((node.get("allocatable") or {}).items())) or "-"
            expected = ", ".join("%s=%s" % item for item in sorted((node.get("expected") or {}).items())) or "-"
            lines.append("  %s: %s, allocatable %s (expected %s)%s" % (name, state, advertised, expected, cordoned))
        for quota in cluster.get("quotas") or []:
            lines.append("  quota %s/%s: %s used %s of %s" % (quota["namespace"], quota["quota"], quota["resource"],
                                                              quota["used"], quota["hard"]))
        lines.append("  pending GPU pods: %d" % len(cluster.get("pending_gpu_pods") or []))
        claims = cluster.get("pending_claims") or []
        lines.append("  pending ResourceClaims: %d" % len(claims))
        for row in claims:
            lines.append("    %s/%s waits for claim %s: %s" % (
                row.get("namespace"), row.get("pod"), row.get("claim") or "(from template %s)" % row.get("template"),
                row.get("message") or row.get("reason") or "not scheduled yet"))
    else:
        lines.append("  not checked")

    lines += ["", "CUDA smoke Job:"]
    if smoke.get("ran"):
        if smoke.get("succeeded"):
            lines.append("  succeeded on %s (%s)" % (smoke.get("node") or "?", smoke.get("image")))
        else:
            reasons = "; ".join(str(c.get("message") or c.get("reason")) for c in smoke.get("conditions") or [])
            problem = "CUDA smoke Job %s%s" % ("failed" if smoke.get("failed") else "did not finish in time",
                                               ": " + reasons if reasons else "")
            problems.append(problem)
            lines.append("  " + problem)
    else:
        lines.append("  not run: %s" % (smoke.get("reason") or "not requested"))

    passed = not problems
    warnings = driver_eol_warnings(hosts, today) + list(cluster.get("warnings") or [])
    lines += ["", "Verdict: %s" % ("PASSED" if passed else "FAILED (%d problem(s))" % len(problems))]
    lines += ["  - " + problem for problem in problems]
    if warnings:
        lines += ["Warnings:"] + ["  - " + warning for warning in warnings]
    return {"passed": passed, "problems": problems, "warnings": warnings, "hosts": hosts, "cluster": cluster,
            "smoke": smoke, "summary": "\n".join(lines) + "\n"}


class FilterModule:
    def filters(self) -> Dict[str, Any]:
        return {"gpu_validation_report": gpu_validation_report, "gpu_expected_counts": gpu_expected_counts,
                "gpu_expected_nodes": gpu_expected_nodes}
