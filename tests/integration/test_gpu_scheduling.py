"""roles/gpu_scheduling against the lab's real API server: the GPU nodes' labels, the nvidia RuntimeClass whose
scheduling rule the RuntimeClass admission plugin merges into pods, the GPU bin-packing scheduler (the real
kube-scheduler with the role's configuration and identity) against the default scheduler, idempotence, and bad input
refused first."""

from __future__ import annotations

import collections
import json

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

import cluster
from conftest import (Lab, add_gpu_nodes, recap_changed, remove_binpack_scheduler, remove_nodes, run_playbook,
                      wait_for)

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


# --- GPU bin-packing ------------------------------------------------------------------------------------------------

BINPACK = (*SCHEDULING, "-e", '{"gpu_scheduling_binpack": true}')
PACK_NODES = [f"pack-{index}" for index in range(3)]
PACK_TAINT = {"key": "gpu-lab.dev/packing-test", "value": "true", "effect": "NoSchedule"}


def pack_pod(name: str, scheduler: str | None) -> dict:
    """One GPU and one CPU, held Running by the lab, only for the packing test's nodes."""
    spec = {"nodeSelector": {"gpu-lab.dev/packing-test": "true"},
            "tolerations": [{"key": PACK_TAINT["key"], "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{"name": "main", "image": "registry.invalid/cuda:1", "resources": {
                "requests": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"},
                "limits": {"nvidia.com/gpu": "1"}}}]}
    if scheduler:
        spec["schedulerName"] = scheduler
    return {"metadata": {"name": name, "annotations": {cluster.HOLD_RUNNING_ANNOTATION: "true"}}, "spec": spec}


def place(lab: Lab, namespace: str, prefix: str, count: int, scheduler: str | None) -> list[str]:
    """Create pods one after the other, each once the previous is bound: the node each landed on, in order."""
    nodes = []
    for index in range(count):
        name = f"{prefix}-{index}"
        lab.core.create_namespaced_pod(namespace, pack_pod(name, scheduler))
        pod = wait_for(lambda: lab.core.read_namespaced_pod(name, namespace).spec.node_name, 60,
                       f"{name} to be bound by {scheduler or 'default-scheduler'}")
        nodes.append(pod)
    return nodes


@pytest.fixture
def packing_nodes(lab: Lab):
    """Three simulated 8-GPU nodes only the packing test's pods tolerate."""
    add_gpu_nodes(lab, "pack", PACK_NODES, "gpu-lab.dev/packing-test", PACK_TAINT, cpu="32", memory="256Gi")
    yield PACK_NODES
    remove_nodes(lab, PACK_NODES)


@pytest.fixture
def binpack_removed_after(lab: Lab):
    """The role leaves what it applied when turned off; the test removes it, so no second scheduler runs on."""
    yield
    remove_binpack_scheduler(lab)


def test_the_binpack_scheduler_fills_one_node_before_the_next_where_the_default_spreads(
        lab: Lab, applied, namespace, packing_nodes, binpack_removed_after):
    rc, output = run_playbook(lab, "cluster.yml", *BINPACK)
    assert rc == 0, output[-3000:]
    applied_config = yaml.safe_load(lab.core.read_namespaced_config_map("gpu-binpack-config", "kube-system")
                                    .data["config.yaml"])
    profile = applied_config["profiles"][0]
    assert profile["schedulerName"] == "gpu-binpack"
    assert profile["pluginConfig"][0]["args"]["scoringStrategy"]["type"] == "MostAllocated"
    # The lab runs the real kube-scheduler with that ConfigMap, as the role's ServiceAccount: holding its lease proves
    # the role's RBAC lets it lead (system:kube-scheduler alone may renew only the lease named kube-scheduler).
    lease = wait_for(lambda: _lease_holder(lab, "gpu-binpack"), 90, "the gpu-binpack scheduler to hold its lease")
    assert lease
    deployment = lab.apps.read_namespaced_deployment("gpu-binpack", "kube-system")
    assert deployment.spec.template.spec.containers[0].image.startswith("registry.k8s.io/kube-scheduler:v1.")

    name = namespace()
    # The default scheduler does not score nvidia.com/gpu; it spreads by CPU and memory: one pod per node in turn.
    spread = place(lab, name, "default", 6, None)
    assert sorted(collections.Counter(spread).values()) == [2, 2, 2], spread
    for index in range(6):
        lab.core.delete_namespaced_pod(f"default-{index}", name, grace_period_seconds=0)
    wait_for(lambda: not lab.core.list_namespaced_pod(name).items, 60, "the default scheduler's pods to be gone")
    # The bin-packing profile fills the fullest node that fits: eight on one node, then the next.
    packed = place(lab, name, "packed", 10, "gpu-binpack")
    assert len(set(packed[:8])) == 1 and packed[8] == packed[9] and packed[8] != packed[0], packed

    def reporters():
        events = [e for e in lab.core.list_namespaced_event(name, field_selector="reason=Scheduled").items
                  if e.involved_object.name.startswith("packed-")]
        return {e.reporting_component or (e.source.component if e.source else None) for e in events} \
            if len(events) == 10 else None

    assert wait_for(reporters, 60, "the Scheduled events of the ten packed pods") == {"gpu-binpack"}

    for mode in ((), ("--check",)):
        rc, output = run_playbook(lab, "cluster.yml", *BINPACK, *mode)
        assert rc == 0 and recap_changed(output) == 0, output[-3000:]


