"""What only a real control plane can decide: kube-scheduler's GPU accounting, Pod Security admission, quota,
the DaemonSet controller, and the lab's lifecycle. Pods run on kwok's simulated nodes (no containers start)."""

from __future__ import annotations

import json

import pytest
from kubernetes.client.exceptions import ApiException

from conftest import Lab, wait_for

GPU = "nvidia.com/gpu"
PAUSE = "registry.k8s.io/pause:3.10"


def pod(name: str, gpus: int = 0, *, privileged: bool = False, node_selector: dict | None = None) -> dict:
    """A pod that passes the `restricted` profile unless privileged is asked for."""
    container = {
        "name": "main", "image": PAUSE,
        "securityContext": {"allowPrivilegeEscalation": False, "runAsNonRoot": True, "runAsUser": 65532,
                            "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}},
    }
    if privileged:
        container["securityContext"] = {"privileged": True}
    if gpus:
        container["resources"] = {"limits": {GPU: str(gpus)}}
    spec = {"containers": [container], "terminationGracePeriodSeconds": 0}
    if node_selector:
        spec["nodeSelector"] = node_selector
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def pod_template(manifest: dict, labels: dict) -> dict:
    """A pod manifest as a controller's template (no apiVersion/kind; the client validates that)."""
    return {"metadata": {"labels": labels}, "spec": manifest["spec"]}


def node_of(lab: Lab, namespace: str, name: str) -> str | None:
    return lab.core.read_namespaced_pod(name, namespace).spec.node_name


def events_for(lab: Lab, namespace: str, name: str) -> list[str]:
    items = lab.core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}").items
    return [f"{event.reason}: {event.message}" for event in items]


def free_gpus(lab: Lab) -> dict[str, int]:
    nodes = {n.metadata.name: int((n.status.allocatable or {}).get(GPU, 0)) for n in lab.core.list_node().items}
    for item in lab.core.list_pod_for_all_namespaces(field_selector="status.phase!=Succeeded").items:
        if item.spec.node_name in nodes and item.status.phase != "Failed":
            for container in item.spec.containers:
                nodes[item.spec.node_name] -= int(((container.resources and container.resources.limits) or {})
                                                  .get(GPU, 0))
    return nodes


def test_lab_nodes_advertise_their_pools_gpus(lab: Lab):
    allocatable = {n.metadata.name: (n.status.allocatable or {}) for n in lab.core.list_node().items}
    for name, pool in lab.config.nodes():
        expected = str(pool.gpu.count) if pool.gpu else None
        assert allocatable[name].get(GPU) == expected, (name, allocatable[name])


def test_scheduler_binds_a_4_gpu_pod_only_where_4_gpus_are_free(lab: Lab, namespace):
    ns = namespace()
    # Fill every H100 node so that only the 4-GPU A100 node can take the pod.
    for index, name in enumerate(lab.config.pool_of("gpu-h100-0").node_names()):
        lab.core.create_namespaced_pod(ns, pod(f"fill-{index}", 8, node_selector={"kubernetes.io/hostname": name}))
    wait_for(lambda: all(node_of(lab, ns, f"fill-{i}") for i in range(2)), 60, "the filler pods to be bound")
    lab.core.create_namespaced_pod(ns, pod("four", 4))
    bound = wait_for(lambda: node_of(lab, ns, "four"), 60, "the 4-GPU pod to be bound")
    assert bound == "gpu-a100-0"
    assert free_gpus(lab)["gpu-a100-0"] == 0


def test_a_pod_asking_more_gpus_than_any_node_has_free_stays_pending(lab: Lab, namespace):
    ns = namespace()
    lab.core.create_namespaced_pod(ns, pod("too-big", 16))
    message = wait_for(lambda: next((e for e in events_for(lab, ns, "too-big") if "FailedScheduling" in e), None),
                       60, "a FailedScheduling event")
    assert "Insufficient nvidia.com/gpu" in message
    current = lab.core.read_namespaced_pod("too-big", ns)
    assert current.spec.node_name is None and current.status.phase == "Pending"


def test_restricted_namespace_rejects_a_privileged_pod_and_admits_a_compliant_one(lab: Lab, namespace):
    ns = namespace({"pod-security.kubernetes.io/enforce": "restricted",
                    "pod-security.kubernetes.io/enforce-version": "latest"})
    with pytest.raises(ApiException) as rejected:
        lab.core.create_namespaced_pod(ns, pod("privileged", privileged=True))
    assert rejected.value.status == 403
    message = json.loads(rejected.value.body)["message"]
    assert 'violates PodSecurity "restricted:latest"' in message and "privileged" in message
    lab.core.create_namespaced_pod(ns, pod("compliant", 1))


