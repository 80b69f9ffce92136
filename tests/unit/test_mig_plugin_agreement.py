"""The nvidia_mig role's check that the device plugin serving a node runs with nvidia_mig_strategy (issue 35: MIG
partitioned a node the plugin, with migStrategy none, would never advertise, and the node stayed cordoned).

The DaemonSet here is the device plugin role's own (built from its template's vars: the config-manager sidecar's
environment and the configs volume), the rule the one in module_utils/device_plugin_config.py, which follows
k8s-device-plugin v0.18.0's config-manager (updateConfigName) and its flag precedence (MIG_STRATEGY over the file).
test_manifests.py runs the same rule on the DaemonSet Ansible renders."""

from __future__ import annotations

import copy

import pytest

from ansible_collections.gpu_ops.cluster.plugins.filter.mig import nvidia_mig_plugin_problems
from ansible_collections.gpu_ops.cluster.plugins.module_utils.device_plugin_config import served_mig_strategies

NODE = "gpu-0"
DEPLOY = "nvidia.com/gpu.deploy.device-plugin"
MIG_LAYOUT = [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 7}}]
NO_MIG = [{"devices": "all", "mig-enabled": False}]


def daemonset(default: str = "default", plugin_env: list | None = None, fallbacks: str = "named,single") -> dict:
    manager_env = [{"name": "NODE_LABEL", "value": "nvidia.com/device-plugin.config"},
                   {"name": "CONFIG_FILE_SRCDIR", "value": "/available-configs"},
                   {"name": "CONFIG_FILE_DST", "value": "/config/config.yaml"},
                   {"name": "DEFAULT_CONFIG", "value": default},
                   {"name": "FALLBACK_STRATEGIES", "value": fallbacks}]
    mounts = [{"name": "available-configs", "mountPath": "/available-configs"}, {"name": "config", "mountPath": "/config"}]
    return {"metadata": {"name": "nvidia-device-plugin", "namespace": "nvidia-device-plugin"}, "spec": {"template": {
        "spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": DEPLOY, "operator": "In", "values": ["true"]}]}]}}},
            "containers": [
                {"name": "config-manager", "command": ["config-manager"], "env": manager_env, "volumeMounts": mounts},
                {"name": "nvidia-device-plugin", "command": ["nvidia-device-plugin"],
                 "env": [{"name": "CONFIG_FILE", "value": "/config/config.yaml"}, *(plugin_env or [])]}],
            "volumes": [{"name": "available-configs", "configMap": {"name": "nvidia-device-plugin-configs"}},
                        {"name": "config", "emptyDir": {}}]}}}}


def configs(**data: str) -> list:
    return [{"metadata": {"name": "nvidia-device-plugin-configs"}, "data": data}]


DEFAULT_NONE = "version: v1\nflags:\n  migStrategy: none\n"
MIXED = "version: v1\nflags:\n  migStrategy: mixed\n"
SINGLE = "version: v1\nflags: {migStrategy: single}\n"


@pytest.mark.parametrize(("labels", "maps", "ds", "strategy", "chosen_by"), [
    ({DEPLOY: "true"}, configs(default=DEFAULT_NONE, mig=MIXED), daemonset(), "none", "DEFAULT_CONFIG"),
    ({DEPLOY: "true", "nvidia.com/device-plugin.config": "mig"}, configs(default=DEFAULT_NONE, mig=MIXED),
     daemonset(), "mixed", "the node's label"),
    # No DEFAULT_CONFIG: the fallbacks in order, "named" (the key default) before "single" (the only key).
    ({DEPLOY: "true"}, configs(default=SINGLE, mig=MIXED), daemonset(default=""), "single", "the key \"default\""),
    ({DEPLOY: "true"}, configs(only=MIXED), daemonset(default=""), "mixed", "its only key"),
    ({DEPLOY: "true"}, configs(only=MIXED), daemonset(default="", fallbacks="empty"), "none", "no config file"),
    # A file without flags.migStrategy: the flag's default.
    ({DEPLOY: "true"}, configs(default="version: v1\n"), daemonset(), "none", "DEFAULT_CONFIG"),
    # The plugin container's MIG_STRATEGY wins over the file (api/config/v1 UpdateFromCLIFlags).
    ({DEPLOY: "true"}, configs(default=DEFAULT_NONE), daemonset(plugin_env=[{"name": "MIG_STRATEGY", "value": "mixed"}]),
     "mixed", "MIG_STRATEGY"),
])
def test_the_strategy_is_decided_as_the_plugin_decides_it(labels, maps, ds, strategy, chosen_by):
    served = served_mig_strategies(NODE, labels, [ds], maps)
    assert [s["strategy"] for s in served] == [strategy], served
    assert chosen_by in served[0]["source"], served