def _lease_holder(lab: Lab, name: str) -> str | None:
    try:
        lease = client.CoordinationV1Api(lab.api_client).read_namespaced_lease(name, "kube-system")
    except ApiException as error:
        if error.status == 404:
            return None
        raise
    return lease.spec.holder_identity


def test_bad_binpack_settings_are_refused_before_any_change(lab: Lab, applied):
    # A strategy outside the choices: the role's argument spec refuses it, naming the input, its value and the choices.
    settings = {"gpu_scheduling_binpack": True, "gpu_scheduling_binpack_strategy": "LeastAllocated",
                "gpu_scheduling_binpack_scheduler_name": "binpack-2"}
    rc, output = run_playbook(lab, "cluster.yml", *SCHEDULING, "-e", json.dumps(settings))
    assert rc != 0, output[-3000:]
    assert ("value of gpu_scheduling_binpack_strategy must be one of: MostAllocated, RequestedToCapacityRatio, got: "
            "LeastAllocated") in " ".join(output.split()), output[-3000:]
    # What the spec cannot say (weights, names, a GPU resource among them): the preflight, each by its path.
    settings = {"gpu_scheduling_binpack": True, "gpu_scheduling_binpack_scheduler_name": "binpack-2",
                "gpu_scheduling_binpack_resources": [{"name": "nvidia.com/gpu", "weight": 0}, {"name": "GPU!"}]}
    rc, output = run_playbook(lab, "cluster.yml", *SCHEDULING, "-e", json.dumps(settings))
    text = " ".join(output.split())
    assert rc != 0, output[-3000:]
    assert "gpu_scheduling_binpack_resources[0].weight=0; allowed: an integer 1-100" in text, output[-3000:]
    assert "gpu_scheduling_binpack_resources[1].name='GPU!'" in text, output[-3000:]
    with pytest.raises(ApiException) as absent:
        lab.apps.read_namespaced_deployment("binpack-2", "kube-system")
    assert absent.value.status == 404


def test_the_profile_mode_writes_the_schedulers_configuration_for_kubeadm(lab: Lab, applied, tmp_path):
    config_path = tmp_path / "gpu-scheduler-config.yaml"
    profile = (*BINPACK, "-e", "gpu_scheduling_binpack_mode=profile", "-e", f"gpu_scheduling_binpack_config_path={config_path}")
    rc, output = run_playbook(lab, "cluster.yml", *profile, "--check")
    assert rc == 0 and recap_changed(output) == 1 and not config_path.exists(), output[-3000:]
    rc, output = run_playbook(lab, "cluster.yml", *profile)
    assert rc == 0 and recap_changed(output) == 1, output[-3000:]
    written = yaml.safe_load(config_path.read_text(encoding="utf-8"))
    assert written["clientConnection"] == {"kubeconfig": "/etc/kubernetes/scheduler.conf"}
    assert [p["schedulerName"] for p in written["profiles"]] == ["default-scheduler", "gpu-binpack"]
    # Nothing in the cluster: the user's own kube-scheduler reads the file.
    with pytest.raises(ApiException) as absent:
        lab.core.read_namespaced_config_map("gpu-binpack-config", "kube-system")
    assert absent.value.status == 404
    rc, output = run_playbook(lab, "cluster.yml", *profile)
    assert rc == 0 and recap_changed(output) == 0, output[-3000:]