def test_gpu_quota_rejects_a_pod_over_it(lab: Lab, namespace):
    ns = namespace()
    lab.core.create_namespaced_resource_quota(ns, {"metadata": {"name": "gpus"},
                                                   "spec": {"hard": {f"requests.{GPU}": "2"}}})
    wait_for(lambda: lab.core.read_namespaced_resource_quota("gpus", ns).status.hard, 30, "the quota's status")
    with pytest.raises(ApiException) as rejected:
        lab.core.create_namespaced_pod(ns, pod("over", 4))
    assert rejected.value.status == 403 and "exceeded quota: gpus" in json.loads(rejected.value.body)["message"]
    lab.core.create_namespaced_pod(ns, pod("within", 2))


def test_gpu_daemonset_gets_pods_on_exactly_the_gpu_nodes(lab: Lab, namespace):
    ns = namespace()
    labels = {"app": "gpu-agent"}
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}]}]}}}
    template = pod_template(pod("agent"), labels)
    template["spec"]["affinity"] = affinity
    template["spec"]["tolerations"] = [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}]
    lab.apps.create_namespaced_daemon_set(ns, {"metadata": {"name": "gpu-agent"}, "spec": {
        "selector": {"matchLabels": labels}, "template": template}})

    def ready():
        status = lab.apps.read_namespaced_daemon_set_status("gpu-agent", ns).status
        return status.desired_number_scheduled and status.number_ready == status.desired_number_scheduled

    wait_for(ready, 90, "the DaemonSet's pods to be Ready")
    placed = sorted(p.spec.node_name for p in lab.core.list_namespaced_pod(ns, label_selector="app=gpu-agent").items)
    assert placed == sorted(lab.config.gpu_nodes())


def test_a_one_gpu_job_completes_on_a_gpu_node(lab: Lab, namespace):
    ns = namespace()
    template = pod_template(pod("smoke", 1), {"job": "smoke"})
    template["spec"]["restartPolicy"] = "Never"
    lab.batch.create_namespaced_job(ns, {"metadata": {"name": "smoke"}, "spec": {
        "backoffLimit": 0, "template": template}})
    wait_for(lambda: (lab.batch.read_namespaced_job_status("smoke", ns).status.succeeded or 0) == 1, 90,
             "the Job to succeed")
    (placed,) = [p.spec.node_name for p in lab.core.list_namespaced_pod(ns, label_selector="job=smoke").items]
    assert placed in lab.config.gpu_nodes()


def test_device_plugin_double_follows_the_sharing_config_a_node_label_picks(lab: Lab):
    """The lab's GPU double, not a real plugin: it must still react the way the plugin's config-manager does."""
    double = lab.config.device_plugin_double
    created_namespace = double.namespace not in {ns.metadata.name for ns in lab.core.list_namespace().items}
    if created_namespace:
        lab.core.create_namespace({"metadata": {"name": double.namespace}})
    time_sliced = "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 4\n"
    existing = {cm.metadata.name for cm in lab.core.list_namespaced_config_map(double.namespace).items}
    created_config_map = double.config_map not in existing
    if created_config_map:
        lab.core.create_namespaced_config_map(double.namespace, {"metadata": {"name": double.config_map},
                                                                 "data": {"it-time-sliced": time_sliced}})
    else:  # the device plugin role's ConfigMap (an earlier test deployed it): add a key, remove it afterwards
        lab.core.patch_namespaced_config_map(double.config_map, double.namespace,
                                             {"data": {"it-time-sliced": time_sliced}})
    node = "gpu-a100-0"

    def advertised() -> tuple[str | None, str | None]:
        current = lab.core.read_node(node)
        return (current.status.allocatable or {}).get(GPU), (current.metadata.labels or {}).get("nvidia.com/gpu.replicas")

    try:
        lab.core.patch_node(node, {"metadata": {"labels": {"nvidia.com/device-plugin.config": "it-time-sliced"}}})
        wait_for(lambda: advertised() == ("16", "4"), 30, "4 GPUs x 4 replicas advertised on gpu-a100-0")
    finally:
        lab.core.patch_node(node, {"metadata": {"labels": {"nvidia.com/device-plugin.config": None}}})
        if created_config_map:
            lab.core.delete_namespaced_config_map(double.config_map, double.namespace)
        else:
            lab.core.patch_namespaced_config_map(double.config_map, double.namespace,
                                                 {"data": {"it-time-sliced": None}})
        if created_namespace:
            lab.core.delete_namespace(double.namespace)
    wait_for(lambda: advertised() == ("4", "1"), 30, "gpu-a100-0 back to 4 whole GPUs")
