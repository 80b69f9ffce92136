"""The monitoring roles (dcgm_exporter, prometheus, grafana) into a Prometheus Operator's stack, on the lab's real API
server with the operator's real CRDs (its Go module v0.94.0, pinned in lab/go/prometheus-operator): the stack detected
from the CRDs, the ServiceMonitor and PrometheusRule accepted by the CRDs' structural schemas (which refuse a bad
object), the rules the same as the own stack's and accepted by promtool, the dashboards labelled for Grafana's
sidecar, no duplicate scrape or rule after a switch either way, only the project's own objects removed, and second
and check runs with no change."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from _common import promtool_path  # lab/_common.py (conftest puts lab/ on the path)
from conftest import Lab, recap_changed, run_playbook, wait_for
from tools import prometheus_operator_crd_paths  # lab/tools.py: the CRDs from the pinned Go module

MONITORING = "monitoring"
EXPORTER = "gpu-monitoring"
GROUP, VERSION = "monitoring.coreos.com", "v1"
# The three roles' tasks only (the whole cluster.yml's idempotence is test_main_job's).
ROLES = ("-i", "inventories/lab/hosts.yml", "--tags", "dcgm_exporter,prometheus,grafana")
MANAGED = "app.kubernetes.io/managed-by=gpu-cluster"


def custom(lab: Lab) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(lab.api_client)


def objects(lab: Lab, namespace: str, plural: str) -> dict[str, dict]:
    """The namespace's objects of an operator kind, by name ({} when the CRD is not served)."""
    try:
        items = custom(lab).list_namespaced_custom_object(GROUP, VERSION, namespace, plural)["items"]
    except ApiException as exc:
        assert exc.status == 404
        return {}
    return {item["metadata"]["name"]: item for item in items}


def names(items: list) -> set[str]:
    return {item.metadata.name for item in items}


def own_stack(lab: Lab) -> dict[str, set[str]]:
    """What the project runs of its own stack in the monitoring namespace."""
    return {"deployments": names(lab.apps.list_namespaced_deployment(MONITORING, label_selector=MANAGED).items),
            "configmaps": names(lab.core.list_namespaced_config_map(MONITORING, label_selector=MANAGED).items),
            "services": names(lab.core.list_namespaced_service(MONITORING, label_selector=MANAGED).items)}


def converge(lab: Lab, *extra: str) -> str:
    rc, output = run_playbook(lab, "cluster.yml", *ROLES, *extra)
    assert rc == 0, output[-3000:]
    return output


def install_crds(lab: Lab) -> list[str]:
    extensions = client.ApiextensionsV1Api(lab.api_client)
    created = []
    for path in prometheus_operator_crd_paths():
        crd = yaml.safe_load(path.read_text(encoding="utf-8"))
        try:
            extensions.create_custom_resource_definition(crd)
        except ApiException as exc:
            if exc.status != 409:  # left by an interrupted session: the same pinned file
                raise
        created.append(crd["metadata"]["name"])

    def established() -> bool:
        return all(any(c.type == "Established" and c.status == "True" for c in
                       extensions.read_custom_resource_definition(name).status.conditions or []) for name in created)

    wait_for(established, 60, "the Prometheus Operator's CRDs to be established")
    return created


def remove_crds(lab: Lab, crds: list[str]) -> None:
    extensions = client.ApiextensionsV1Api(lab.api_client)
    for name in crds:
        try:
            extensions.delete_custom_resource_definition(name)
        except ApiException as exc:
            if exc.status != 404:
                raise
    wait_for(lambda: not set(crds) & names(extensions.list_custom_resource_definition().items), 90,
             "the CRDs to be deleted")


@pytest.fixture(scope="module")
def own_converged(lab: Lab) -> dict:
    """The own stack converged on a cluster without the operator's CRDs (auto: own); its rules file kept. In lane 2,
    test_monitoring.py and test_dcgm_exporter.py leave it converged: one run of the three roles less."""
    crds = {crd.metadata.name for crd in client.ApiextensionsV1Api(lab.api_client).list_custom_resource_definition().items}
    assert not crds & {f"{plural}.{GROUP}" for plural in ("servicemonitors", "prometheusrules")}, crds
    if own_stack(lab)["deployments"] != {"grafana", "prometheus"} or not names(
            lab.apps.list_namespaced_daemon_set(EXPORTER, label_selector=MANAGED).items):
        converge(lab)
    rules = lab.core.read_namespaced_config_map("prometheus-rules", MONITORING).data["gpu-alerts.yml"]
    return {"rules": yaml.safe_load(rules)}


