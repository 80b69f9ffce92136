# -*- coding: utf-8 -*-
# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)
"""Checks of the monitoring roles' inputs: Prometheus settings (roles/prometheus preflight) and Grafana dashboards
(roles/grafana preflight). PromQL syntax is judged by promtool in the tests, and the metric names the dashboards and
rules read are compared with the DCGM exporter's counters there too (tests/unit/promql_names.py), not here."""

from __future__ import annotations

import json
import re
from typing import Any, Dict, Iterator, List, Set

from ansible_collections.gpu_ops.cluster.plugins.module_utils import input_forms
from ansible_collections.gpu_ops.cluster.plugins.module_utils.input_forms import is_int
from ansible_collections.gpu_ops.cluster.plugins.module_utils.k8s_values import is_dns_label, is_dns_subdomain, quantity_problem

# --storage.tsdb.retention.size: an integer and a byte unit.
_SIZE = re.compile(r"^\d+(?:B|KB|MB|GB|TB|PB|EB)\Z")
_TARGET = re.compile(r"^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?):[0-9]{1,5}\Z")
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*\Z")


def prometheus_duration_seconds(value: Any) -> float:
    """A Prometheus duration (1h30m, 15d) in seconds, for expressions that compare with time()."""
    from ansible.errors import AnsibleFilterError

    try:
        return input_forms.prometheus_duration_seconds(value)
    except ValueError as exc:
        raise AnsibleFilterError("prometheus_duration_seconds: %s" % exc) from exc


def prometheus_setting_problems(settings: Dict[str, Any]) -> List[str]:
    """Every problem of the prometheus role's settings (the role passes its public variables by name)."""
    problems = []

    def bad(name: str, allowed: str) -> None:
        problems.append("%s=%r; allowed: %s" % (name, settings.get(name), allowed))

    for name in ("prometheus_retention_time", "prometheus_scrape_interval", "prometheus_evaluation_interval",
                 "prometheus_alert_exporter_down_for", "prometheus_alert_drift_stale_after"):
        if not input_forms.is_prometheus_duration(settings.get(name)):
            bad(name, "a Prometheus duration such as 15d, 12h, 30s or 1h30m")
    targets = settings.get("prometheus_drift_metrics_targets", [])
    if not isinstance(targets, list):
        bad("prometheus_drift_metrics_targets", "a list of host:port targets")
    else:
        for index, target in enumerate(targets):
            if not (isinstance(target, str) and _TARGET.match(target) and 0 < int(target.rsplit(":", 1)[1]) < 65536):
                problems.append("prometheus_drift_metrics_targets[%d]=%r; allowed: host:port with a port 1-65535, "
                                "such as control-1:9100" % (index, target))
    size = settings.get("prometheus_retention_size")
    if size != "" and not (isinstance(size, str) and _SIZE.match(size)):
        bad("prometheus_retention_size", '"" (no size limit) or a size such as 512MB or 50GB')
    storage = settings.get("prometheus_storage_size")
    if storage != "" and (not isinstance(storage, str) or quantity_problem("", storage, positive=True)):
        bad("prometheus_storage_size", '"" (emptyDir) or a Kubernetes quantity above 0 such as 50Gi or 1.5Ti')
    storage_class = settings.get("prometheus_storage_class")
    if storage_class != "" and not is_dns_subdomain(storage_class):
        bad("prometheus_storage_class", '"" (the cluster default) or a StorageClass name')
    warning, critical = (settings.get("prometheus_alert_temperature_warning"),
                         settings.get("prometheus_alert_temperature_critical"))
    for name, value in (("prometheus_alert_temperature_warning", warning),
                        ("prometheus_alert_temperature_critical", critical)):
        if not is_int(value) or not 30 <= value <= 120:
            bad(name, "an integer between 30 and 120 (degrees C)")
    if is_int(warning) and is_int(critical) and warning >= critical:
        problems.append("prometheus_alert_temperature_warning=%r is not below prometheus_alert_temperature_critical="
                        "%r; allowed: warning < critical" % (warning, critical))
    ratio = settings.get("prometheus_alert_throttle_ratio")
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 1:
        bad("prometheus_alert_throttle_ratio", "a number in (0, 1]: the share of time throttled")
    expected = settings.get("prometheus_expected_gpus")
    if not isinstance(expected, dict):
        bad("prometheus_expected_gpus", "a mapping of node name to GPU count")
    else:
        for node, count in expected.items():
            if not is_dns_subdomain(node):
                problems.append("prometheus_expected_gpus key %r; allowed: a Kubernetes node name" % (node,))
            if not is_int(count) or count < 1:
                problems.append("prometheus_expected_gpus[%r]=%r; allowed: a positive integer" % (node, count))
    labels = settings.get("prometheus_external_labels")
    if not isinstance(labels, dict) or any(not isinstance(k, str) or not _LABEL_NAME.match(k) for k in labels):
        bad("prometheus_external_labels", "a mapping whose keys are Prometheus label names ([a-zA-Z_][a-zA-Z0-9_]*)")
    # The role creates its namespace and labels it Pod Security restricted: never one of Kubernetes' own. The exporter's
    # namespace is only scraped, so any namespace name will do there.
    if not input_forms.is_role_namespace(settings.get("prometheus_namespace")):
        bad("prometheus_namespace", input_forms.ROLE_NAMESPACE_ALLOWED)
    for name in ("prometheus_exporter_namespace", "prometheus_exporter_service"):
        value = settings.get(name)
        if not is_dns_label(value):
            bad(name, "a DNS label (lower-case letters, digits and '-', at most 63)")
    return problems


