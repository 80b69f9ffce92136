"""roles/nvidia_device_plugin against the lab's real API server: server-side validation of every object, the
DaemonSet on exactly the GPU nodes (kwok), idempotence, check mode, a per-node sharing config taking effect (through
the lab's device-plugin double) with validation agreeing, and bad input refused before any change."""

from __future__ import annotations

import json

import pytest

from conftest import Lab, recap_changed, run_playbook, wait_for

NAMESPACE = "nvidia-device-plugin"
LAB_INVENTORY = "inventories/lab/hosts.yml"
# This role's tasks only: the whole cluster.yml's idempotence is test_main_job's (a check run right after site.yml).
PLUGIN = ("-i", LAB_INVENTORY, "--tags", "nvidia_device_plugin")


def pool_inventory(tmp_path, config: str) -> str:
    """A second inventory source that gives gpu-a100-0 a sharing config, as a pool's group_vars would."""
    path = tmp_path / "a100-shared.yml"
    path.write_text(f"all:\n  children:\n    gpu_nodes:\n      hosts:\n        gpu-a100-0:\n"
                    f"          nvidia_device_plugin_config: {config}\n")
    return str(path)


def allocatable(lab: Lab, node: str) -> str | None:
    return (lab.core.read_node(node).status.allocatable or {}).get("nvidia.com/gpu")


def config_map_version(lab: Lab) -> str:
    return lab.core.read_namespaced_config_map("nvidia-device-plugin-configs", NAMESPACE).metadata.resource_version


@pytest.fixture(scope="module")
def deployed(lab: Lab):
    rc, output = run_playbook(lab, "cluster.yml", "-i", LAB_INVENTORY)
    assert rc == 0, output[-3000:]
    yield output
    rc, output = run_playbook(lab, "cluster.yml", *PLUGIN)  # back to the lab's defaults
    assert rc == 0, output[-3000:]


def test_daemonset_runs_on_exactly_the_gpu_nodes(lab: Lab, deployed):
    def ready():
        status = lab.apps.read_namespaced_daemon_set_status("nvidia-device-plugin", NAMESPACE).status
        return status.desired_number_scheduled and status.number_ready == status.desired_number_scheduled

    wait_for(ready, 90, "the device plugin pods to be Ready")
    pods = lab.core.list_namespaced_pod(NAMESPACE, label_selector="app.kubernetes.io/name=nvidia-device-plugin")
    assert sorted(p.spec.node_name for p in pods.items) == sorted(lab.config.gpu_nodes())
    pod = pods.items[0]
    assert pod.spec.priority_class_name == "system-node-critical"
    assert all(c.security_context.allow_privilege_escalation is False for c in pod.spec.containers)
    for name in lab.config.gpu_nodes():
        assert lab.core.read_node(name).metadata.labels["nvidia.com/gpu.deploy.device-plugin"] == "true"
    assert "nvidia.com/gpu.deploy.device-plugin" not in (lab.core.read_node("cpu-0").metadata.labels or {})


def test_a_second_run_and_check_mode_change_nothing(lab: Lab, deployed):
    rc, output = run_playbook(lab, "cluster.yml", *PLUGIN)
    assert rc == 0 and recap_changed(output) == 0, output[-3000:]
    rc, output = run_playbook(lab, "cluster.yml", *PLUGIN, "--check")
    assert rc == 0 and recap_changed(output) == 0, output[-3000:]


def test_a_pools_sharing_config_takes_effect_and_validation_agrees(lab: Lab, deployed, tmp_path):
    shared = pool_inventory(tmp_path, "time-sliced")
    before = config_map_version(lab)
    rc, output = run_playbook(lab, "cluster.yml", *PLUGIN, "-i", shared, "--check")
    assert rc == 0 and recap_changed(output) == 1, output[-3000:]  # predicted: the node label only
    rc, output = run_playbook(lab, "cluster.yml", *PLUGIN, "-i", shared)
    assert rc == 0, output[-3000:]
    # Only the node whose pool chose a config gets the label (k8s_node_labels patches only nodes that differ).
    config_label = "nvidia.com/device-plugin.config"
    assert lab.core.read_node("gpu-a100-0").metadata.labels.get(config_label) == "time-sliced"
    assert config_label not in (lab.core.read_node("gpu-h100-0").metadata.labels or {})
    assert config_map_version(lab) == before  # nothing else depends on a node's choice
    wait_for(lambda: allocatable(lab, "gpu-a100-0") == "16", 30, "4 GPUs x 4 replicas on gpu-a100-0")
    report_dir = tmp_path / "reports"
    rc, output = run_playbook(lab, "validate.yml", "-i", LAB_INVENTORY, "-i", shared, "--limit", "cluster_control",
                              "-e", f"gpu_validation_report_dir={report_dir}")
    assert rc == 0, output[-3000:]
    node = json.loads((report_dir / "validation.json").read_text())["cluster"]["nodes"]["gpu-a100-0"]
    assert node["expected"] == {"nvidia.com/gpu": 16} and node["sharing_config"] == "time-sliced"


