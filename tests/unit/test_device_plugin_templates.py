"""The device plugin role's two DaemonSets as rendered: the MPS root the plugin is given, and the MPS control daemon
laid out as NVIDIA's Helm chart runs it (docs/device_plugin.md, MPS) with privilege only where the chart needs it."""

from __future__ import annotations

from typing import Any, Dict

import yaml

from conftest import render_role_template

ROLE = "nvidia_device_plugin"
PRIVILEGED = {"mps-control-daemon-mounts", "mps-control-daemon"}
LEAST_PRIVILEGE = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def render(template: str, **overrides: Any) -> Dict[str, Any]:
    return yaml.safe_load(render_role_template(ROLE, template, **overrides))


def containers(daemonset: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    spec = daemonset["spec"]["template"]["spec"]
    return {c["name"]: c for c in spec.get("initContainers", []) + spec["containers"]}


def env(container: Dict[str, Any]) -> Dict[str, Any]:
    return {item["name"]: item.get("value", item.get("valueFrom")) for item in container["env"]}


def host_paths(daemonset: Dict[str, Any]) -> Dict[str, str]:
    return {v["name"]: v["hostPath"]["path"] for v in daemonset["spec"]["template"]["spec"]["volumes"] if "hostPath" in v}


def test_the_plugin_gets_the_mps_root_from_the_role_input():
    plugin_ds = render("daemonset.yaml.j2", nvidia_device_plugin_mps_root="/srv/mps")
    plugin = containers(plugin_ds)["nvidia-device-plugin"]
    assert env(plugin)["MPS_ROOT"] == "/srv/mps"
    assert {m["mountPath"]: m["name"] for m in plugin["volumeMounts"]}.items() >= {
        "/mps": "mps-root", "/dev/shm": "mps-shm"}.items()
    assert host_paths(plugin_ds).items() >= {"mps-root": "/srv/mps", "mps-shm": "/srv/mps/shm"}.items()
    assert plugin["securityContext"] == LEAST_PRIVILEGE


def test_the_mps_daemon_shares_the_plugins_config_selection_and_root():
    plugin_ds, daemon_ds = render("daemonset.yaml.j2"), render("mps-control-daemon.yaml.j2")
    plugin_pod, daemon_pod = containers(plugin_ds), containers(daemon_ds)
    for name in ("config-manager-init", "config-manager"):
        mine, theirs = env(daemon_pod[name]), env(plugin_pod[name])
        assert {k: v for k, v in mine.items() if k != "PROCESS_TO_SIGNAL"} == \
            {k: v for k, v in theirs.items() if k != "PROCESS_TO_SIGNAL"}
    # The config-manager signals the process whose argv[0] is exactly this: the daemon's command.
    assert env(daemon_pod["config-manager"])["PROCESS_TO_SIGNAL"] == daemon_pod["mps-control-daemon"]["command"][0]
    assert daemon_pod["mps-control-daemon-mounts"]["command"] == ["mps-control-daemon", "mount-shm"]
    assert env(daemon_pod["mps-control-daemon"])["CONFIG_FILE"] == env(plugin_pod["nvidia-device-plugin"])["CONFIG_FILE"]
    assert host_paths(daemon_ds) == {"mps-root": "/run/nvidia/mps", "mps-shm": "/run/nvidia/mps/shm"}
    volumes = {v["name"]: v for v in daemon_ds["spec"]["template"]["spec"]["volumes"]}
    assert volumes["available-configs"] == {"name": "available-configs",
                                            "configMap": {"name": "nvidia-device-plugin-configs"}}
    key = "gpu-cluster/config-checksum"
    assert daemon_ds["spec"]["template"]["metadata"]["annotations"][key] == \
        plugin_ds["spec"]["template"]["metadata"]["annotations"][key]
    assert daemon_pod["mps-control-daemon"]["image"] == plugin_pod["nvidia-device-plugin"]["image"]


def test_privilege_only_where_the_mps_daemon_needs_it():
    plugin_ds, daemon_ds = render("daemonset.yaml.j2"), render("mps-control-daemon.yaml.j2")
    for name, container in {**containers(plugin_ds), **containers(daemon_ds)}.items():
        expected = {"privileged": True} if name in PRIVILEGED else LEAST_PRIVILEGE
        assert container["securityContext"] == expected, name
    mounts = containers(daemon_ds)["mps-control-daemon-mounts"]["volumeMounts"]
    assert mounts == [{"name": "mps-root", "mountPath": "/mps", "mountPropagation": "Bidirectional"}]
    assert daemon_ds["spec"]["template"]["spec"]["hostPID"] is True
    assert "hostPID" not in plugin_ds["spec"]["template"]["spec"]


def test_the_mps_daemon_runs_only_where_the_role_labels_an_mps_config():
    daemon_ds = render("mps-control-daemon.yaml.j2")
    terms = daemon_ds["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [
        {"key": "nvidia.com/gpu.deploy.device-plugin", "operator": "In", "values": ["true"]},
        {"key": "nvidia.com/gpu.deploy.mps-control-daemon", "operator": "In", "values": ["true"]},
        {"key": "nvidia.com/gpu.deploy.dra-driver", "operator": "NotIn", "values": ["true"]}]}]
