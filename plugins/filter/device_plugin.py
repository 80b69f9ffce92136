# -*- coding: utf-8 -*-
# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)
"""Checks of the NVIDIA device plugin's sharing configs, for roles/nvidia_device_plugin's preflight.

Each config is checked by module_utils/device_plugin_config.py, the one validator the cluster check uses too; this
filter adds what only the role knows: the default config's name, the per-node choices and the MPS root its DaemonSet
gives the plugin.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

from ansible.errors import AnsibleFilterError
from ansible_collections.gpu_ops.cluster.plugins.module_utils.device_plugin_config import (DEFAULT_MPS_ROOT,
                                                                                       config_problems)


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


class FilterModule:
    def filters(self) -> Dict[str, Any]:
        return {"device_plugin_config_problems": device_plugin_config_problems}
