# -*- coding: utf-8 -*-
# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)
"""Filter that checks the nvidia_mig role's layouts before any host is read or changed (the roles' preflight)."""

from __future__ import annotations

from typing import Any, Dict, List

from ansible.errors import AnsibleFilterError

from ansible_collections.gpu_ops.cluster.plugins.module_utils import device_plugin_config, mig_layout


def nvidia_mig_config_problems(configs: Any, chosen: Any, builtin: Any = None,
                               parted_config: Any = None) -> List[str]:
    """Format problems of nvidia_mig_parted_config (mig-parted's whole config file) and nvidia_mig_configs, a name
    both define, and nvidia_mig_config when it names no config."""
    problems = mig_layout.parted_config_problems(parted_config, "nvidia_mig_parted_config")
    problems += mig_layout.configs_problems(configs, "nvidia_mig_configs")
    problems += mig_layout.defined_twice_problems(parted_config, configs, "nvidia_mig_parted_config",
                                                  "nvidia_mig_configs")
    known = sorted(mig_layout.known_configs(builtin, parted_config, configs), key=str)
    if not isinstance(chosen, str):
        problems.append(f"nvidia_mig_config={chosen!r}: must be a config name (a string) or \"\"")
    elif chosen and chosen not in known:
        problems.append(f"nvidia_mig_config={chosen!r} names no config; known: {', '.join(map(str, known))}")
    return problems


def nvidia_mig_known_configs(builtin: Any, parted_config: Any, configs: Any) -> Dict[str, Any]:
    """Config name -> entries: the built-ins, nvidia_mig_parted_config's mig-configs and nvidia_mig_configs."""
    return mig_layout.known_configs(builtin, parted_config, configs)


def nvidia_mig_plugin_problems(strategy: Any, node: Any, config_name: Any, entries: Any, node_labels: Any,
                               daemonsets: Any, config_maps: Any) -> List[str]:
    """Where the layout enables MIG: each device plugin DaemonSet that serves the node must run with the MIG strategy
    the role was given (nvidia_mig_strategy), or it never advertises the devices the role waits for. The strategy is
    decided as the plugin decides it (module_utils/device_plugin_config.served_mig_strategies)."""
    if not any(isinstance(e, dict) and e.get("mig-enabled") is True for e in entries or []):
        return []
    problems = []
    served_by = device_plugin_config.served_mig_strategies(str(node), node_labels or {}, daemonsets, config_maps)
    for served in served_by:
        if "error" in served:
            problems.append(f"{node}: the device plugin that serves it ({served['daemonset']}) has no config for it: "
                            f"{served['error']}; fix the device plugin's configs before partitioning")
        elif served["strategy"] != strategy:
            alternative = "" if served["strategy"] == "none" else \
                f", or set nvidia_mig_strategy={served['strategy']!r} for {node}"
            problems.append(
                f"nvidia_mig_strategy={strategy!r} for {node}, but the device plugin that serves it "
                f"({served['daemonset']}) runs with migStrategy {served['strategy']!r} ({served['source']}): it would "
                f"not advertise the MIG devices of {config_name} as the role waits for them, and the node would stay "
                f"cordoned. Give {node} a device plugin config with migStrategy {strategy!r} first "
                f"(nvidia_device_plugin_config, nvidia_device_plugin_configs; run the device plugin role){alternative}")
    return problems


STATES = ("unchanged", "changed", "refused", "failed")


def nvidia_mig_report(outcomes: Any, check_mode: bool = False) -> Dict[str, Any]:
    """{schema, check_mode, nodes, counts, summary, problems} from each node's outcome (node -> {config, state, ...})."""
    if not isinstance(outcomes, dict):
        raise AnsibleFilterError(f"nvidia_mig_report: the outcomes are {outcomes!r}, not node name -> outcome")
    counts = {state: 0 for state in STATES}
    summary: List[str] = []
    problems: List[str] = []
    verb = "would change" if check_mode else "changed"
    for name in sorted(outcomes):
        outcome = outcomes[name]
        state = outcome.get("state")
        if state not in counts:
            raise AnsibleFilterError(f"nvidia_mig_report: {name} has state {state!r}; allowed: {', '.join(STATES)}")
        counts[state] += 1
        gpus = ", ".join(map(str, outcome.get("gpus_changed") or [])) or "none"
        if state == "unchanged":
            summary.append(f"{name}: {outcome.get('config')} already in place")
        elif state == "changed":
            summary.append(f"{name}: {outcome.get('config')} {verb} on GPUs {gpus}"
                           + (" (rebooted)" if outcome.get("rebooted") else ""))
        else:
            line = f"{name}: {outcome.get('config')} {state} at \"{outcome.get('step')}\": {outcome.get('reason')}"
            if state == "failed":
                line += " (left cordoned, nvidia.com/mig.config.state=failed)"
            summary.append(line)
            problems.append(line)
    summary.append(", ".join(f"{counts[s]} {s}" for s in STATES) + (" (check mode)" if check_mode else ""))
    return {"schema": 1, "check_mode": bool(check_mode), "nodes": dict(outcomes), "counts": counts,
            "summary": summary, "problems": problems}


class FilterModule:
    def filters(self) -> Dict[str, Any]:
        return {"nvidia_mig_config_problems": nvidia_mig_config_problems,
                "nvidia_mig_known_configs": nvidia_mig_known_configs, "nvidia_mig_report": nvidia_mig_report,
                "nvidia_mig_plugin_problems": nvidia_mig_plugin_problems}