@pytest.fixture(scope="module")
def operator_crds(lab: Lab, own_converged):
    crds = install_crds(lab)
    yield crds
    # The last test left the own stack (gpu_monitoring_stack=own), which is what auto gives without the CRDs.
    remove_crds(lab, crds)


def test_operator_stack_asked_for_without_its_crds_is_refused(lab: Lab, own_converged):
    before = own_stack(lab)
    rc, output = run_playbook(lab, "cluster.yml", *ROLES, "-e", "gpu_monitoring_stack=operator")
    flat = " ".join(output.split())
    assert rc != 0 and "dcgm_exporter_monitoring_stack=operator, but the cluster does not serve" in flat, output[-3000:]
    assert "serve prometheusrules.monitoring.coreos.com and servicemonitors.monitoring.coreos.com (the" in flat
    assert own_stack(lab) == before


def test_the_crds_structural_schemas_refuse_a_bad_object(lab: Lab, operator_crds, namespace):
    space = namespace()
    bad_monitor = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ServiceMonitor", "metadata": {"name": "bad"},
                   "spec": {"selector": {}, "endpoints": [{"port": "metrics", "honorLabels": "yes",
                                                           "relabelings": [{"action": "explode"}]}]}}
    bad_rule = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "PrometheusRule", "metadata": {"name": "bad"},
                "spec": {"groups": [{"rules": [{"alert": "X"}]}]}}
    for plural, body, fields in (("servicemonitors", bad_monitor, ("honorLabels", "action")),
                                 ("prometheusrules", bad_rule, ("groups[0].name", "expr"))):
        with pytest.raises(ApiException) as refused:
            custom(lab).create_namespaced_custom_object(GROUP, VERSION, space, plural, body)
        assert refused.value.status == 422, refused.value.body
        for field in fields:
            assert field in refused.value.body, refused.value.body


def test_detected_operator_stack_gets_the_objects_and_the_own_stack_goes(lab: Lab, own_converged, operator_crds):
    secret_before = lab.core.read_namespaced_secret("grafana-admin", MONITORING).metadata.resource_version
    output = converge(lab)  # auto: both CRDs served
    assert recap_changed(output) > 0
    (monitor,) = objects(lab, EXPORTER, "servicemonitors").values()
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "metrics" and endpoint["honorLabels"] is True
    assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node",
            "action": "replace"} in endpoint["relabelings"]
    # One place evaluates the rules: the PrometheusRule, with the own stack's rules exactly.
    (rule,) = objects(lab, MONITORING, "prometheusrules").values()
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert rule["spec"] == own_converged["rules"]
    # No own Prometheus left to scrape the exporter or evaluate the rules a second time, no own Grafana.
    assert own_stack(lab) == {"deployments": set(), "configmaps": {"grafana-dashboards"}, "services": set()}
    dashboards = lab.core.read_namespaced_config_map("grafana-dashboards", MONITORING)
    assert dashboards.metadata.labels["grafana_dashboard"] == "1"
    assert sorted(json.loads(text)["uid"] for text in dashboards.data.values()) == [
        "gpu-cluster", "gpu-drift", "gpu-node", "gpu-workloads"]
    # The admin Secret (the password) stays for a later switch back.
    assert lab.core.read_namespaced_secret("grafana-admin", MONITORING).metadata.resource_version == secret_before


def test_operator_stack_second_run_and_check_run_change_nothing(lab: Lab, operator_crds):
    for mode in ((), ("--check",)):
        rc, output = run_playbook(lab, "cluster.yml", *ROLES, *mode)
        assert rc == 0 and recap_changed(output) == 0, output[-3000:]


