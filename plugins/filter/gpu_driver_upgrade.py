# -*- coding: utf-8 -*-
# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)
"""Filters that check a rolling driver upgrade's order against the GPU nodes (preflight.yml), and turn its plan and
each node's outcome into its report and its metrics (report.yml); plain functions so they are unit-tested without
Ansible.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

from ansible.errors import AnsibleFilterError
from ansible_collections.gpu_ops.cluster.plugins.module_utils.gpu_upgrade import order_problems

REPORT_SCHEMA = 1
STAGES = ("pending", "in_progress", "done", "failed", "skipped")
PLAN_KEYS = ("batches", "batch_size", "resume", "done", "skipped", "failed_before", "unreachable", "unavailable", "missing",
             "blocked")


def gpu_driver_upgrade_report(plan: Optional[Mapping[str, Any]], outcomes: Optional[Mapping[str, Any]],
                              check_mode: bool = False, max_failed_nodes: int = 0) -> Dict[str, Any]:
    """{schema, check_mode, target, plan, nodes, upgraded, failed_now, not_reached, counts, summary}.

    plan: gpu_driver_upgrade_plan's result. outcomes: node -> {state: upgrade-done | upgrade-failed, ...} for the
    nodes the node play reached. A queued node without an outcome was not reached (the failure budget stopped the
    rollout, or check mode) and is still pending. max_failed_nodes: the failure budget, to say why it stopped."""
    if not isinstance(plan, Mapping) or "queue" not in plan:
        raise AnsibleFilterError("gpu_driver_upgrade_report: the plan is %r, not gpu_driver_upgrade_plan's result"
                                 % (plan,))
    outcomes = dict(outcomes or {})
    queue: List[str] = list(plan.get("queue") or [])
    upgraded = [name for name in queue if (outcomes.get(name) or {}).get("state") == "upgrade-done"]
    failed_now = [name for name in queue if (outcomes.get(name) or {}).get("state") == "upgrade-failed"]
    not_reached = [name for name in queue if name not in outcomes]
    before = dict(plan.get("counts") or {})
    counts = {
        "pending": len(not_reached),
        "in_progress": 0,
        "done": len(plan.get("done") or []) + len(upgraded),
        "failed": len(plan.get("failed_before") or []) + len(failed_now),
        "skipped": len(plan.get("skipped") or []),
    }
    if check_mode:
        counts = {stage: int(before.get(stage, 0)) for stage in STAGES}
    summary = list(plan.get("summary") or [])
    if not check_mode:
        if upgraded:
            summary.append("upgraded: %s" % ", ".join(upgraded))
        if failed_now:
            summary.append("failed (left cordoned, labelled upgrade-failed): %s" % ", ".join(failed_now))
        if not_reached:
            why = ("the failure budget is spent (%d failed, %d allowed)" % (len(failed_now), max_failed_nodes)
                   if len(failed_now) > max_failed_nodes else
                   "the failed nodes, left cordoned, hold every unavailable slot (%d)" % plan.get("batch_size", 0))
            summary.append("not reached, %s: %s" % (why, ", ".join(not_reached)))
    summary.append("GPU nodes: " + ", ".join("%d %s" % (counts[stage], stage.replace("_", " ")) for stage in STAGES))
    return {"schema": REPORT_SCHEMA, "check_mode": bool(check_mode), "target": plan.get("target", ""),
            "plan": {key: plan.get(key) for key in PLAN_KEYS},
            "nodes": outcomes, "upgraded": upgraded, "failed_now": failed_now, "not_reached": not_reached,
            "counts": counts, "summary": summary}


def gpu_driver_upgrade_metrics(report: Mapping[str, Any]) -> str:
    """The report's counts in Prometheus's text format, for node_exporter's textfile collector."""
    counts = (report or {}).get("counts")
    if not isinstance(counts, Mapping):
        raise AnsibleFilterError("gpu_driver_upgrade_metrics: %r is not a rollout report" % (report,))
    lines = ["# HELP gpu_driver_upgrade_nodes GPU nodes per stage of the last rolling driver upgrade.",
             "# TYPE gpu_driver_upgrade_nodes gauge"]
    lines += ['gpu_driver_upgrade_nodes{stage="%s"} %d' % (stage, int(counts.get(stage, 0))) for stage in STAGES]
    lines += ["# HELP gpu_driver_upgrade_last_run_failed Whether a node failed in the last rolling driver upgrade.",
              "# TYPE gpu_driver_upgrade_last_run_failed gauge",
              "gpu_driver_upgrade_last_run_failed %d" % (1 if report.get("failed_now") else 0)]
    return "\n".join(lines) + "\n"


def gpu_driver_upgrade_order_problems(order: Any, gpu_nodes: Any) -> List[str]:
    """One message per name of gpu_driver_upgrade_order that is not one of gpu_nodes (the inventory's GPU nodes)."""
    return order_problems(order, list(gpu_nodes or []), "gpu_driver_upgrade_order")


class FilterModule:
    def filters(self) -> Dict[str, Any]:
        return {"gpu_driver_upgrade_report": gpu_driver_upgrade_report,
                "gpu_driver_upgrade_metrics": gpu_driver_upgrade_metrics,
                "gpu_driver_upgrade_order_problems": gpu_driver_upgrade_order_problems}
