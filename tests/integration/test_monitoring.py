"""roles/prometheus and roles/grafana against the lab's real API server: admitted under Pod Security `restricted`, the
configuration the cluster holds accepted by promtool, the admin Secret generated once and never printed, re-runs and
check runs with no change, one changed value touching only its objects, and bad input refused before any change. The
Prometheus Operator's stack (PrometheusRule, ServiceMonitor, sidecar dashboards) is test_monitoring_operator.py's."""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from _common import promtool_path  # lab/_common.py (conftest puts lab/ on the path): what `labctl promtool` unpacked
from conftest import Lab, recap_changed, run_playbook, wait_for

NAMESPACE = "monitoring"
LAB_INVENTORY = "inventories/lab/hosts.yml"
MONITORING = ("-i", LAB_INVENTORY, "--tags", "prometheus_preflight,prometheus_apply,grafana_preflight,grafana_apply")


def versions(lab: Lab) -> dict[str, str]:
    """resourceVersion of every object the two roles own in the namespace."""
    found = {}
    for kind, items in (
        ("ConfigMap", lab.core.list_namespaced_config_map(NAMESPACE).items),
        ("Secret", lab.core.list_namespaced_secret(NAMESPACE).items),
        ("Service", lab.core.list_namespaced_service(NAMESPACE).items),
        ("ServiceAccount", lab.core.list_namespaced_service_account(NAMESPACE).items),
        ("Deployment", lab.apps.list_namespaced_deployment(NAMESPACE).items),
    ):
        for item in items:
            if (item.metadata.labels or {}).get("app.kubernetes.io/managed-by") == "gpu-cluster":
                found[f"{kind}/{item.metadata.name}"] = item.metadata.resource_version
    return found


def admin_password(lab: Lab) -> str:
    secret = lab.core.read_namespaced_secret("grafana-admin", NAMESPACE)
    return base64.b64decode(secret.data["password"]).decode()


@pytest.fixture(scope="module")
def deployed(lab: Lab):
    # A reused lab may hold a password an earlier (perhaps killed) session set; this module tests the generated one.
    try:
        lab.core.delete_namespaced_secret("grafana-admin", NAMESPACE)
    except ApiException as error:
        if error.status != 404:
            raise
    rc, output = run_playbook(lab, "cluster.yml", "-i", LAB_INVENTORY)
    assert rc == 0, output[-3000:]

    def ready(name: str):
        status = lab.apps.read_namespaced_deployment_status(name, NAMESPACE).status
        return status.ready_replicas == 1

    wait_for(lambda: ready("prometheus") and ready("grafana"), 90, "Prometheus and Grafana to be Ready")
    return output


def test_admitted_under_restricted_pod_security(lab: Lab, deployed):
    labels = lab.core.read_namespace(NAMESPACE).metadata.labels
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    pods = lab.core.list_namespaced_pod(NAMESPACE).items
    assert sorted(p.metadata.labels["app.kubernetes.io/name"] for p in pods) == ["grafana", "prometheus"]
    for pod in pods:
        assert pod.spec.security_context.run_as_non_root and pod.spec.containers[0].security_context.capabilities.drop == ["ALL"]
    assert [(p.name, p.port) for p in lab.core.read_namespaced_service("prometheus", NAMESPACE).spec.ports] == [
        ("web", 9090)]
    # Service discovery may read, never write.
    rbac = client.RbacAuthorizationV1Api(lab.api_client)
    verbs = {verb for rule in rbac.read_cluster_role("gpu-cluster:prometheus").rules for verb in rule.verbs}
    assert verbs == {"get", "list", "watch"}