def test_an_argument_sets_the_strategy_too():
    ds = daemonset()
    ds["spec"]["template"]["spec"]["containers"][1]["args"] = ["--mig-strategy=single"]
    assert served_mig_strategies(NODE, {DEPLOY: "true"}, [ds], configs(default=MIXED))[0]["strategy"] == "single"


def test_a_daemonset_whose_affinity_leaves_the_node_out_does_not_serve_it():
    assert served_mig_strategies(NODE, {}, [daemonset()], configs(default=DEFAULT_NONE)) == []
    ds = daemonset()
    ds["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"].append({"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]})
    assert len(served_mig_strategies(NODE, {}, [ds], configs(default=DEFAULT_NONE))) == 1  # terms are ORed


@pytest.mark.parametrize(("labels", "maps", "ds", "error"), [
    ({DEPLOY: "true", "nvidia.com/device-plugin.config": "missing"}, configs(default=MIXED), daemonset(),
     "nvidia.com/device-plugin.config=missing names no key"),
    ({DEPLOY: "true"}, configs(other=MIXED), daemonset(), "DEFAULT_CONFIG default is no key"),
    ({DEPLOY: "true"}, configs(a=MIXED, b=MIXED), daemonset(default=""), "no fallback picks one"),
    ({DEPLOY: "true"}, [], daemonset(), "ConfigMap nvidia-device-plugin-configs does not exist"),
    ({DEPLOY: "true"}, configs(default="flags: [unclosed"), daemonset(), "not YAML"),
])
def test_a_config_manager_that_would_find_no_config_is_an_error(labels, maps, ds, error):
    served = served_mig_strategies(NODE, labels, [ds], maps)
    assert len(served) == 1 and error in served[0].get("error", ""), served


def test_a_mig_layout_is_refused_where_the_plugin_runs_another_strategy():
    problems = nvidia_mig_plugin_problems("mixed", NODE, "all-1g.10gb", MIG_LAYOUT, {DEPLOY: "true"}, [daemonset()],
                                          configs(default=DEFAULT_NONE, mig=MIXED))
    assert len(problems) == 1, problems
    assert problems[0].startswith("nvidia_mig_strategy='mixed' for gpu-0, but the device plugin that serves it "
                                  "(DaemonSet nvidia-device-plugin/nvidia-device-plugin) runs with migStrategy 'none' "
                                  "(ConfigMap nvidia-device-plugin/nvidia-device-plugin-configs key default, chosen by "
                                  "DEFAULT_CONFIG"), problems
    assert "nvidia_device_plugin_config" in problems[0] and "or set nvidia_mig_strategy" not in problems[0]
    single = nvidia_mig_plugin_problems("mixed", NODE, "all-1g.10gb", MIG_LAYOUT, {DEPLOY: "true"}, [daemonset()],
                                        configs(default=SINGLE))
    assert "or set nvidia_mig_strategy='single' for gpu-0" in single[0], single


@pytest.mark.parametrize(("strategy", "layout", "labels", "daemonsets"), [
    ("mixed", MIG_LAYOUT, {DEPLOY: "true", "nvidia.com/device-plugin.config": "mig"}, [daemonset()]),  # they agree
    ("mixed", NO_MIG, {DEPLOY: "true"}, [daemonset()]),  # no MIG in the layout: any strategy advertises whole GPUs
    ("mixed", MIG_LAYOUT, {DEPLOY: "true"}, []),  # no device plugin DaemonSet (the role's restart finds none either)
    ("mixed", MIG_LAYOUT, {}, [daemonset()]),  # the plugin does not run on the node
])
def test_what_the_plugin_would_advertise_passes(strategy, layout, labels, daemonsets):
    assert nvidia_mig_plugin_problems(strategy, NODE, "c", layout, labels, daemonsets,
                                      configs(default=DEFAULT_NONE, mig=MIXED)) == []


def test_the_input_objects_are_not_changed():
    ds, maps = daemonset(), configs(default=DEFAULT_NONE)
    before = copy.deepcopy((ds, maps))
    nvidia_mig_plugin_problems("mixed", NODE, "c", MIG_LAYOUT, {DEPLOY: "true"}, [ds], maps)
    assert (ds, maps) == before
