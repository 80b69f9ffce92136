# -*- coding: utf-8 -*-
# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)
"""The NVIDIA device plugin's sharing configs, for roles/nvidia_device_plugin: the preflight's checks and the node
labels its apply sets.

Each config is checked by module_utils/device_plugin_config.py, the one validator the cluster check uses too; this
filter adds what only the role knows: the default config's name, the per-node choices and the MPS root its DaemonSet
gives the plugin.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

from ansible.errors import AnsibleFilterError
from ansible_collections.gpu_ops.cluster.plugins.module_utils.device_plugin_config import (
    DEFAULT_MPS_ROOT, config_problems, uses_mps)

# The config-manager's label (upstream's name): which config a node runs.
CONFIG_LABEL = "nvidia.com/device-plugin.config"


def device_plugin_config_problems(configs: Any, default_config: Any, node_choices: Any = None,
                                  mps_root: Optional[str] = DEFAULT_MPS_ROOT) -> List[str]:
    """Every problem of the configs, the default name, and the per-node choices ({node: config name or ''}), for a
    plugin whose environment sets MPS_ROOT=mps_root (the role's nvidia_device_plugin_mps_root)."""
    if not isinstance(configs, Mapping) or not configs:
        return ["nvidia_device_plugin_configs=%r; allowed: a non-empty mapping of config name to config" % (configs,)]
    problems: List[str] = []
    for name, config in configs.items():
        problems.extend(config_problems(name, config, mps_root))
    if default_config not in configs:
        problems.append("nvidia_device_plugin_default_config=%r names no config; allowed: %s"
                        % (default_config, ", ".join(sorted(map(str, configs)))))
    if node_choices is not None and not isinstance(node_choices, Mapping):
        raise AnsibleFilterError("device_plugin_config_problems: node_choices must be a mapping, got %r"
                                 % (node_choices,))
    for node, choice in sorted((node_choices or {}).items()):
        if choice and choice not in configs:
            problems.append("%s: nvidia_device_plugin_config=%r names no config; allowed: %s"
                            % (node, choice, ", ".join(sorted(map(str, configs)))))
    return problems


def device_plugin_node_labels(node_choices: Any, configs: Any, default_config: Any, node_label: str,
                              mps_label: str) -> Dict[str, Dict[str, Optional[str]]]:
    """The labels the role owns on each GPU node ({node: config name, or '' or none for the default}): node_label
    "true" (the plugin runs there), the config-manager's label naming the node's choice (none: removed, so the
    default applies), and mps_label "true" where the node's config shares by MPS, so NVIDIA's MPS control daemon runs
    there and nowhere else (none: removed). A choice that names no config gets no MPS label (the preflight names
    it)."""
    if not isinstance(node_choices, Mapping):
        raise AnsibleFilterError("device_plugin_node_labels: node_choices must be a mapping, got %r" % (node_choices,))
    configs = configs if isinstance(configs, Mapping) else {}
    labels: Dict[str, Dict[str, Optional[str]]] = {}
    for node, choice in node_choices.items():
        config = configs.get(choice or default_config)
        labels[node] = {node_label: "true", CONFIG_LABEL: choice or None,
                        mps_label: "true" if uses_mps(config) else None}
    return labels


class FilterModule:
    def filters(self) -> Dict[str, Any]:
        return {"device_plugin_config_problems": device_plugin_config_problems,
                "device_plugin_node_labels": device_plugin_node_labels}
