"""The access check's decisions (plugins/module_utils/k8s_access.py), the module's argument handling, and that each
cluster role's declared needs (roles/<role>/tasks/k8s_access.yml) cover every kind its templates apply.

The messages are checked against the lab's real API server in tests/integration/test_k8s_access.py.
"""

from __future__ import annotations

import datetime
import re

import pytest

from ansible_collections.gpu_ops.cluster.plugins.module_utils.k8s_access import (
    certificate_problem,
    denied_message,
    describe_check,
    expand_needs,
    need_problems,
    resource_attributes,
    status_reason,
    transport_reason,
)

from conftest import REPO_ROOT, ModuleRunner, load_ansible_module

UTC = datetime.timezone.utc
NOW = datetime.datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
SERVER = "https://127.0.0.1:16443"


def test_each_verb_is_one_check_and_duplicates_merge_with_who_needs_them() -> None:
    checks, needed_by = expand_needs([
        {"resource": "namespaces", "verbs": ["get", "create"], "by": "prometheus"},
        {"resource": "namespaces", "verbs": ["create", "patch"], "by": "tenancy"},
        {"group": "apps", "resource": "daemonsets", "namespace": "gpu-monitoring", "verbs": ["patch"]},
    ])
    assert checks == [("get", "", "namespaces", "", "", ""), ("create", "", "namespaces", "", "", ""),
                      ("patch", "", "namespaces", "", "", ""), ("patch", "apps", "daemonsets", "", "gpu-monitoring", "")]
    assert needed_by[("create", "", "namespaces", "", "", "")] == ["prometheus", "tenancy"]
    assert needed_by[checks[-1]] == []


@pytest.mark.parametrize(("check", "text"), [
    (("create", "apps", "daemonsets", "", "gpu-monitoring", ""), "create apps/daemonsets in namespace gpu-monitoring"),
    (("patch", "", "nodes", "", "", ""), "patch nodes (cluster-wide)"),
    (("get", "", "pods", "log", "team-a", "trainer"), "get pods/log trainer in namespace team-a"),
])
def test_a_check_reads_as_verb_group_resource_and_namespace(check: tuple, text: str) -> None:
    assert describe_check(check) == text


def test_resource_attributes_leave_out_empty_fields_but_keep_the_core_group() -> None:
    assert resource_attributes(("patch", "", "nodes", "", "", "")) == {"verb": "patch", "group": "", "resource": "nodes"}
    assert resource_attributes(("get", "apps", "deployments", "", "monitoring", "grafana")) == {
        "verb": "get", "group": "apps", "resource": "deployments", "namespace": "monitoring", "name": "grafana"}


def test_malformed_needs_are_the_callers_mistake() -> None:
    assert need_problems([{"resource": "daemonsets", "verbs": ["get"]}]) == []
    problems = need_problems([{"resource": "apps/daemonsets", "verbs": ["apply"]}, {"resource": "pods", "verbs": []}])
    assert len(problems) == 3
    assert "verbs ['apply']" in problems[0] and "plural resource name" in problems[1] and "needs[1]" in problems[2]


def test_the_denial_lists_every_missing_permission_with_user_role_and_reason() -> None:
    denied = [("create", "", "namespaces", "", "", ""), ("patch", "apps", "daemonsets", "", "nvidia-device-plugin", "")]
    message = denied_message("jane", ["ops", "system:authenticated"], "/home/jane/.kube/config", denied,
                             {denied[0]: ["prometheus", "tenancy"]}, {denied[1]: "no RBAC policy matched"})
    lines = message.splitlines()
    assert lines[0] == ("user jane (groups ops) of /home/jane/.kube/config lacks 2 permission(s) the run needs "
                        "(SelfSubjectAccessReview, checked before any change):")
    assert lines[1] == "  - create namespaces (cluster-wide) (needed by prometheus, tenancy)"
    assert lines[2] == "  - patch apps/daemonsets in namespace nvidia-device-plugin: no RBAC policy matched"


def test_an_expired_or_not_yet_valid_client_certificate_is_named_with_its_date() -> None:
    start, end = datetime.datetime(2025, 1, 1, tzinfo=UTC), datetime.datetime(2026, 1, 1, 8, 30, tzinfo=UTC)
    assert certificate_problem("ops", "/k", start, end, NOW).startswith(
        "the client certificate of user ops in /k expired on 2026-01-01 08:30:00 UTC")
    assert "not valid before 2026-06-01 00:00:00 UTC" in certificate_problem(
        "ops", "/k", datetime.datetime(2026, 6, 1, tzinfo=UTC), datetime.datetime(2027, 1, 1, tzinfo=UTC), NOW)
    assert certificate_problem("ops", "/k", start, datetime.datetime(2026, 3, 2, tzinfo=UTC), NOW) is None


