"""plugins/module_utils/k8s_raw.py: requests through the client's ApiClient transport, without its API classes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from kubernetes import client as kube_client
from kubernetes.client.exceptions import ApiException

from ansible_collections.gpu_ops.cluster.plugins.module_utils import k8s_raw


class Answer:
    def __init__(self, status: int, body: bytes, reason: str = "OK") -> None:
        self.status, self.reason, self.body = status, reason, body

    def read(self) -> bytes:
        return self.body


class FakeTransport:
    """The real ApiClient's serialization (param_serialize: URL, query, auth), its transport replaced by answers."""

    def __init__(self, *answers: Answer) -> None:
        configuration = kube_client.Configuration(host="https://127.0.0.1:6443")
        configuration.api_key = {"BearerToken": "Bearer t0ken"}
        self.api = kube_client.ApiClient(configuration)
        self.answers = list(answers)
        self.sent: list[tuple[str, str, dict]] = []
        self.api.call_api = self.call_api  # type: ignore[method-assign]

    def call_api(self, method, url, header_params=None, body=None, post_params=None, _request_timeout=None):
        self.sent.append((method, url, dict(header_params or {})))
        return self.answers.pop(0)


def test_a_get_sends_the_path_query_and_token_and_decodes_the_answer():
    transport = FakeTransport(Answer(200, b'{"items": [{"metadata": {"name": "gpu-h100-0"}}]}'))
    page = k8s_raw.call_json(transport.api, "/api/v1/nodes", query=[("limit", 500), ("continue", "abc")])
    assert page["items"][0]["metadata"]["name"] == "gpu-h100-0"
    method, url, headers = transport.sent[0]
    assert (method, url) == ("GET", "https://127.0.0.1:6443/api/v1/nodes?limit=500&continue=abc")
    assert headers["Accept"] == "application/json" and headers["authorization"] == "Bearer t0ken"


def test_a_refusal_raises_the_clients_api_exception_with_the_servers_body():
    status = {"kind": "Status", "message": 'nodes is forbidden: User "reader" cannot list resource "nodes"'}
    transport = FakeTransport(Answer(403, json.dumps(status).encode(), "Forbidden"))
    with pytest.raises(ApiException) as caught:
        k8s_raw.call(transport.api, "/api/v1/nodes")
    assert caught.value.status == 403 and caught.value.reason == "Forbidden"
    assert "cannot list resource" in caught.value.body


def test_a_patch_sends_its_body_and_content_type():
    transport = FakeTransport(Answer(200, b"{}"))
    k8s_raw.call_json(transport.api, "/api/v1/nodes/gpu-a100-0", "PATCH", [("dryRun", "All")],
                      {"Content-Type": "application/merge-patch+json", "Accept": "application/json"},
                      {"metadata": {"labels": {"a": "b"}}})
    method, url, headers = transport.sent[0]
    assert (method, url) == ("PATCH", "https://127.0.0.1:6443/api/v1/nodes/gpu-a100-0?dryRun=All")
    assert headers["Content-Type"] == "application/merge-patch+json"


def test_pages_follow_the_continue_token_keep_the_query_and_headers_and_add_up_their_seconds():
    transport = FakeTransport(
        Answer(200, json.dumps({"items": [{"n": 1}, {"n": 2}], "metadata": {"continue": "c/1"}}).encode()),
        Answer(200, json.dumps({"items": [{"n": 3}], "metadata": {}}).encode()))
    timings: dict[str, float] = {}
    got = list(k8s_raw.pages(transport.api, "/api/v1/nodes", 2, [("labelSelector", "a=b")],
                             {"Accept": "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"},
                             timings=timings, name="nodes"))
    assert [item["n"] for page in got for item in page["items"]] == [1, 2, 3]
    assert [url for _, url, _ in transport.sent] == [
        "https://127.0.0.1:6443/api/v1/nodes?labelSelector=a%3Db&limit=2",
        "https://127.0.0.1:6443/api/v1/nodes?labelSelector=a%3Db&limit=2&continue=c/1"]
    assert all("PartialObjectMetadataList" in headers["Accept"] for _, _, headers in transport.sent)
    assert set(timings) == {"request_nodes", "decode"} and all(value >= 0 for value in timings.values())


KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: lab, cluster: {server: "https://127.0.0.1:6443", insecure-skip-tls-verify: true}}]
users: [{name: admin, user: {token: t0ken}}]
contexts: [{name: lab, context: {cluster: lab, user: admin}}]
current-context: lab
"""

READ_CLUSTER = """
import json, sys
from ansible_collections.gpu_ops.cluster.plugins.module_utils import k8s_raw
from ansible_collections.gpu_ops.cluster.plugins.modules import gpu_cluster_check as check
paths = []
def answer(api_client, path, method="GET", query=(), headers=None, body=None, timeout=60):
    paths.append((path, list(query)))
    return b'{"items": [{"kind": "Node"}], "metadata": {}}'
k8s_raw.call = answer
class Module:
    params = {"kubeconfig": sys.argv[1], "context": None, "page_size": 500}
objects = check.read_cluster(Module(), {})
loaded = sorted(m for m in sys.modules if m.startswith(("kubernetes.client.api.", "kubernetes.client.models.")))
print(json.dumps({"paths": paths, "counts": {k: len(v) for k, v in objects.items()}, "loaded": loaded}))
"""


def test_the_cluster_check_reads_the_cluster_without_the_clients_api_classes(tmp_path):
    """The point of k8s_raw: the check's reads import none of the generated API classes or models (0.7 s)."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG)
    run = subprocess.run([sys.executable, "-c", READ_CLUSTER, str(kubeconfig)], capture_output=True, text=True,
                         check=False)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["loaded"] == []
    assert result["counts"] == {"nodes": 1, "pods": 1, "quotas": 1}
    assert result["paths"] == [
        ["/api/v1/nodes", [["limit", 500]]],
        ["/api/v1/pods", [["fieldSelector", "status.phase!=Succeeded,status.phase!=Failed"], ["limit", 500]]],
        ["/api/v1/resourcequotas", [["limit", 500]]],
    ]


K8S_MODULES = ("gpu_cluster_check", "gpu_driver_upgrade_plan", "gpu_foreign_components", "gpu_k8s_access",
               "gpu_node_quarantine", "gpu_node_upgrade", "k8s_node_labels", "k8s_objects_info")


@pytest.mark.parametrize("name", K8S_MODULES)
def test_api_modules_take_the_shared_connection_options(name):
    """One argument spec and one doc fragment for kubeconfig/context: a module neither redefines them nor can change
    the shared spec by extending its copy."""
    import yaml

    from conftest import load_ansible_module

    module = load_ansible_module(name)
    before = json.dumps(k8s_raw.AUTH_ARGSPEC, sort_keys=True)
    spec = module.build_argspec()
    assert {key: spec[key] for key in k8s_raw.AUTH_ARGSPEC} == k8s_raw.AUTH_ARGSPEC
    spec["kubeconfig"]["type"] = "str"
    assert json.dumps(k8s_raw.AUTH_ARGSPEC, sort_keys=True) == before
    doc = yaml.safe_load(module.DOCUMENTATION)
    assert doc["extends_documentation_fragment"] == ["gpu_ops.cluster.k8s_auth"]
    assert not set(k8s_raw.AUTH_ARGSPEC) & set(doc["options"])


def test_doc_fragment_documents_the_shared_spec():
    import yaml

    from conftest import load_source, COLLECTION_ROOT

    fragment = load_source("k8s_auth_fragment", COLLECTION_ROOT / "plugins" / "doc_fragments" / "k8s_auth.py")
    options = yaml.safe_load(fragment.ModuleDocFragment.DOCUMENTATION)["options"]
    assert {key: {"type": value["type"]} for key, value in options.items()} == k8s_raw.AUTH_ARGSPEC
