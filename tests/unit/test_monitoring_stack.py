"""The monitoring roles' two stacks (own Prometheus and Grafana, or a Prometheus Operator's): one decision for the three
roles, the operator objects as the roles render them (ServiceMonitor with the selector labels, honorLabels and the
node relabelling; the PrometheusRule carrying exactly the own stack's rules file, judged by promtool), and the
selector labels' preflight messages."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from ansible.errors import AnsibleFilterError

from conftest import REPO_ROOT, load_filter_plugin, promtool_path, render_role_template
from test_prometheus_rules import TESTS, render_rules

filters = load_filter_plugin("monitoring")
BOTH = list(filters.OPERATOR_CRDS)


@pytest.mark.parametrize("requested, served, stack", [
    ("auto", [], "own"),
    ("auto", BOTH[:1], "own"),  # a ServiceMonitor CRD alone (another tool's) is no operator stack to alert with
    ("auto", BOTH[1:], "own"),
    ("auto", BOTH + ["other.example.com"], "operator"),
    ("own", BOTH, "own"),
    ("operator", [], "operator"),  # the roles' own check then refuses it, naming the missing CRDs
])
def test_one_decision_for_the_three_roles(requested, served, stack):
    assert filters.monitoring_stack(requested, served) == stack


def test_an_unknown_stack_is_refused_by_the_filter():
    with pytest.raises(AnsibleFilterError, match="'prometheus' is not one of auto, own, operator"):
        filters.monitoring_stack("prometheus", [])


@pytest.mark.parametrize("role", ["dcgm_exporter", "prometheus", "grafana"])
def test_every_role_looks_up_the_crds_the_decision_reads(role):
    internal = yaml.safe_load((REPO_ROOT / "roles" / role / "vars" / "main.yml").read_text())
    assert internal[f"_{role}_operator_crds"] == BOTH
    apply = (REPO_ROOT / "roles" / role / "tasks" / "apply.yml").read_text()
    assert f'__common_k8s_crds: "{{{{ _{role}_operator_crds }}}}"' in apply


@pytest.mark.parametrize("labels, message", [
    ({"release": "kube-prometheus-stack"}, None),
    ({"release": "prom", "team": "gpu"}, None),
    ({}, 'x={}; allowed: a non-empty map'),
    ("release=prom", 'x="release=prom"; allowed: a non-empty map'),
    ({"release": 1}, "x[release]=1 is not a string"),
    ({"bad key": "1"}, 'x[bad key]="bad key" is not a label key; allowed:'),
    ({"release": "no spaces"}, 'x[release]="no spaces" is not a label value; allowed:'),
])
def test_selector_labels_are_checked_naming_the_variable_and_value(labels, message):
    problems = filters.monitoring_label_problems({"x": labels})
    if message is None:
        assert problems == []
    else:
        assert len(problems) == 1 and problems[0].startswith(message), problems


def test_the_service_monitor_selects_keeps_attribution_and_labels_the_node():
    monitor = yaml.safe_load(render_role_template(
        "dcgm_exporter", "service-monitor.yaml.j2", dcgm_exporter_operator_labels={"release": "prom"}))
    assert monitor["metadata"]["labels"] == {"release": "prom", "app.kubernetes.io/name": "dcgm-exporter",
                                             "app.kubernetes.io/managed-by": "gpu-cluster"}
    assert monitor["spec"]["selector"] == {"matchLabels": {"app.kubernetes.io/name": "dcgm-exporter"}}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "metrics" and endpoint["honorLabels"] is True
    assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node",
            "action": "replace"} in endpoint["relabelings"]
    # The operator's target labels of the exporter's own pod go; the exporter's attribution stays (honorLabels).
    assert endpoint["relabelings"][-1] == {"regex": "(namespace|pod|container)", "action": "labeldrop"}


def test_the_default_selector_is_kube_prometheus_stacks_release():
    for role in ("dcgm_exporter", "prometheus"):
        defaults = (REPO_ROOT / "roles" / role / "defaults" / "main.yml").read_text()
        assert (f"{role}_operator_labels: \"{{{{ gpu_monitoring_operator_labels | default({{'release': "
                "'kube-prometheus-stack'}) }}\"") in defaults
    grafana = yaml.safe_load((REPO_ROOT / "roles" / "grafana" / "defaults" / "main.yml").read_text())
    assert grafana["grafana_dashboard_labels"] == {"grafana_dashboard": "1"}


@pytest.fixture(scope="module")
def rule_object() -> dict:
    rules = render_rules()
    return yaml.safe_load(render_role_template("prometheus", "prometheus-rule.yaml.j2", _prometheus_rules_file=rules,
                                               prometheus_operator_labels={"release": "prom"}))


def test_the_prometheus_rule_carries_the_own_stacks_rules_file(rule_object):
    assert rule_object["spec"] == yaml.safe_load(render_rules())
    assert rule_object["metadata"]["labels"]["release"] == "prom"
    assert rule_object["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "gpu-cluster"


def test_promtool_checks_and_tests_the_prometheus_rules_spec(rule_object, tmp_path: Path):
    spec = rule_object["spec"]
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(spec))
    for group in spec["groups"]:  # the unit-test copy compares labels only, as test_prometheus_rules does
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / "gpu-alerts.yml").write_text(yaml.safe_dump(spec))
    (tmp_path / "gpu-alerts.test.yml").write_text(TESTS.read_text())
    for args in (("check", "rules", "rules.yml"), ("test", "rules", "gpu-alerts.test.yml")):
        result = subprocess.run([str(promtool_path()), *args], cwd=tmp_path, capture_output=True, text=True,
                                check=False)
        assert result.returncode == 0 and "SUCCESS" in result.stdout, result.stdout + result.stderr