@pytest.mark.parametrize(("error", "expected"), [
    ("SSLError: [SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: unable to get local issuer certificate "
     "(_ssl.c:1006)", f"the server's certificate is not signed by the CA in /k (cluster lab, server {SERVER})"),
    ("SSLError: [SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: IP address mismatch, certificate is not "
     "valid for '10.0.0.1'", "does not name the host of the server URL"),
    ("SSLError: [SSL: WRONG_VERSION_NUMBER] wrong version number", "does not speak TLS"),
    ("NewConnectionError: Failed to establish a new connection: [Errno 111] Connection refused",
     f"no API server answers at {SERVER} (connection refused)"),
    ("NameResolutionError: Failed to resolve 'api.example': [Errno -2] Name or service not known", "does not resolve"),
    ("ConnectTimeoutError: Connection to 10.0.0.1 timed out", "did not answer in time"),
])
def test_transport_failures_read_as_one_sentence_naming_the_kubeconfig(error: str, expected: str) -> None:
    reason = transport_reason(error, "/k", "lab", SERVER)
    assert expected in reason and "/k" in reason


def test_refused_first_requests_name_the_user() -> None:
    assert "credentials of user ops in /k (cluster lab" in status_reason(401, "ops", "/k", "lab", SERVER)
    forbidden = status_reason(403, "ops", "/k", "lab", SERVER, '{"message": "forbidden: User \\"ops\\""}')
    assert "user ops is authenticated" in forbidden and 'forbidden: User "ops"' in forbidden


def test_the_module_refuses_malformed_needs_before_any_request(patched_ansible_module: list) -> None:
    runner = ModuleRunner(load_ansible_module("gpu_k8s_access"), patched_ansible_module)
    result = runner.fail({"kubeconfig": "/nonexistent", "needs": [{"resource": "pods", "verbs": ["apply"]}]})
    assert "verbs ['apply']" in result["msg"]


def test_the_module_names_a_kubeconfig_it_cannot_read(patched_ansible_module: list) -> None:
    runner = ModuleRunner(load_ansible_module("gpu_k8s_access"), patched_ansible_module)
    result = runner.fail({"kubeconfig": "/nonexistent/kubeconfig", "needs": []})
    assert result["msg"].startswith("cannot use the kubeconfig /nonexistent/kubeconfig") or \
        result["msg"].startswith("cannot read the kubeconfig /nonexistent/kubeconfig")
    assert result["changed"] is False


# Kinds the roles' templates apply, as RBAC names their resources.
PLURALS = {
    "Namespace": "namespaces", "ConfigMap": "configmaps", "Secret": "secrets", "Service": "services",
    "ServiceAccount": "serviceaccounts", "PersistentVolumeClaim": "persistentvolumeclaims",
    "ResourceQuota": "resourcequotas", "LimitRange": "limitranges", "DaemonSet": "daemonsets",
    "Deployment": "deployments", "Job": "jobs", "CronJob": "cronjobs", "Role": "roles", "RoleBinding": "rolebindings",
    "ClusterRole": "clusterroles", "ClusterRoleBinding": "clusterrolebindings", "NetworkPolicy": "networkpolicies",
    "RuntimeClass": "runtimeclasses", "ServiceMonitor": "servicemonitors", "PrometheusRule": "prometheusrules",
    "ValidatingAdmissionPolicy": "validatingadmissionpolicies",
    "ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings",
    "MutatingWebhookConfiguration": "mutatingwebhookconfigurations",
    "ValidatingWebhookConfiguration": "validatingwebhookconfigurations", "DeviceClass": "deviceclasses",
    "ResourceClaimTemplate": "resourceclaimtemplates",
}
CLUSTER_ROLES = ("gpu_scheduling", "nvidia_device_plugin", "nvidia_dra_driver", "dcgm_exporter", "prometheus",
                 "grafana", "tenancy", "training_workloads", "gpu_validation", "drift_schedule", "gpu_queues")


@pytest.mark.parametrize("role", CLUSTER_ROLES)
def test_a_roles_declared_needs_cover_every_kind_its_templates_apply(role: str) -> None:
    needs = (REPO_ROOT / "roles" / role / "tasks" / "k8s_access.yml").read_text(encoding="utf-8")
    kinds = set()
    for template in (REPO_ROOT / "roles" / role / "templates").glob("*.yaml.j2"):
        kinds.update(re.findall(r"^kind: (\w+)", template.read_text(encoding="utf-8"), re.MULTILINE))
    unknown = kinds - PLURALS.keys()
    assert not unknown, f"add the plural of {unknown} to PLURALS"
    missing = sorted(kind for kind in kinds if not re.search(rf"\b{PLURALS[kind]}\b", needs))
    assert not missing, f"roles/{role}/tasks/k8s_access.yml does not name the resources of {missing}"


@pytest.mark.parametrize("role", CLUSTER_ROLES)
def test_a_role_checks_access_before_its_first_api_call(role: str) -> None:
    entry = "cluster.yml" if role == "gpu_validation" else "main.yml"
    tasks = (REPO_ROOT / "roles" / role / "tasks" / entry).read_text(encoding="utf-8")
    access = tasks.index("import_tasks: k8s_access.yml")
    first_api_call = min(tasks.index(marker) for marker in ("import_tasks: apply.yml", "import_tasks: cronjob.yml",
                                                            "gpu_ops.cluster.gpu_cluster_check") if marker in tasks)
    assert access < first_api_call
    if "import_tasks: preflight.yml" in tasks and role in ("tenancy", "training_workloads", "gpu_queues"):
        assert access < tasks.index("import_tasks: preflight.yml")  # their preflights read the cluster
