# -*- coding: utf-8 -*-
# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)
"""The NVIDIA device plugin's config file (k8s-device-plugin `api/config/v1`), checked once for everything that reads
it: the device plugin role's preflight (filter device_plugin_config_problems) and the cluster check
(gpu_cluster_check, through module_utils/gpu_cluster.py), so both refuse what the plugin itself refuses: replicas below
2, timeSlicing with mps, MPS for anything but nvidia.com/gpu or with a MIG strategy.

Each problem names the config, the key, the bad value and what is allowed.
"""

from __future__ import absolute_import, annotations, division, print_function

import re
from typing import Any, List, Mapping

from ansible_collections.gpu_ops.cluster.plugins.module_utils.k8s_values import is_label_value

_RESOURCE = re.compile(r"^nvidia\.com/[a-z0-9]([-.a-z0-9]*[a-z0-9])?\Z")
MIG_STRATEGIES = ("none", "single", "mixed")
SHARING_KINDS = ("timeSlicing", "mps")
KNOWN_TOP = ("version", "flags", "sharing", "resources")


def _sharing_problems(name: str, kind: str, section: Any, mig_strategy: str) -> List[str]:
    where = "config %r: sharing.%s" % (name, kind)
    if not isinstance(section, Mapping):
        return ["%s=%r; allowed: a mapping with resources" % (where, section)]
    problems = []
    for flag in ("renameByDefault", "failRequestsGreaterThanOne"):
        if flag in section and not isinstance(section[flag], bool):
            problems.append("%s.%s=%r; allowed: true or false" % (where, flag, section[flag]))
    resources = section.get("resources")
    if not isinstance(resources, list) or not resources:
        return problems + ["%s.resources=%r; allowed: a non-empty list of {name, replicas}" % (where, resources)]
    for index, resource in enumerate(resources):
        at = "%s.resources[%d]" % (where, index)
        if not isinstance(resource, Mapping):
            problems.append("%s=%r; allowed: a mapping {name, replicas}" % (at, resource))
            continue
        resource_name = resource.get("name")
        if not isinstance(resource_name, str) or not _RESOURCE.match(resource_name):
            problems.append("%s.name=%r; allowed: an nvidia.com/ resource name such as nvidia.com/gpu"
                            % (at, resource_name))
        elif kind == "mps" and resource_name != "nvidia.com/gpu":
            problems.append("%s.name=%r; allowed: nvidia.com/gpu only (MPS shares full GPUs)" % (at, resource_name))
        replicas = resource.get("replicas")
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 2:
            problems.append("%s.replicas=%r; allowed: an integer of at least 2 (the plugin refuses 1 and below)"
                            % (at, replicas))
    if kind == "mps" and mig_strategy != "none":
        problems.append("config %r: sharing.mps with flags.migStrategy=%r; allowed: MPS only with migStrategy none"
                        % (name, mig_strategy))
    return problems


def config_problems(name: Any, config: Any) -> List[str]:
    """Everything wrong with one named config."""
    if not is_label_value(name, allow_empty=False):
        return ["config name %r; allowed: letters, digits, '-', '_', '.', at most 63 characters (it becomes a "
                "ConfigMap key and a node label value)" % (name,)]
    if not isinstance(config, Mapping):
        return ["config %r=%r; allowed: a mapping in the device plugin's version v1 format" % (name, config)]
    problems = []
    unknown = sorted(set(config) - set(KNOWN_TOP))
    if unknown:
        problems.append("config %r: unknown keys %s; allowed: %s" % (name, unknown, ", ".join(KNOWN_TOP)))
    if config.get("version", "v1") != "v1":
        problems.append("config %r: version=%r; allowed: v1" % (name, config.get("version")))
    flags = config.get("flags") or {}
    if not isinstance(flags, Mapping):
        problems.append("config %r: flags=%r; allowed: a mapping" % (name, flags))
        flags = {}
    mig_strategy = flags.get("migStrategy", "none")
    if mig_strategy not in MIG_STRATEGIES:
        problems.append("config %r: flags.migStrategy=%r; allowed: %s" % (name, mig_strategy,
                                                                          ", ".join(MIG_STRATEGIES)))
    sharing = config.get("sharing") or {}
    if not isinstance(sharing, Mapping):
        return problems + ["config %r: sharing=%r; allowed: a mapping with timeSlicing or mps" % (name, sharing)]
    unknown = sorted(set(sharing) - set(SHARING_KINDS))
    if unknown:
        problems.append("config %r: unknown sharing kinds %s; allowed: timeSlicing, mps" % (name, unknown))
    present = [kind for kind in SHARING_KINDS if sharing.get(kind) is not None]
    if len(present) > 1:
        problems.append("config %r: sharing.timeSlicing and sharing.mps are both set; allowed: one of them" % name)
    for kind in present:
        problems.extend(_sharing_problems(name, kind, sharing[kind], str(mig_strategy)))
    return problems