# ---- Grafana dashboards -------------------------------------------------------------------------------------------

def _panels(panels: Any) -> Iterator[Dict[str, Any]]:
    for panel in panels if isinstance(panels, list) else []:
        if isinstance(panel, dict):
            yield panel
            yield from _panels(panel.get("panels"))  # rows carry their collapsed panels


def grafana_dashboard_problems(dashboards: Any) -> List[str]:
    """Every structural problem of a {file name: JSON text or model} mapping of dashboards: valid JSON, a title and
    a unique uid, panels with ids and a Prometheus query each, unique titles."""
    if not isinstance(dashboards, dict) or not dashboards:
        return ["grafana dashboards=%r; allowed: a non-empty mapping of file name to dashboard JSON" % (dashboards,)]
    problems = []
    uids: Dict[str, str] = {}
    for name, source in sorted(dashboards.items()):
        if not re.match(r"^[a-z0-9][a-z0-9._-]*\.json$", str(name)):
            problems.append("dashboard file name %r; allowed: lower-case letters, digits, '.', '_', '-', ending "
                            "in .json" % (name,))
        try:
            model = json.loads(source) if isinstance(source, str) else source
        except ValueError as exc:
            problems.append("dashboard %s is not valid JSON: %s" % (name, exc))
            continue
        if not isinstance(model, dict):
            problems.append("dashboard %s is %s; allowed: a JSON object" % (name, type(model).__name__))
            continue
        uid = model.get("uid")
        if not isinstance(uid, str) or not re.match(r"^[a-zA-Z0-9_-]{1,40}$", uid):
            problems.append("dashboard %s uid=%r; allowed: 1-40 letters, digits, '_' or '-'" % (name, uid))
        elif uid in uids:
            problems.append("dashboard %s uid=%r repeats dashboard %s" % (name, uid, uids[uid]))
        else:
            uids[uid] = name
        if not isinstance(model.get("title"), str) or not model["title"].strip():
            problems.append("dashboard %s title=%r; allowed: a non-empty string" % (name, model.get("title")))
        panels = list(_panels(model.get("panels")))
        if not panels:
            problems.append("dashboard %s has no panels" % name)
        ids: Set[Any] = set()
        for panel in panels:
            title = panel.get("title")
            if panel.get("id") in ids or not is_int(panel.get("id")):
                problems.append("dashboard %s panel %r id=%r; allowed: a unique integer" % (name, title, panel.get("id")))
            ids.add(panel.get("id"))
            if panel.get("type") != "row" and not any(
                    isinstance(t, dict) and t.get("expr") for t in panel.get("targets") or []):
                problems.append("dashboard %s panel %r has no Prometheus query (targets[].expr)" % (name, title))
    return problems


# The monitoring stack the cluster roles serve: their own Prometheus and Grafana, or a Prometheus Operator's
# (kube-prometheus-stack), found by the two CRDs whose objects the roles create there.
MONITORING_STACKS = ("auto", "own", "operator")
OPERATOR_CRDS = ("servicemonitors.monitoring.coreos.com", "prometheusrules.monitoring.coreos.com")


def monitoring_stack(requested: Any, served: Any) -> str:
    """own or operator: what was asked for, or with auto, operator when the cluster serves both operator CRDs."""
    from ansible.errors import AnsibleFilterError

    if requested not in MONITORING_STACKS:
        raise AnsibleFilterError("monitoring_stack: %r is not one of %s" % (requested, ", ".join(MONITORING_STACKS)))
    if requested == "auto":
        return "operator" if set(OPERATOR_CRDS) <= set(served or []) else "own"
    return str(requested)


def monitoring_label_problems(inputs: Dict[str, Any]) -> List[str]:
    """One message per {variable: labels} whose labels are not a non-empty map of label keys to label values: a
    selector label the operator or the Grafana sidecar looks for (an object without it is silently ignored)."""
    problems = []
    for name, labels in inputs.items():
        allowed = ("allowed: a non-empty map of label keys to label values (strings), such as "
                   '{"release": "kube-prometheus-stack"}')
        if not isinstance(labels, dict) or not labels:
            problems.append("%s=%s; %s" % (name, json.dumps(labels, default=str), allowed))
            continue
        for key, value in labels.items():
            if not isinstance(value, str):
                problems.append("%s[%s]=%s is not a string (quote it: labels are strings); %s"
                                % (name, key, json.dumps(value, default=str), allowed))
                continue
            problems.extend(input_forms.form_problems("%s[%s]" % (name, key), "label_key", key))
            problems.extend(input_forms.form_problems("%s[%s]" % (name, key), "label_value", value))
    return problems


class FilterModule:
    def filters(self) -> Dict[str, Any]:
        return {
            "monitoring_stack": monitoring_stack,
            "monitoring_label_problems": monitoring_label_problems,
            "prometheus_setting_problems": prometheus_setting_problems,
            "prometheus_duration_seconds": prometheus_duration_seconds,
            "grafana_dashboard_problems": grafana_dashboard_problems,
        }