def test_changing_a_config_rolls_the_plugin_and_touches_nothing_else(lab: Lab, deployed):
    configs = {"default": {"version": "v1", "flags": {"migStrategy": "none"}},
               "time-sliced": {"version": "v1", "sharing": {"timeSlicing": {"resources": [
                   {"name": "nvidia.com/gpu", "replicas": 2}]}}}}
    template_before = lab.apps.read_namespaced_daemon_set("nvidia-device-plugin", NAMESPACE).spec.template
    h100_labels = lab.core.read_node("gpu-h100-0").metadata.labels

    def versions() -> dict[str, str]:
        return {"Namespace": lab.core.read_namespace(NAMESPACE).metadata.resource_version,
                "ConfigMap": lab.core.read_namespaced_config_map("nvidia-device-plugin-configs",
                                                                 NAMESPACE).metadata.resource_version,
                "DaemonSet": lab.apps.read_namespaced_daemon_set("nvidia-device-plugin",
                                                                 NAMESPACE).metadata.resource_version}

    before = versions()
    rc, output = run_playbook(lab, "cluster.yml", *PLUGIN, "-e", json.dumps({"nvidia_device_plugin_configs": configs}))
    assert rc == 0, output[-3000:]
    after = versions()
    assert {kind for kind in before if before[kind] != after[kind]} == {"ConfigMap", "DaemonSet"}
    # A config's content is not a node's choice of config: a node that chose none keeps its labels as they were.
    assert lab.core.read_node("gpu-h100-0").metadata.labels == h100_labels
    template_after = lab.apps.read_namespaced_daemon_set("nvidia-device-plugin", NAMESPACE).spec.template
    key = "gpu-cluster/config-checksum"
    assert template_after.metadata.annotations[key] != template_before.metadata.annotations[key]


@pytest.mark.parametrize(("configs", "message"), [
    ({"default": {"version": "v1", "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu",
                                                                             "replicas": 0}]}}}},
     "config 'default': sharing.timeSlicing.resources[0].replicas=0; allowed: an integer of at least 2"),
    ({"default": {"version": "v1", "flags": {"migStrategy": "mixed"}, "sharing": {"mps": {"resources": [
        {"name": "nvidia.com/gpu", "replicas": 2}]}}}}, "sharing.mps with flags.migStrategy='mixed'"),
    ({"default": {"version": "v1", "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]},
                                               "mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}}}},
     "sharing.timeSlicing and sharing.mps are both set"),
    ({"shared": {"version": "v1"}}, "nvidia_device_plugin_default_config='default' names no config"),
])
def test_bad_sharing_input_fails_before_any_change(lab: Lab, deployed, configs, message):
    before = config_map_version(lab)
    rc, output = run_playbook(lab, "cluster.yml", *PLUGIN, "-e", json.dumps({"nvidia_device_plugin_configs": configs}))
    assert rc != 0 and message in output, output[-3000:]
    assert config_map_version(lab) == before


def test_a_node_naming_a_missing_config_fails_before_any_change(lab: Lab, deployed, tmp_path):
    rc, output = run_playbook(lab, "cluster.yml", "-i", LAB_INVENTORY, "-i", pool_inventory(tmp_path, "nope"))
    assert rc != 0 and "gpu-a100-0: nvidia_device_plugin_config='nope' names no config" in output, output[-3000:]
    assert "nvidia.com/device-plugin.config" not in (lab.core.read_node("gpu-a100-0").metadata.labels or {})
