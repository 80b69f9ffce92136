"""The batched read module (k8s_objects_info): the paths it asks, discovery once per group and version, and answers in
the shape of kubernetes.core.k8s_info's. The lab's integration tests run it against the real API server: every cluster
role's `_common` k8s_lookup (namespace and CRDs) and the prometheus role's k8s_prune (test_monitoring_operator.py)."""

from __future__ import annotations

import pytest
from kubernetes.client.exceptions import ApiException

from conftest import ModuleRunner, load_ansible_module

objects_module = load_ansible_module("k8s_objects_info")

# APIResourceLists as the API server's discovery answers them (trimmed to the fields the module reads).
CORE = {"kind": "APIResourceList", "groupVersion": "v1", "resources": [
    {"name": "namespaces", "namespaced": False, "kind": "Namespace"},
    {"name": "namespaces/status", "namespaced": False, "kind": "Namespace"},
    {"name": "configmaps", "namespaced": True, "kind": "ConfigMap"},
]}
APIEXT = {"kind": "APIResourceList", "groupVersion": "apiextensions.k8s.io/v1", "resources": [
    {"name": "customresourcedefinitions", "namespaced": False, "kind": "CustomResourceDefinition"},
]}


class FakeServer:
    """Paths to answers; a path it does not know is a 404, as the API server says for an unserved group."""

    def __init__(self, answers: dict) -> None:
        self.answers = answers
        self.asked: list[tuple[str, list]] = []

    def call_json(self, api, path, method="GET", query=(), headers=None, body=None, timeout=60):
        assert method == "GET"
        self.asked.append((path, list(query)))
        if path not in self.answers:
            raise ApiException(status=404, reason="Not Found")
        return self.answers[path]


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> FakeServer:
    fake = FakeServer({
        "/api/v1": CORE,
        "/apis/apiextensions.k8s.io/v1": APIEXT,
        "/api/v1/namespaces/monitoring": {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "monitoring"}},
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/clusterqueues.kueue.x-k8s.io": {
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "clusterqueues.kueue.x-k8s.io"}},
        "/api/v1/namespaces/monitoring/configmaps": {"kind": "ConfigMapList", "items": [{"metadata": {"name": "a"}}]},
    })
    monkeypatch.setattr(objects_module, "call_json", fake.call_json)
    monkeypatch.setattr(objects_module, "api_client", lambda kubeconfig, context: object())
    return fake


def test_paths_of_the_core_group_and_the_others():
    assert objects_module.group_version_path("v1") == "/api/v1"
    assert objects_module.group_version_path("apps/v1") == "/apis/apps/v1"
    assert objects_module.object_path("v1", "configmaps", True, {"namespace": "ns", "name": "x"}) == \
        "/api/v1/namespaces/ns/configmaps/x"
    assert objects_module.object_path("v1", "configmaps", True, {}) == "/api/v1/configmaps"
    # A namespace given for a cluster-scoped kind is not part of its path.
    assert objects_module.object_path("v1", "namespaces", False, {"namespace": "ns", "name": "x"}) == \
        "/api/v1/namespaces/x"


def test_a_subresource_never_stands_for_its_kind():
    assert objects_module.find_resource(CORE, "Namespace") == ("namespaces", False)
    assert objects_module.find_resource(CORE, "Pod") is None


def test_answers_in_order_in_k8s_infos_shape_with_discovery_asked_once(server, patched_ansible_module):
    queries = [
        {"api_version": "v1", "kind": "Namespace", "name": "monitoring"},
        {"api_version": "v1", "kind": "Namespace", "name": "absent"},
        {"api_version": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
         "name": "clusterqueues.kueue.x-k8s.io"},
        {"api_version": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
         "name": "servicemonitors.monitoring.coreos.com"},
        {"api_version": "monitoring.coreos.com/v1", "kind": "PrometheusRule", "namespace": "monitoring",
         "label_selectors": ["app.kubernetes.io/managed-by=gpu-cluster"], "ref": {"crd": "x"}},
        {"api_version": "v1", "kind": "ConfigMap", "namespace": "monitoring",
         "label_selectors": ["a=b", "app.kubernetes.io/managed-by=gpu-cluster"], "ref": {"kind": "ConfigMap"}},
    ]
    result = ModuleRunner(objects_module, patched_ansible_module).exit({"queries": queries}, check_mode=True)
    assert result["changed"] is False
    found = [(r["api_found"], [o["metadata"]["name"] for o in r["resources"]]) for r in result["results"]]
    assert found == [(True, ["monitoring"]), (True, []), (True, ["clusterqueues.kueue.x-k8s.io"]), (True, []),
                     (False, []), (True, ["a"])]
    # Each answer carries its query back, ref included, so callers pair them.
    assert result["results"][4]["query"]["ref"] == {"crd": "x"}
    assert result["results"][0]["query"]["label_selectors"] == []
    # A LIST's items get the apiVersion and kind k8s_info gives them.
    assert result["results"][5]["resources"][0]["kind"] == "ConfigMap"
    assert result["results"][5]["resources"][0]["apiVersion"] == "v1"
    discovery = [path for path, _ in server.asked if path in ("/api/v1", "/apis/apiextensions.k8s.io/v1",
                                                             "/apis/monitoring.coreos.com/v1")]
    assert discovery == ["/api/v1", "/apis/apiextensions.k8s.io/v1", "/apis/monitoring.coreos.com/v1"]
    assert ("/api/v1/namespaces/monitoring/configmaps",
            [("labelSelector", "a=b,app.kubernetes.io/managed-by=gpu-cluster")]) in server.asked
    assert result["requests"] == len(server.asked) == 8


def test_a_refusal_other_than_not_found_fails_the_task_with_the_servers_words(monkeypatch, patched_ansible_module):
    def forbidden(*args, **kwargs):
        raise ApiException(status=403, reason="Forbidden")

    monkeypatch.setattr(objects_module, "call_json", forbidden)
    monkeypatch.setattr(objects_module, "api_client", lambda kubeconfig, context: object())
    failed = ModuleRunner(objects_module, patched_ansible_module).fail(
        {"queries": [{"api_version": "v1", "kind": "Namespace", "name": "x"}]})
    assert failed["msg"].startswith("the API server refused a read: 403 Forbidden")


def test_field_and_label_selectors_go_as_the_servers_parameters_across_all_namespaces(server, patched_ansible_module):
    server.answers["/api/v1/pods"] = {"kind": "PodList", "items": [{"metadata": {"name": "p", "namespace": "t"}}]}
    server.answers["/api/v1"] = dict(CORE, resources=CORE["resources"] + [
        {"name": "pods", "namespaced": True, "kind": "Pod"}, {"name": "pods/log", "namespaced": True, "kind": "Pod"}])
    result = ModuleRunner(objects_module, patched_ansible_module).exit({"queries": [
        {"api_version": "v1", "kind": "Pod", "field_selectors": ["status.phase=Pending"], "label_selectors": ["a"],
         "ref": "pending_pods"}]})
    assert server.asked[-1] == ("/api/v1/pods", [("labelSelector", "a"), ("fieldSelector", "status.phase=Pending")])
    (answer,) = result["results"]
    assert answer["query"]["ref"] == "pending_pods" and answer["resources"][0]["metadata"]["namespace"] == "t"
