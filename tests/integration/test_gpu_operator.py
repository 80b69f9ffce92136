"""Living beside the GPU Operator (issue 19), cluster side, on the lab's real API server: with the GPU Operator's CRDs
served (a test fixture: tests/integration/fixtures/gpu_operator_crds.yaml) and a device plugin DaemonSet this project
did not deploy, the device plugin and DCGM exporter roles refuse before any change (check mode as well), naming each
object and the settings that let the user choose; a ClusterPolicy that switches the operator's components off is no
longer a reason; the take-over setting lets the role proceed. Everything the test created is deleted afterwards, and
what the take-over run deployed is removed again when the lab did not have it before."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from conftest import Lab, recap_changed, run_playbook, wait_for

FIXTURE = Path(__file__).parent / "fixtures" / "gpu_operator_crds.yaml"
LAB_INVENTORY = "inventories/lab/hosts.yml"
PLUGIN = ("-i", LAB_INVENTORY, "--tags", "nvidia_device_plugin")
EXPORTER = ("-i", LAB_INVENTORY, "--tags", "dcgm_exporter")
PLUGIN_NAMESPACE = "nvidia-device-plugin"
PLUGIN_NODE_LABEL = "nvidia.com/gpu.deploy.device-plugin"
FOREIGN = "nvidia-device-plugin-daemonset"


def crd_client(lab: Lab):
    from kubernetes import client

    return client.ApiextensionsV1Api(lab.api_client)


def custom(lab: Lab):
    from kubernetes import client

    return client.CustomObjectsApi(lab.api_client)


def served(lab: Lab, name: str) -> bool:
    from kubernetes.client.exceptions import ApiException

    try:
        crd = crd_client(lab).read_custom_resource_definition(name)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return any(c.type == "Established" and c.status == "True" for c in (crd.status.conditions or []))


def gone(lab: Lab, name: str) -> bool:
    from kubernetes.client.exceptions import ApiException

    try:
        crd_client(lab).read_custom_resource_definition(name)
    except ApiException as exc:
        return exc.status == 404
    return False


def namespace_exists(lab: Lab, name: str) -> bool:
    return any(ns.metadata.name == name for ns in lab.core.list_namespace().items)


@pytest.fixture(scope="module")
def operator_crds(lab: Lab) -> Iterator[list[str]]:
    """The fixture CRDs, served for the module's tests, then deleted (with any ClusterPolicy) and waited for."""
    documents = [doc for doc in yaml.safe_load_all(FIXTURE.read_text(encoding="utf-8")) if doc]
    names = [doc["metadata"]["name"] for doc in documents]
    assert not any(served(lab, name) for name in names), "the lab already serves the GPU Operator's CRDs"
    try:
        for doc in documents:
            crd_client(lab).create_custom_resource_definition(doc)
        for name in names:
            wait_for(lambda name=name: served(lab, name), 60, f"CRD {name} established")
        yield names
    finally:
        for name in names:
            if not gone(lab, name):
                crd_client(lab).delete_custom_resource_definition(name)
        for name in names:
            wait_for(lambda name=name: gone(lab, name), 60, f"CRD {name} deleted")


@pytest.fixture(scope="module")
def foreign_plugin(lab: Lab, operator_crds) -> Iterator[str]:
    """A device plugin DaemonSet as the GPU Operator deploys it (label app=nvidia-device-plugin-daemonset, the plugin's
    image), in a namespace of its own, on no node (its nodeSelector matches none): the roles must find it by its
    labels and image, in any namespace. Deleted with its namespace afterwards."""
    from conftest import TEST_LABEL, delete_test_namespaces

    name = "gpu-operator-it"
    lab.core.create_namespace({"metadata": {"name": name, "labels": {TEST_LABEL: "true"}}})
    try:
        labels = {"app": FOREIGN}
        lab.apps.create_namespaced_daemon_set(name, {
            "metadata": {"name": FOREIGN, "labels": labels},
            "spec": {"selector": {"matchLabels": labels}, "template": {
                "metadata": {"labels": labels},
                "spec": {"nodeSelector": {"gpu-lab.dev/no-such-node": "true"},
                         "containers": [{"name": "nvidia-device-plugin",
                                         "image": "nvcr.io/nvidia/k8s-device-plugin:v0.17.1"}]}}}})
        yield name
    finally:
        delete_test_namespaces(lab, [name])


@pytest.fixture(scope="module")
def plugin_state_before(lab: Lab) -> Iterator[bool]:
    """Whether the lab had this project's device plugin before; if not, what a take-over run deployed is removed."""
    had = namespace_exists(lab, PLUGIN_NAMESPACE)
    yield had
    if had:
        return
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    rbac = client.RbacAuthorizationV1Api(lab.api_client)
    for delete in (lambda: rbac.delete_cluster_role_binding("nvidia-device-plugin"),
                   lambda: rbac.delete_cluster_role("nvidia-device-plugin"),
                   lambda: lab.core.delete_namespace(PLUGIN_NAMESPACE)):
        try:
            delete()
        except ApiException as exc:
            if exc.status != 404:
                raise
    for node in lab.core.list_node(label_selector=PLUGIN_NODE_LABEL).items:
        lab.core.patch_node(node.metadata.name, {"metadata": {"labels": {PLUGIN_NODE_LABEL: None}}})
    wait_for(lambda: not namespace_exists(lab, PLUGIN_NAMESPACE), 120, f"namespace {PLUGIN_NAMESPACE} deleted")


