"""plugins/module_utils/gpu_operator.py and module gpu_foreign_components: the GPU Operator and GPU components another
owner runs are found from the objects as the API server returns them, the project's own are not, and the message
names each object and both settings. DaemonSet shapes follow the GPU Operator's assets/state-*/ manifests and the
upstream charts (labels and images as they deploy them)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import pytest

from ansible_collections.gpu_ops.cluster.plugins.module_utils import gpu_operator as op
from conftest import load_ansible_module

OWN = dict(op.OWN_LABELS_DEFAULT)


def daemonset(namespace: str, name: str, labels: Dict[str, str], image: str,
              command: Optional[List[str]] = None, extra: Optional[List[Dict[str, Any]]] = None,
              init: Optional[List[Dict[str, Any]]] = None) -> Dict[str, Any]:
    containers = [{"name": name, "image": image, **({"command": command} if command else {})}] + list(extra or [])
    return {"metadata": {"namespace": namespace, "name": name, "labels": labels},
            "spec": {"template": {"metadata": {"labels": labels},
                                  "spec": {"containers": containers, "initContainers": list(init or [])}}}}


CONFIG_MANAGER = {"name": "config-manager", "image": "nvcr.io/nvidia/k8s-device-plugin:v0.17.1",
                  "command": ["config-manager"]}
OPERATOR_PLUGIN = daemonset("gpu-operator", "nvidia-device-plugin-daemonset", {"app": "nvidia-device-plugin-daemonset"},
                            "nvcr.io/nvidia/k8s-device-plugin:v0.17.1", ["/bin/bash", "-c"], [CONFIG_MANAGER],
                            [CONFIG_MANAGER])
OPERATOR_GFD = daemonset("gpu-operator", "gpu-feature-discovery",
                         {"app": "gpu-feature-discovery", "app.kubernetes.io/part-of": "nvidia-gpu"},
                         "nvcr.io/nvidia/k8s-device-plugin:v0.17.1", ["gpu-feature-discovery"], [CONFIG_MANAGER])
OPERATOR_EXPORTER = daemonset("gpu-operator", "nvidia-dcgm-exporter", {"app": "nvidia-dcgm-exporter"},
                              "nvcr.io/nvidia/k8s/dcgm-exporter:4.2.3-4.1.3-ubuntu22.04")
OPERATOR_TOOLKIT = daemonset("gpu-operator", "nvidia-container-toolkit-daemonset",
                             {"app": "nvidia-container-toolkit-daemonset"}, "nvcr.io/nvidia/k8s/container-toolkit:v1.20.2")
OPERATOR_DCGM = daemonset("gpu-operator", "nvidia-dcgm", {"app": "nvidia-dcgm"}, "nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1")
CHART_PLUGIN = daemonset("kube-system", "nvdp-nvidia-device-plugin", {"app.kubernetes.io/name": "nvidia-device-plugin"},
                         "nvcr.io/nvidia/k8s-device-plugin:v0.18.0")
STATIC_PLUGIN = daemonset("kube-system", "nvidia-device-plugin-daemonset", {"name": "nvidia-device-plugin-ds"},
                          "registry.example/mirror/k8s-device-plugin@sha256:" + "0" * 64)
HAND_EXPORTER = daemonset("monitoring", "gpu-metrics", {"team": "ml"}, "mirror.local:5000/dcgm-exporter:3.3.7")
OWN_PLUGIN = daemonset("nvidia-device-plugin", "nvidia-device-plugin",
                       {"app.kubernetes.io/name": "nvidia-device-plugin", **OWN}, "nvcr.io/nvidia/k8s-device-plugin:v0.17.1",
                       extra=[CONFIG_MANAGER])
OWN_EXPORTER = daemonset("gpu-monitoring", "dcgm-exporter", {"app.kubernetes.io/name": "dcgm-exporter", **OWN},
                         "nvcr.io/nvidia/k8s/dcgm-exporter:3.3.7-3.5.0-ubuntu22.04")
UNRELATED = daemonset("kube-system", "kube-proxy", {"k8s-app": "kube-proxy"}, "registry.k8s.io/kube-proxy:v1.37.2")


def policy(name: str = "cluster-policy", **spec: Any) -> Dict[str, Any]:
    return {"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "metadata": {"name": name}, "spec": spec}


@pytest.mark.parametrize(("obj", "expected"), [
    (OPERATOR_PLUGIN, [op.DEVICE_PLUGIN]),
    (OPERATOR_GFD, [op.GFD]),  # its config-manager sidecar runs the plugin's image, not the plugin
    (OPERATOR_EXPORTER, [op.DCGM_EXPORTER]),
    (OPERATOR_TOOLKIT, []), (OPERATOR_DCGM, []), (UNRELATED, []),
    (CHART_PLUGIN, [op.DEVICE_PLUGIN]), (STATIC_PLUGIN, [op.DEVICE_PLUGIN]), (HAND_EXPORTER, [op.DCGM_EXPORTER]),
    (daemonset("x", "gfd", {}, "nvcr.io/nvidia/gpu-feature-discovery:v0.8.2"), [op.GFD]),
])
def test_a_daemonsets_component_comes_from_its_labels_and_images(obj, expected):
    assert op.daemonset_components(obj) == expected


def test_the_projects_own_daemonsets_are_never_found():
    assert op.find(list(op.COMPONENTS), [], [], [OWN_PLUGIN, OWN_EXPORTER, UNRELATED], OWN) == []


def test_every_foreign_device_plugin_and_gfd_is_found_in_any_namespace_and_named():
    found = op.find([op.DEVICE_PLUGIN, op.GFD], [], [],
                    [OPERATOR_PLUGIN, OPERATOR_GFD, OPERATOR_EXPORTER, CHART_PLUGIN, OWN_PLUGIN], OWN)
    assert [(item["namespace"], item["name"], item["component"], item["owner"]) for item in found] == [
        ("gpu-operator", "nvidia-device-plugin-daemonset", op.DEVICE_PLUGIN, "GPU Operator"),
        ("gpu-operator", "gpu-feature-discovery", op.GFD, "GPU Operator"),
        ("kube-system", "nvdp-nvidia-device-plugin", op.DEVICE_PLUGIN, "unknown"),
    ]
    assert "label app=nvidia-device-plugin-daemonset" in found[0]["why"]
    assert "no label app.kubernetes.io/managed-by=gpu-cluster" in found[2]["why"]


def test_a_daemonset_that_looks_like_ours_but_lacks_the_management_label_is_foreign():
    copy = daemonset("nvidia-device-plugin", "nvidia-device-plugin", {"app.kubernetes.io/name": "nvidia-device-plugin"},
                     "nvcr.io/nvidia/k8s-device-plugin:v0.17.1")
    assert [item["name"] for item in op.find([op.DEVICE_PLUGIN], [], [], [copy], OWN)] == ["nvidia-device-plugin"]


def test_the_exporter_role_looks_only_for_exporters():
    found = op.find([op.DCGM_EXPORTER], [], [], [OPERATOR_PLUGIN, OPERATOR_EXPORTER, HAND_EXPORTER, OWN_EXPORTER], OWN)
    assert [item["name"] for item in found] == ["nvidia-dcgm-exporter", "gpu-metrics"]


def test_a_cluster_policy_counts_unless_it_switches_the_component_off():
    crds = list(op.OPERATOR_CRDS)
    on = op.find([op.DEVICE_PLUGIN, op.GFD], crds, [policy()], [], OWN)
    assert [(item["kind"], item["name"], item["component"]) for item in on] == [
        ("ClusterPolicy", "cluster-policy", op.DEVICE_PLUGIN), ("ClusterPolicy", "cluster-policy", op.GFD)]
    half = op.find([op.DEVICE_PLUGIN, op.GFD], crds, [policy(devicePlugin={"enabled": False})], [], OWN)
    assert [item["component"] for item in half] == [op.GFD]
    # Everything switched off in the operator: the project's component beside the operator's driver and toolkit.
    assert op.find([op.DEVICE_PLUGIN, op.GFD], crds,
                   [policy(devicePlugin={"enabled": False}, gfd={"enabled": False})], [OPERATOR_TOOLKIT], OWN) == []
    assert op.find([op.DCGM_EXPORTER], crds, [policy(dcgmExporter={"enabled": False})], [], OWN) == []


def test_the_operators_crds_without_a_cluster_policy_are_found():
    found = op.find([op.DCGM_EXPORTER], ["clusterpolicies.nvidia.com", "widgets.example.com"], [], [], OWN)
    assert [(item["kind"], item["name"]) for item in found] == [("CustomResourceDefinition", "clusterpolicies.nvidia.com")]
    assert "outlive an uninstall" in found[0]["why"]


def test_the_message_names_each_object_and_both_settings():
    found = op.find([op.DEVICE_PLUGIN, op.GFD], ["clusterpolicies.nvidia.com"], [], [CHART_PLUGIN], OWN)
    message = op.refusal(found, [op.DEVICE_PLUGIN, op.GFD], "nvidia_device_plugin_enabled",
                         "nvidia_device_plugin_take_over")
    assert "DaemonSet kube-system/nvdp-nvidia-device-plugin" in message
    assert "CustomResourceDefinition clusterpolicies.nvidia.com" in message
    assert "nvidia_device_plugin_enabled=false" in message and "nvidia_device_plugin_take_over=true" in message
    assert "Nothing was changed" in message
    assert "spec.devicePlugin.enabled=false" in message and "spec.gfd.enabled=false" in message
    assert op.objects(found) == ["DaemonSet kube-system/nvdp-nvidia-device-plugin",
                                 "CustomResourceDefinition clusterpolicies.nvidia.com"]
    assert op.refusal([], [op.DEVICE_PLUGIN], "a", "b") == ""


def test_a_cluster_policy_message_says_what_to_switch_off_in_it():
    found = op.find([op.DCGM_EXPORTER], list(op.OPERATOR_CRDS), [policy("gpu-cluster-policy")], [OPERATOR_EXPORTER], OWN)
    message = op.refusal(found, [op.DCGM_EXPORTER], "dcgm_exporter_enabled", "dcgm_exporter_take_over")
    assert "ClusterPolicy gpu-cluster-policy" in message and "DaemonSet gpu-operator/nvidia-dcgm-exporter" in message
    assert "spec.dcgmExporter.enabled=false in the ClusterPolicy" in message


@pytest.mark.parametrize(("versions", "expected"), [
    ([{"name": "v1", "served": True, "storage": True}], "v1"),
    ([{"name": "v1alpha1", "served": True, "storage": False}, {"name": "v1", "served": True, "storage": True}], "v1"),
    ([{"name": "v1alpha1", "served": True}], "v1alpha1"),
    ([{"name": "v1", "served": False, "storage": True}], None), ([], None),
])
def test_the_cluster_policies_are_read_in_the_crds_storage_version(versions, expected):
    assert op.served_version({"spec": {"versions": versions}}) == expected


class FakeApi:
    """The module's reads answered from objects: CRDs by name, lists by path."""

    def __init__(self, crds: Dict[str, Dict[str, Any]], lists: Dict[str, List[Dict[str, Any]]]) -> None:
        self.crds, self.lists, self.paths = crds, lists, []


