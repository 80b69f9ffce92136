# -*- coding: utf-8 -*-
# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)
"""Filter that checks the nvidia_mig role's layouts before any host is read or changed (the roles' preflight)."""

from __future__ import annotations

from typing import Any, Dict, List

from ansible_collections.gpu_ops.cluster.plugins.module_utils import mig_layout


def nvidia_mig_config_problems(configs: Any, chosen: Any, builtin: Any = None) -> List[str]:
    """Format problems of nvidia_mig_configs, and of nvidia_mig_config when it names no config."""
    problems = mig_layout.configs_problems(configs, "nvidia_mig_configs")
    known = sorted(set(configs if isinstance(configs, dict) else {}) | set(builtin or {}))
    if not isinstance(chosen, str):
        problems.append(f"nvidia_mig_config={chosen!r}: must be a config name (a string) or \"\"")
    elif chosen and chosen not in known:
        problems.append(f"nvidia_mig_config={chosen!r} names no config; known: {', '.join(known)}")
    return problems


class FilterModule:
    def filters(self) -> Dict[str, Any]:
        return {"nvidia_mig_config_problems": nvidia_mig_config_problems}
