"""roles/gpu_scheduling against the lab's real API server: the GPU nodes' labels, the nvidia RuntimeClass whose
scheduling rule the RuntimeClass admission plugin merges into pods, idempotence, and bad input refused first."""

from __future__ import annotations

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from conftest import Lab, recap_changed, run_playbook, wait_for

LAB_INVENTORY = "inventories/lab/hosts.yml"
SCHEDULING = ("-i", LAB_INVENTORY, "--tags", "gpu_scheduling_preflight,gpu_scheduling_apply")
POOLS = {"gpu-h100-0": "h100", "gpu-h100-1": "h100", "gpu-a100-0": "a100"}


def restricted_pod(name: str, runtime_class: str) -> dict:
    return {"metadata": {"name": name}, "spec": {
        "runtimeClassName": runtime_class,
        "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{"name": "main", "image": "registry.invalid/busybox:1", "securityContext": {
            "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}]}}


@pytest.fixture(scope="module")
def applied(lab: Lab):
    rc, output = run_playbook(lab, "cluster.yml", *SCHEDULING)
    assert rc == 0, output[-3000:]
    return output


def test_gpu_nodes_carry_their_pool_and_presence(lab: Lab, applied):
    for node in lab.core.list_node().items:
        labels = node.metadata.labels
        if node.metadata.name in POOLS:
            assert labels["nvidia.com/gpu.present"] == "true"
            assert labels["gpu-cluster.dev/pool"] == POOLS[node.metadata.name]
        else:
            assert "gpu-cluster.dev/pool" not in labels and "nvidia.com/gpu.present" not in labels


def test_the_runtime_class_sends_pods_to_gpu_nodes_only(lab: Lab, applied, namespace):
    runtime_class = client.NodeV1Api(lab.api_client).read_runtime_class("nvidia")
    assert runtime_class.handler == "nvidia"
    name = namespace({"pod-security.kubernetes.io/enforce": "restricted"})
    for index in range(4):
        lab.core.create_namespaced_pod(name, restricted_pod(f"rc-{index}", "nvidia"))

    def scheduled():
        pods = lab.core.list_namespaced_pod(name).items
        return pods if len(pods) == 4 and all(p.spec.node_name for p in pods) else None

    pods = wait_for(scheduled, 60, "the four pods to be scheduled")
    for pod in pods:
        # Merged in by the RuntimeClass admission plugin, not written by us.
        assert pod.spec.node_selector == {"nvidia.com/gpu.present": "true"}
        assert pod.spec.node_name in POOLS
        assert any(t.key == "nvidia.com/gpu" for t in pod.spec.tolerations)


def test_a_pod_naming_a_missing_runtime_class_is_refused(lab: Lab, applied, namespace):
    name = namespace()
    with pytest.raises(ApiException) as refused:
        lab.core.create_namespaced_pod(name, restricted_pod("no-runtime", "nvidia-missing"))
    assert refused.value.status == 403 and "nvidia-missing" in refused.value.body


def test_the_stack_pods_use_the_runtime_class(lab: Lab, applied):
    rc, output = run_playbook(lab, "cluster.yml", "-i", LAB_INVENTORY, "--tags", "nvidia_device_plugin,dcgm_exporter")
    assert rc == 0, output[-3000:]
    for namespace, name in (("nvidia-device-plugin", "nvidia-device-plugin"), ("gpu-monitoring", "dcgm-exporter")):
        template = lab.apps.read_namespaced_daemon_set(name, namespace).spec.template.spec
        assert template.runtime_class_name == "nvidia", name


def test_second_run_and_check_mode_change_nothing(lab: Lab, applied):
    for mode in ((), ("--check",)):
        rc, output = run_playbook(lab, "cluster.yml", *SCHEDULING, *mode)
        assert rc == 0 and recap_changed(output) == 0, output[-3000:]


def test_bad_input_is_refused_before_any_change(lab: Lab, applied):
    before = client.NodeV1Api(lab.api_client).read_runtime_class("nvidia").metadata.resource_version
    rc, output = run_playbook(lab, "cluster.yml", *SCHEDULING, "-e", "gpu_scheduling_runtime_handler=nv_rt",
                              "-e", '{"gpu_scheduling_extra_labels": {"gpu-cluster.dev/tier": 1}}')
    assert rc != 0, output[-3000:]
    assert "gpu_scheduling_runtime_handler='nv_rt'" in output and "gpu-cluster.dev/tier=1" in output
    assert client.NodeV1Api(lab.api_client).read_runtime_class("nvidia").metadata.resource_version == before
    assert all("gpu-cluster.dev/tier" not in n.metadata.labels for n in lab.core.list_node().items)
    rc, output = run_playbook(lab, "cluster.yml", *SCHEDULING, "-e", '{"gpu_scheduling_runtime_class": "false"}')
    assert rc != 0 and 'gpu_scheduling_runtime_class="false" is not a boolean (str)' in " ".join(output.split()), \
        output[-3000:]
    assert client.NodeV1Api(lab.api_client).read_runtime_class("nvidia").metadata.resource_version == before