def test_the_module_reads_crds_policies_and_every_daemonset(monkeypatch):
    from kubernetes.client.exceptions import ApiException

    module = load_ansible_module("gpu_foreign_components")
    crd = {"spec": {"group": "nvidia.com", "names": {"plural": "clusterpolicies"},
                    "versions": [{"name": "v1", "served": True, "storage": True}]}}
    api = FakeApi({"clusterpolicies.nvidia.com": crd},
                  {"/apis/nvidia.com/v1/clusterpolicies": [policy(gfd={"enabled": False})],
                   "/apis/apps/v1/daemonsets": [OPERATOR_PLUGIN, OWN_PLUGIN]})

    def call_json(client, path, *args, **kwargs):
        client.paths.append(path)
        name = path.rsplit("/", 1)[-1]
        if name not in client.crds:
            raise ApiException(status=404, reason="Not Found")
        return client.crds[name]

    def pages(client, path, page_size, *args, **kwargs):
        client.paths.append(path)
        yield {"items": client.lists[path]}

    monkeypatch.setattr(module, "call_json", call_json)
    monkeypatch.setattr(module, "pages", pages)
    cluster = module.read_cluster(api, 500)
    assert cluster["crds"] == ["clusterpolicies.nvidia.com"]
    assert api.paths == ["/apis/apiextensions.k8s.io/v1/customresourcedefinitions/clusterpolicies.nvidia.com",
                         "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/nvidiadrivers.nvidia.com",
                         "/apis/nvidia.com/v1/clusterpolicies", "/apis/apps/v1/daemonsets"]
    found = op.find([op.DEVICE_PLUGIN, op.GFD], cluster["crds"], cluster["cluster_policies"], cluster["daemonsets"], OWN)
    assert op.objects(found) == ["DaemonSet gpu-operator/nvidia-device-plugin-daemonset", "ClusterPolicy cluster-policy"]


def test_the_module_without_the_operators_crds_lists_no_policies(monkeypatch):
    from kubernetes.client.exceptions import ApiException

    module = load_ansible_module("gpu_foreign_components")
    api = FakeApi({}, {"/apis/apps/v1/daemonsets": []})

    def call_json(client, path, *args, **kwargs):
        raise ApiException(status=404, reason="Not Found")

    def pages(client, path, page_size, *args, **kwargs):
        client.paths.append(path)
        yield {"items": client.lists[path]}

    monkeypatch.setattr(module, "call_json", call_json)
    monkeypatch.setattr(module, "pages", pages)
    assert module.read_cluster(api, 500) == {"crds": [], "cluster_policies": [], "daemonsets": []}
    assert api.paths == ["/apis/apps/v1/daemonsets"]


def test_a_refused_crd_read_is_not_taken_for_a_missing_crd(monkeypatch):
    from kubernetes.client.exceptions import ApiException

    module = load_ansible_module("gpu_foreign_components")

    def call_json(client, path, *args, **kwargs):
        raise ApiException(status=403, reason="Forbidden")

    monkeypatch.setattr(module, "call_json", call_json)
    with pytest.raises(ApiException):
        module.read_cluster(FakeApi({}, {}), 500)