def plugin_objects(lab: Lab) -> dict:
    """What the device plugin role owns, to show that a refused run changed none of it."""
    nodes = {n.metadata.name: (n.metadata.labels or {}).get(PLUGIN_NODE_LABEL) for n in lab.core.list_node().items}
    if not namespace_exists(lab, PLUGIN_NAMESPACE):
        return {"namespace": None, "nodes": nodes}
    return {"namespace": PLUGIN_NAMESPACE, "nodes": nodes,
            "daemonsets": {d.metadata.name: d.metadata.resource_version
                           for d in lab.apps.list_namespaced_daemon_set(PLUGIN_NAMESPACE).items}}


def test_the_device_plugin_role_refuses_naming_the_operator_and_the_foreign_plugin(
        lab: Lab, plugin_state_before, foreign_plugin):
    before = plugin_objects(lab)
    for check in ((), ("--check",)):
        rc, output = run_playbook(lab, "cluster.yml", *PLUGIN, *check)
        assert rc != 0, output[-3000:]
        assert f"DaemonSet {foreign_plugin}/{FOREIGN}" in output, output[-3000:]
        assert "label app=nvidia-device-plugin-daemonset" in output
        assert "CustomResourceDefinition clusterpolicies.nvidia.com" in output
        assert "CustomResourceDefinition nvidiadrivers.nvidia.com" in output
        assert "nvidia_device_plugin_enabled=false" in output and "nvidia_device_plugin_take_over=true" in output
        assert recap_changed(output) == 0
    assert plugin_objects(lab) == before


def test_the_exporter_role_refuses_on_the_operators_crds(lab: Lab, operator_crds):
    rc, output = run_playbook(lab, "cluster.yml", *EXPORTER, "--check")
    assert rc != 0, output[-3000:]
    assert "CustomResourceDefinition clusterpolicies.nvidia.com" in output
    assert "dcgm_exporter_enabled=false" in output and "dcgm_exporter_take_over=true" in output
    assert "spec.dcgmExporter.enabled=false" in output  # how to keep the operator and use this project's exporter
    assert recap_changed(output) == 0


def test_a_cluster_policy_counts_until_it_switches_the_component_off(lab: Lab, plugin_state_before, foreign_plugin):
    policies = ("nvidia.com", "v1", "clusterpolicies")
    custom(lab).create_cluster_custom_object(*policies, {
        "apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "metadata": {"name": "cluster-policy"},
        "spec": {"devicePlugin": {"enabled": True}, "dcgmExporter": {"enabled": False}}})
    try:
        rc, output = run_playbook(lab, "cluster.yml", *PLUGIN, "--check")
        assert rc != 0 and "ClusterPolicy cluster-policy (the GPU Operator deploys its NVIDIA device plugin" in output
        assert "spec.devicePlugin.enabled=false, spec.gfd.enabled=false in the ClusterPolicy" in output
        # The exporter is switched off in the operator: only the project's exporter would run, nothing to refuse.
        rc, output = run_playbook(lab, "cluster.yml", *EXPORTER, "--check")
        assert rc == 0 and "dcgm_exporter_take_over" not in output, output[-3000:]
        custom(lab).patch_cluster_custom_object(*policies, "cluster-policy", {
            "spec": {"devicePlugin": {"enabled": False}, "gfd": {"enabled": False}}})
        rc, output = run_playbook(lab, "cluster.yml", *PLUGIN, "--check")
        assert rc != 0, output[-3000:]  # the foreign DaemonSet is still there
        assert f"DaemonSet {foreign_plugin}/{FOREIGN}" in output
        assert "ClusterPolicy cluster-policy" not in output and "CustomResourceDefinition" not in output
    finally:
        custom(lab).delete_cluster_custom_object(*policies, "cluster-policy")


def test_the_take_over_setting_deploys_anyway_and_says_beside_what(lab: Lab, plugin_state_before, foreign_plugin):
    take_over = ("-e", json.dumps({"nvidia_device_plugin_take_over": True}))
    rc, output = run_playbook(lab, "cluster.yml", *PLUGIN, *take_over)
    assert rc == 0, output[-3000:]
    assert f"nvidia_device_plugin_take_over=true: deploying beside DaemonSet {foreign_plugin}/{FOREIGN}" in output
    assert lab.apps.read_namespaced_daemon_set("nvidia-device-plugin", PLUGIN_NAMESPACE).metadata.labels[
        "app.kubernetes.io/managed-by"] == "gpu-cluster"
    # The project's own DaemonSet is never taken for a foreign one: a re-run changes nothing.
    rc, output = run_playbook(lab, "cluster.yml", *PLUGIN, *take_over)
    assert rc == 0 and recap_changed(output) == 0, output[-3000:]
    # The foreign DaemonSet is left as it was.
    assert lab.apps.read_namespaced_daemon_set(FOREIGN, foreign_plugin).metadata.labels == {"app": FOREIGN}


def test_the_string_false_is_refused_as_a_take_over_value(lab: Lab, operator_crds):
    rc, output = run_playbook(lab, "cluster.yml", *PLUGIN, "-e", "nvidia_device_plugin_take_over=false", "--check")
    assert rc != 0
    assert 'nvidia_device_plugin_take_over="false" is not a boolean' in output, output[-3000:]
