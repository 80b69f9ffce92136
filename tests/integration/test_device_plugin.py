"""roles/nvidia_device_plugin against the lab's real API server: server-side validation of every object, the
DaemonSet on exactly the GPU nodes (kwok), idempotence, check mode, a per-node sharing config taking effect (through
the lab's device-plugin double) with validation agreeing, an MPS config (the GPU Operator docs' own, unchanged)
running NVIDIA's MPS control daemon on exactly the nodes that chose it, and bad input refused before any change."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from conftest import Lab, recap_changed, run_playbook, wait_for

NAMESPACE = "nvidia-device-plugin"
MPS_DAEMON = "nvidia-device-plugin-mps-control-daemon"
MPS_LABEL = "nvidia.com/gpu.deploy.mps-control-daemon"
ROOT = Path(__file__).resolve().parents[2]
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
    plugin = next(c for c in pod.spec.containers if c.name == "nvidia-device-plugin")
    assert {e.name: e.value for e in plugin.env}["MPS_ROOT"] == "/run/nvidia/mps"
    # No node's config shares by MPS: the MPS control daemon runs nowhere.
    assert lab.apps.read_namespaced_daemon_set_status(MPS_DAEMON, NAMESPACE).status.desired_number_scheduled == 0
    assert not any(MPS_LABEL in (lab.core.read_node(n).metadata.labels or {}) for n in lab.config.gpu_nodes())


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
                                                                 NAMESPACE).metadata.resource_version,
                "MPS DaemonSet": lab.apps.read_namespaced_daemon_set(MPS_DAEMON, NAMESPACE).metadata.resource_version}

    before = versions()
    rc, output = run_playbook(lab, "cluster.yml", *PLUGIN, "-e", json.dumps({"nvidia_device_plugin_configs": configs}))
    assert rc == 0, output[-3000:]
    after = versions()
    # The MPS control daemon reads the same configs (replicas set its memory and thread shares): it rolls with them.
    assert {kind for kind in before if before[kind] != after[kind]} == {"ConfigMap", "DaemonSet", "MPS DaemonSet"}
    # A config's content is not a node's choice of config: a node that chose none keeps its labels as they were.
    assert lab.core.read_node("gpu-h100-0").metadata.labels == h100_labels
    template_after = lab.apps.read_namespaced_daemon_set("nvidia-device-plugin", NAMESPACE).spec.template
    key = "gpu-cluster/config-checksum"
    assert template_after.metadata.annotations[key] != template_before.metadata.annotations[key]


def gpu_operator_mps_config() -> dict:
    """The GPU Operator docs' mps-config-all (`mps-any`), as published (the unit tests' fixture, with its source)."""
    docs = yaml.safe_load((ROOT / "tests" / "unit" / "fixtures" / "device_plugin" / "gpu_operator_docs.yaml").read_text())
    return yaml.safe_load(docs["mps-config-all.yaml"]["mps-any"])


def test_an_mps_config_runs_the_mps_daemon_on_exactly_its_nodes(lab: Lab, deployed, tmp_path):
    lab_configs = yaml.safe_load((ROOT / "inventories" / "lab" / "group_vars" / "cluster_control" / "device_plugin.yml")
                                 .read_text())["nvidia_device_plugin_configs"]
    extra = ("-e", json.dumps({"nvidia_device_plugin_configs": {**lab_configs, "mps-any": gpu_operator_mps_config()}}))
    chosen = pool_inventory(tmp_path, "mps-any")
    # Check mode predicts (the ConfigMap, both DaemonSets' checksum, the node's labels) and changes nothing.
    rc, output = run_playbook(lab, "cluster.yml", *PLUGIN, "-i", chosen, *extra, "--check")
    assert rc == 0 and recap_changed(output) >= 2, output[-3000:]
    assert MPS_LABEL not in (lab.core.read_node("gpu-a100-0").metadata.labels or {})
    rc, output = run_playbook(lab, "cluster.yml", *PLUGIN, "-i", chosen, *extra)
    assert rc == 0, output[-3000:]
    try:
        gpu_nodes = lab.config.gpu_nodes()
        assert {n: (lab.core.read_node(n).metadata.labels or {}).get(MPS_LABEL) for n in gpu_nodes} == {
            n: ("true" if n == "gpu-a100-0" else None) for n in gpu_nodes}

        def daemon_ready():
            status = lab.apps.read_namespaced_daemon_set_status(MPS_DAEMON, NAMESPACE).status
            return status.desired_number_scheduled == 1 and status.number_ready == 1

        wait_for(daemon_ready, 90, "the MPS control daemon Ready on gpu-a100-0 only")
        pods = lab.core.list_namespaced_pod(NAMESPACE, label_selector=f"app.kubernetes.io/name={MPS_DAEMON}").items
        assert [p.spec.node_name for p in pods] == ["gpu-a100-0"]
        spec = pods[0].spec
        assert spec.host_pid is True
        daemon = next(c for c in spec.containers if c.name == "mps-control-daemon")
        assert daemon.command == ["mps-control-daemon"] and daemon.security_context.privileged is True
        sidecar = next(c for c in spec.containers if c.name == "config-manager")
        assert sidecar.security_context.allow_privilege_escalation is False
        assert {e.name: e.value for e in sidecar.env}["PROCESS_TO_SIGNAL"] == "mps-control-daemon"
        mounts = next(c for c in spec.init_containers if c.name == "mps-control-daemon-mounts").volume_mounts
        assert [m.mount_propagation for m in mounts if m.mount_path == "/mps"] == ["Bidirectional"]
        # The lab's device-plugin double advertises what the plugin would: 4 GPUs x 4 MPS replicas.
        wait_for(lambda: allocatable(lab, "gpu-a100-0") == "16", 30, "4 GPUs x 4 MPS replicas on gpu-a100-0")
        rc, output = run_playbook(lab, "cluster.yml", *PLUGIN, "-i", chosen, *extra)
        assert rc == 0 and recap_changed(output) == 0, output[-3000:]
    finally:
        rc, output = run_playbook(lab, "cluster.yml", *PLUGIN)  # back to the lab's defaults
        assert rc == 0, output[-3000:]
    # The node's choice gone, its MPS label goes, and the daemon with it.
    assert MPS_LABEL not in (lab.core.read_node("gpu-a100-0").metadata.labels or {})
    wait_for(lambda: not lab.core.list_namespaced_pod(
        NAMESPACE, label_selector=f"app.kubernetes.io/name={MPS_DAEMON}").items, 60, "the MPS control daemon gone")


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
    ({"default": {"version": "v1", "flags": {"mpsRoot": "/var/lib/mps"}, "sharing": {"mps": {"resources": [
        {"name": "nvidia.com/gpu", "replicas": 2}]}}}},
     "config 'default': flags.mpsRoot='/var/lib/mps'; allowed: unset, or '/run/nvidia/mps' (project rule"),
])
def test_bad_sharing_input_fails_before_any_change(lab: Lab, deployed, configs, message):
    before = config_map_version(lab)
    rc, output = run_playbook(lab, "cluster.yml", *PLUGIN, "-e", json.dumps({"nvidia_device_plugin_configs": configs}))
    assert rc != 0 and message in output, output[-3000:]
    assert config_map_version(lab) == before


def test_a_relative_mps_root_fails_before_any_change(lab: Lab, deployed):
    before = config_map_version(lab)
    rc, output = run_playbook(lab, "cluster.yml", *PLUGIN, "-e", "nvidia_device_plugin_mps_root=run/mps")
    assert rc != 0 and 'nvidia_device_plugin_mps_root="run/mps" is not an absolute path' in output, output[-3000:]
    assert config_map_version(lab) == before


def test_a_node_naming_a_missing_config_fails_before_any_change(lab: Lab, deployed, tmp_path):
    rc, output = run_playbook(lab, "cluster.yml", "-i", LAB_INVENTORY, "-i", pool_inventory(tmp_path, "nope"))
    assert rc != 0 and "gpu-a100-0: nvidia_device_plugin_config='nope' names no config" in output, output[-3000:]
    assert "nvidia.com/device-plugin.config" not in (lab.core.read_node("gpu-a100-0").metadata.labels or {})