def test_the_rule_in_the_cluster_passes_promtool(lab: Lab, operator_crds, tmp_path: Path):
    rule = custom(lab).get_namespaced_custom_object(GROUP, VERSION, MONITORING, "prometheusrules", "gpu-alerts")
    (tmp_path / "gpu-alerts.yml").write_text(yaml.safe_dump(rule["spec"]))
    assert promtool_path().exists(), "run `lab/labctl.py promtool` first (make integration does)"
    result = subprocess.run([str(promtool_path()), "check", "rules", "gpu-alerts.yml"], cwd=tmp_path,
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0 and "SUCCESS" in result.stdout, result.stdout + result.stderr


# Each case runs the role that refuses it alone (its tag), so the others' no-op applies cost no time here.
@pytest.mark.parametrize("role, extra, message", [
    ("dcgm_exporter", {"gpu_monitoring_operator_labels": {"release": 5}},
     "dcgm_exporter_operator_labels[release]=5 is not a string"),
    ("grafana", {"grafana_dashboard_labels": {"grafana dashboard": "1"}},
     'grafana_dashboard_labels[grafana dashboard]="grafana dashboard" is not a label key'),
    ("prometheus", {"prometheus_rule_object": True}, "prometheus_rule_object=true is no longer read"),
])
def test_bad_input_is_refused_before_any_change(lab: Lab, operator_crds, role, extra, message):
    before = {plural: {name: item["metadata"]["resourceVersion"] for name, item in
                       objects(lab, space, plural).items()}
              for space, plural in ((EXPORTER, "servicemonitors"), (MONITORING, "prometheusrules"))}
    rc, output = run_playbook(lab, "cluster.yml", *ROLES[:-1], role, "-e", json.dumps(extra))
    assert rc != 0 and message in " ".join(output.split()), output[-3000:]
    after = {plural: {name: item["metadata"]["resourceVersion"] for name, item in
                      objects(lab, space, plural).items()}
             for space, plural in ((EXPORTER, "servicemonitors"), (MONITORING, "prometheusrules"))}
    assert after == before



def test_both_stacks_only_when_asked_for(lab: Lab, operator_crds):
    """prometheus_with_operator: the project's Prometheus scrapes the exporter beside the operator's ServiceMonitor
    (the user asked for both); Grafana stays off without grafana_with_operator."""
    rc, output = run_playbook(lab, "cluster.yml", *ROLES[:-1], "prometheus",
                              "-e", json.dumps({"prometheus_with_operator": True}))
    assert rc == 0, output[-3000:]
    assert set(objects(lab, EXPORTER, "servicemonitors")) == {"dcgm-exporter"}
    assert set(objects(lab, MONITORING, "prometheusrules")) == {"gpu-alerts"}
    assert own_stack(lab)["deployments"] == {"prometheus"}

def test_back_to_the_own_stack_removes_only_the_projects_objects(lab: Lab, own_converged, operator_crds):
    users = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "PrometheusRule",
             "metadata": {"name": "team-gpu-alerts", "labels": {"app.kubernetes.io/name": "gpu-alerts",
                                                                 "release": "kube-prometheus-stack"}},
             "spec": {"groups": [{"name": "team", "rules": [{"record": "team:gpu_util:avg",
                                                             "expr": "avg(DCGM_FI_DEV_GPU_UTIL)"}]}]}}
    custom(lab).create_namespaced_custom_object(GROUP, VERSION, MONITORING, "prometheusrules", users)
    try:
        # Check mode predicts the switch and changes nothing (drift detection runs the roles this way).
        rc, output = run_playbook(lab, "cluster.yml", *ROLES, "-e", "gpu_monitoring_stack=own", "--check")
        assert rc == 0 and recap_changed(output) > 0, output[-3000:]
        for removed in ("ServiceMonitor/dcgm-exporter", "PrometheusRule/gpu-alerts"):
            assert f"changed: [localhost] => (item={removed})" in output, output[-3000:]
        assert set(objects(lab, EXPORTER, "servicemonitors")) == {"dcgm-exporter"}
        converge(lab, "-e", "gpu_monitoring_stack=own")
        # The project's ServiceMonitor and PrometheusRule are gone (the own Prometheus scrapes and evaluates now);
        # the user's rule, without the project's label, stays.
        assert objects(lab, EXPORTER, "servicemonitors") == {}
        assert set(objects(lab, MONITORING, "prometheusrules")) == {"team-gpu-alerts"}
        assert own_stack(lab)["deployments"] == {"grafana", "prometheus"}
        config = yaml.safe_load(lab.core.read_namespaced_config_map("prometheus-config", MONITORING)
                                .data["prometheus.yml"])
        assert [job["job_name"] for job in config["scrape_configs"]].count("dcgm-exporter") == 1
        rules = lab.core.read_namespaced_config_map("prometheus-rules", MONITORING).data["gpu-alerts.yml"]
        assert yaml.safe_load(rules) == own_converged["rules"]
        dashboards = lab.core.read_namespaced_config_map("grafana-dashboards", MONITORING)
        assert "grafana_dashboard" not in dashboards.metadata.labels
        rc, output = run_playbook(lab, "cluster.yml", *ROLES, "-e", "gpu_monitoring_stack=own", "--check")
        assert rc == 0 and recap_changed(output) == 0, output[-3000:]
    finally:
        custom(lab).delete_namespaced_custom_object(GROUP, VERSION, MONITORING, "prometheusrules", "team-gpu-alerts")
