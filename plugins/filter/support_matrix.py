# -*- coding: utf-8 -*-
# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)
"""Preflight checks of version combinations that cannot work (module_utils/support_matrix.py holds the tables):
CUDA versions against the driver branch (cuda_toolkit, nvidia_driver), the API server's Kubernetes version against
the supported range (every cluster role, through _common's k8s_access; nvidia_dra_driver with its own minimum), and
the device plugin's MIG strategies against each node's GPUs and driver (nvidia_device_plugin); and the warning for a
driver branch past its end of life (nvidia_driver's preflight)."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping

from ansible.errors import AnsibleFilterError
from ansible_collections.gpu_ops.cluster.plugins.module_utils import support_matrix


def cuda_driver_problems(cuda_versions: Any, driver: Any, cuda_setting: str = "cuda_toolkit_versions",
                         driver_setting: str = "nvidia_driver_branch") -> List[str]:
    """The CUDA versions the driver branch (or exact version) cannot run; empty when the driver is unknown."""
    if not isinstance(cuda_versions, (list, tuple)):
        raise AnsibleFilterError("cuda_driver_problems: the CUDA versions must be a list, got %r" % (cuda_versions,))
    return support_matrix.cuda_driver_problems(cuda_versions, driver, cuda_setting, driver_setting)


def kubernetes_version_problems(server_version: Any, minimum: str = "", need: str = "",
                                accept_untested: Any = "") -> List[str]:
    """Whether the API server's git version is in the supported range (and at least a feature's minimum);
    accept_untested: one newer minor the user runs on knowingly (gpu_cluster_kubernetes_accept_untested)."""
    return support_matrix.kubernetes_version_problems(server_version, minimum=minimum, need=need,
                                                      accept_untested=accept_untested)


def device_plugin_mig_problems(node_configs: Any, configs: Any, default_config: Any, node_gpus: Any) -> List[str]:
    """For each GPU node ({node: chosen config or ''}) whose config sets migStrategy single or mixed: whether its GPUs
    ({node: nvidia_gpu facts}, a node without facts is not judged) have MIG and its driver serves it."""
    if not isinstance(node_configs, Mapping) or not isinstance(node_gpus, Mapping):
        raise AnsibleFilterError("device_plugin_mig_problems: node_configs and node_gpus must be mappings")
    if not isinstance(configs, Mapping):
        return []  # device_plugin_config_problems names it
    problems: List[str] = []
    for node, choice in sorted(node_configs.items()):
        name = choice or default_config
        config = configs.get(name)
        if not isinstance(config, Mapping):
            continue  # device_plugin_config_problems names it
        strategy = str((config.get("flags") or {}).get("migStrategy", "none"))
        summary = support_matrix.node_gpu_summary(node_gpus.get(node))
        problems.extend(support_matrix.mig_strategy_problems(str(node), str(name), strategy, summary["products"],
                                                             summary["driver"]))
    return problems


def driver_branch_eol_warnings(drivers: Any, today: Any = "") -> List[str]:
    """One warning per driver branch past its end of life among {what: driver} ("nvidia_driver_branch=535": "535",
    "the running driver 535.261.03": "535.261.03"), what is on one branch joined with "and", in the given order.
    today: "YYYY-MM-DD"; empty: the controller's date (UTC)."""
    if not isinstance(drivers, Mapping):
        raise AnsibleFilterError("driver_branch_eol_warnings: expects a mapping of what to driver, got %r" % (drivers,))
    try:
        day = support_matrix.parse_day(today) if today else support_matrix.utc_today()
    except ValueError as exc:
        raise AnsibleFilterError("driver_branch_eol_warnings: today=%r is not a YYYY-MM-DD date" % (today,)) from exc
    grouped: Dict[int, List[str]] = {}
    lines: Dict[int, str] = {}
    for what, driver in drivers.items():
        line = support_matrix.driver_branch_eol_warning(driver, day)
        if line:
            branch = support_matrix.branch_of(driver)
            grouped.setdefault(branch, []).append(str(what))  # type: ignore[arg-type]
            lines[branch] = line  # type: ignore[index]
    return ["%s: %s" % (" and ".join(names), lines[branch]) for branch, names in grouped.items()]


class FilterModule:
    def filters(self) -> Dict[str, Any]:
        return {
            "cuda_driver_problems": cuda_driver_problems,
            "kubernetes_version_problems": kubernetes_version_problems,
            "device_plugin_mig_problems": device_plugin_mig_problems,
            "driver_branch_eol_warnings": driver_branch_eol_warnings,
        }