def test_the_configuration_in_the_cluster_passes_promtool(lab: Lab, deployed, tmp_path: Path):
    config = lab.core.read_namespaced_config_map("prometheus-config", NAMESPACE).data["prometheus.yml"]
    rules = lab.core.read_namespaced_config_map("prometheus-rules", NAMESPACE).data["gpu-alerts.yml"]
    (tmp_path / "prometheus.yml").write_text(config)
    (tmp_path / "gpu-alerts.yml").write_text(rules)
    for args in (("check", "config", "prometheus.yml"), ("check", "rules", "gpu-alerts.yml")):
        assert promtool_path().exists(), "run `lab/labctl.py promtool` first (make integration does)"
        result = subprocess.run([str(promtool_path()), *args], cwd=tmp_path, capture_output=True, text=True,
                                check=False)
        assert result.returncode == 0, result.stdout + result.stderr
    # GPUMissing knows what the inventory expects of every GPU node.
    recorded = {rule["labels"]["node"]: rule["expr"] for group in yaml.safe_load(rules)["groups"]
                for rule in group["rules"] if rule.get("record") == "gpu:node_expected_gpus"}
    assert recorded == {"gpu-h100-0": "vector(8)", "gpu-h100-1": "vector(8)", "gpu-a100-0": "vector(4)"}
    datasources = yaml.safe_load(
        lab.core.read_namespaced_config_map("grafana-provisioning", NAMESPACE).data["datasources.yaml"])
    assert datasources["datasources"][0]["url"] == "http://prometheus.monitoring.svc:9090"
    dashboards = lab.core.read_namespaced_config_map("grafana-dashboards", NAMESPACE).data
    assert sorted(json.loads(text)["uid"] for text in dashboards.values()) == ["gpu-cluster", "gpu-drift", "gpu-node",
                                                                               "gpu-workloads"]


def test_admin_password_generated_once_kept_and_never_printed(lab: Lab, deployed):
    password = admin_password(lab)
    assert len(password) == 32 and password.isalnum()
    before = versions(lab)
    rc, output = run_playbook(lab, "cluster.yml", *MONITORING, "-v")
    assert rc == 0 and recap_changed(output) == 0, output[-3000:]
    assert password not in output and base64.b64encode(password.encode()).decode() not in output
    assert admin_password(lab) == password and versions(lab) == before


def test_second_run_and_check_mode_change_nothing(lab: Lab, deployed):
    for mode in ((), ("--check",)):
        rc, output = run_playbook(lab, "cluster.yml", *MONITORING, *mode)
        assert rc == 0 and recap_changed(output) == 0, output[-3000:]


def test_one_value_changes_only_the_objects_that_use_it(lab: Lab, deployed):
    before = versions(lab)
    rc, output = run_playbook(lab, "cluster.yml", *MONITORING, "-e", "prometheus_retention_time=30d")
    try:
        assert rc == 0 and recap_changed(output) == 1, output[-3000:]
        after = versions(lab)
        assert {key for key in before if before[key] != after[key]} == {"Deployment/prometheus"}
        args = lab.apps.read_namespaced_deployment("prometheus", NAMESPACE).spec.template.spec.containers[0].args
        assert "--storage.tsdb.retention.time=30d" in args
    finally:
        rc, output = run_playbook(lab, "cluster.yml", *MONITORING)
        assert rc == 0, output[-3000:]


def test_a_new_password_replaces_the_secret_and_restarts_grafana(lab: Lab, deployed):
    old = admin_password(lab)
    before = versions(lab)
    rc, output = run_playbook(lab, "cluster.yml", *MONITORING, "-e", "grafana_admin_password=Changed0ne4Test")
    assert rc == 0, output[-3000:]
    assert "Changed0ne4Test" not in output
    assert admin_password(lab) == "Changed0ne4Test" != old
    changed = {key for key, value in versions(lab).items() if before.get(key) != value}
    assert changed == {"Secret/grafana-admin", "Deployment/grafana"}
    annotations = lab.apps.read_namespaced_deployment("grafana", NAMESPACE).spec.template.metadata.annotations
    assert "gpu-cluster/credentials-changed-at" in annotations
    # Without a password given, the role keeps what the Secret holds.
    rc, output = run_playbook(lab, "cluster.yml", *MONITORING)
    assert rc == 0 and recap_changed(output) == 0 and admin_password(lab) == "Changed0ne4Test", output[-3000:]


@pytest.mark.parametrize("extra, message", [
    (["-e", "prometheus_retention_time='15 days'"],
     "prometheus_retention_time='15 days'; allowed: a Prometheus duration"),
    (["-e", '{"prometheus_alert_temperature_warning": 95}'],
     "prometheus_alert_temperature_warning=95 is not below prometheus_alert_temperature_critical=90"),
    (["-e", '{"grafana_extra_dashboards": {"mine.json": "{not json"}}'], "dashboard mine.json is not valid JSON"),
    (["-e", '{"prometheus_with_operator": "false"}'], 'prometheus_with_operator="false" is not a boolean (str)'),
])
def test_bad_input_is_refused_before_any_change(lab: Lab, deployed, extra, message):
    before = versions(lab)
    rc, output = run_playbook(lab, "cluster.yml", *MONITORING, *extra)
    assert rc != 0 and message in " ".join(output.split()), output[-3000:]
    assert versions(lab) == before

