# -*- coding: utf-8 -*-
# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)
"""Checks of the tenancy role's teams (roles/tenancy preflight) and the data its templates are built from.

Every problem names the variable path, the bad value and what is allowed, so a failed preflight says what to fix.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Mapping

from ansible_collections.gpu_ops.cluster.plugins.module_utils.input_forms import SYSTEM_NAMESPACES, is_system_namespace
from ansible_collections.gpu_ops.cluster.plugins.module_utils.k8s_values import (
    is_dns_label, is_dns_subdomain, is_label_value, quantity_problem)

VAR = "tenancy_teams"
TEAM_KEYS = ("name", "state", "force", "members", "viewers", "gpus", "device_classes", "cpu", "memory", "storage",
             "node_pool", "queue")  # queue: the gpu_queues role's (checked there)
SUBJECT_KEYS = ("users", "groups")
STATES = ("present", "absent")
# What the NVIDIA device plugin advertises: whole GPUs, renamed shared replicas, MIG devices (mixed strategy).
_GPU_RESOURCE = re.compile(r"^nvidia\.com/(gpu|gpu\.shared|mig-[1-7]g\.[0-9]+gb(\.me)?)\Z")
GPU_RESOURCES_ALLOWED = "nvidia.com/gpu, nvidia.com/gpu.shared or nvidia.com/mig-<N>g.<M>gb (e.g. nvidia.com/mig-1g.10gb)"
# DRA: ResourceQuota counts the devices that claims request per DeviceClass under this key (Kubernetes' quota for
# dynamic resource allocation). The key's prefix is a DNS subdomain of at most 253 characters, so a class name fits
# in 253 minus the suffix.
DEVICE_CLASS_QUOTA_SUFFIX = ".deviceclass.resource.k8s.io/devices"
_DEVICE_CLASS_MAX = 253 - len(".deviceclass.resource.k8s.io")
DEVICE_CLASSES_ALLOWED = ("a DeviceClass name (a DNS subdomain of at most %d characters) such as gpu.nvidia.com, "
                          "mig.nvidia.com or a product class" % _DEVICE_CLASS_MAX)


def _subjects_problems(path: str, subjects: Any) -> List[str]:
    if subjects is None:
        return []
    if not isinstance(subjects, Mapping):
        return ["%s=%r; allowed: a mapping {users: [..], groups: [..]}" % (path, subjects)]
    problems = ["%s.%s is not a known key; allowed: %s" % (path, key, ", ".join(SUBJECT_KEYS))
                for key in subjects if key not in SUBJECT_KEYS]
    for key in SUBJECT_KEYS:
        names = subjects.get(key, [])
        if names is None:
            continue
        if not isinstance(names, list) or not all(isinstance(n, str) and n.strip() for n in names):
            problems.append("%s.%s=%r; allowed: a list of non-empty %s names" % (path, key, names, key[:-1]))
    return problems


def _subjects(team: Mapping[str, Any], role: str) -> set:
    """{('users'|'groups', name)} of a team's members or viewers (ill-typed entries ignored: reported elsewhere)."""
    found = set()
    subjects = team.get(role)
    if isinstance(subjects, Mapping):
        for key in SUBJECT_KEYS:
            names = subjects.get(key) or []
            if isinstance(names, list):
                found.update((key, name) for name in names if isinstance(name, str))
    return found


def tenancy_team_problems(teams: Any, reserved: Any = None) -> List[str]:
    """Every problem of tenancy_teams; [] when the list is valid.

    reserved: namespace names a team may never take besides Kubernetes' own (default, kube-system, kube-public,
    kube-node-lease and any kube-* name), which are refused whatever reserved says: the role labels a team's namespace
    with its Pod Security level and may delete it.
    A subject may be a member of several teams (RBAC is per namespace and additive), but not both member and viewer of
    one team: the two roles conflict and the intent is unclear.
    """
    if not isinstance(teams, list):
        return ["%s=%r; allowed: a list of teams ({name, members, viewers, gpus, cpu, memory, ...})" % (VAR, teams)]
    reserved_names = set(reserved or []) | set(SYSTEM_NAMESPACES)
    problems: List[str] = []
    seen: Dict[str, int] = {}
    for index, team in enumerate(teams):
        path = "%s[%d]" % (VAR, index)
        if not isinstance(team, Mapping):
            problems.append("%s=%r; allowed: a mapping with at least a name" % (path, team))
            continue
        problems.extend("%s.%s is not a known key; allowed: %s" % (path, key, ", ".join(TEAM_KEYS))
                        for key in team if key not in TEAM_KEYS)
        name = team.get("name")
        if not is_dns_label(name):
            problems.append("%s.name=%r; allowed: a DNS-1123 label (lower-case letters, digits and '-', starting and "
                            "ending with a letter or digit, at most 63 characters)" % (path, name))
        elif name in reserved_names or is_system_namespace(name):
            problems.append("%s.name=%r is a system namespace; allowed: any other name (reserved: %s and kube-*)"
                            % (path, name, ", ".join(sorted(reserved_names))))
        elif name in seen:
            problems.append("%s.name=%r repeats %s[%d]; allowed: each team once" % (path, name, VAR, seen[name]))
        else:
            seen[name] = index
        if team.get("state", "present") not in STATES:
            problems.append("%s.state=%r; allowed: %s" % (path, team.get("state"), ", ".join(STATES)))
        if not isinstance(team.get("force", False), bool):
            problems.append("%s.force=%r; allowed: true or false (a boolean, not a string)" % (path, team.get("force")))
        for role in ("members", "viewers"):
            problems.extend(_subjects_problems("%s.%s" % (path, role), team.get(role)))
        both = sorted(_subjects(team, "members") & _subjects(team, "viewers"))
        if both:
            problems.append("%s: %s both member and viewer of team %r; allowed: one role per team"
                            % (path, ", ".join("%s %r" % (kind[:-1], who) for kind, who in both), name))
        gpus = team.get("gpus", {})
        if gpus is None:
            gpus = {}
        if not isinstance(gpus, Mapping):
            problems.append("%s.gpus=%r; allowed: a mapping {resource name: count}" % (path, gpus))
        else:
            for resource, count in gpus.items():
                if not isinstance(resource, str) or not _GPU_RESOURCE.match(resource):
                    problems.append("%s.gpus key %r is not a GPU resource; allowed: %s"
                                    % (path, resource, GPU_RESOURCES_ALLOWED))
                if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                    problems.append("%s.gpus[%r]=%r; allowed: a whole number of devices >= 0" % (path, resource, count))
        problems.extend(_device_classes_problems("%s.device_classes" % path, team.get("device_classes")))
        for key in ("cpu", "memory", "storage"):
            if key in team and team[key] is not None:
                problem = quantity_problem("%s.%s" % (path, key), team[key])
                if problem:
                    problems.append(problem)
        pool = team.get("node_pool", "")
        if pool is not None and not is_label_value(pool):
            problems.append("%s.node_pool=%r; allowed: a label value (letters, digits, '-', '_', '.', at most 63) or "
                            "empty" % (path, pool))
    return problems


def _is_device_class(name: Any) -> bool:
    return is_dns_subdomain(name) and len(name) <= _DEVICE_CLASS_MAX


def _device_classes_problems(path: str, classes: Any) -> List[str]:
    """A team's {DeviceClass name: devices} (DRA quota)."""
    if classes is None:
        return []
    if not isinstance(classes, Mapping):
        return ["%s=%r; allowed: a mapping {DeviceClass name: count of devices}" % (path, classes)]
    problems = []
    for name, count in classes.items():
        if not _is_device_class(name):
            problems.append("%s key %r is not a DeviceClass name; allowed: %s" % (path, name, DEVICE_CLASSES_ALLOWED))
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            problems.append("%s[%r]=%r; allowed: a whole number of devices >= 0" % (path, name, count))
    return problems


def tenancy_device_class_problems(known: Any, variable: str = "tenancy_gpu_device_classes",
                                  product_classes: Any = None) -> List[str]:
    """Problems of the list of DeviceClasses every team's quota covers (0 where a team has none). product_classes:
    nvidia_dra_driver_product_classes, from which the default list takes names: a bad name that came from there is
    named as the user wrote it (nvidia_dra_driver_product_classes[j].name)."""
    if not isinstance(known, list):
        return ["%s=%r; allowed: a list of DeviceClass names" % (variable, known)]
    origin = {entry.get("name"): "nvidia_dra_driver_product_classes[%d].name" % index
              for index, entry in enumerate(product_classes if isinstance(product_classes, list) else [])
              if isinstance(entry, dict) and isinstance(entry.get("name"), str)}
    return ["%s=%r (in %s); allowed: %s" % (origin[name], name, variable, DEVICE_CLASSES_ALLOWED) if name in origin
            else "%s[%d]=%r; allowed: %s" % (variable, index, name, DEVICE_CLASSES_ALLOWED)
            for index, name in enumerate(known) if not _is_device_class(name)]


def tenancy_device_class_quota(classes: Mapping[str, int] | None, known: List[str]) -> Dict[str, str]:
    """ResourceQuota `hard` entries for DRA devices: the team's count per DeviceClass, 0 for every known class it was
    not given (a claim through a class the quota does not name would be unlimited)."""
    counts = {name: 0 for name in known}
    counts.update(classes or {})
    return {"%s%s" % (name, DEVICE_CLASS_QUOTA_SUFFIX): str(count) for name, count in sorted(counts.items())}


def tenancy_gpu_resource_problems(known: Any, variable: str = "tenancy_gpu_resources") -> List[str]:
    """Problems of the list of GPU resource names every team's quota covers (0 where a team has none)."""
    if not isinstance(known, list):
        return ["%s=%r; allowed: a list of GPU resource names" % (variable, known)]
    return ["%s[%d]=%r; allowed: %s" % (variable, index, name, GPU_RESOURCES_ALLOWED)
            for index, name in enumerate(known) if not isinstance(name, str) or not _GPU_RESOURCE.match(name)]


def tenancy_quantity_problems(quantities: Mapping[str, Any]) -> List[str]:
    """Problems of {variable name: quantity} (the role's quota defaults)."""
    return [problem for problem in (quantity_problem(name, value) for name, value in quantities.items()) if problem]


def tenancy_gpu_quota(gpus: Mapping[str, int] | None, known: List[str]) -> Dict[str, str]:
    """ResourceQuota `hard` entries for GPUs: the team's counts, and 0 for every known resource it was not given.

    ResourceQuota accepts only `requests.<name>` for extended resources (their requests always equal their limits).
    """
    counts = {name: 0 for name in known}
    counts.update(gpus or {})
    return {"requests.%s" % name: str(count) for name, count in sorted(counts.items())}


def tenancy_teams_in_state(teams: List[Mapping[str, Any]], state: str) -> List[Mapping[str, Any]]:
    """The teams whose state (default present) is state, in list order."""
    return [team for team in teams if team.get("state", "present") == state]


def tenancy_managed_namespaces(namespaces: List[Mapping[str, Any]], managed_by: str, team_label: str) -> List[str]:
    """Names of the namespaces the role manages: managed-by us and labelled as the team of the same name."""
    names = []
    for namespace in namespaces:
        metadata = namespace.get("metadata", {})
        labels = metadata.get("labels") or {}
        if labels.get("app.kubernetes.io/managed-by") == managed_by and labels.get(team_label) == metadata.get("name"):
            names.append(metadata["name"])
    return names


def tenancy_refused_deletions(claim_lookups: List[Mapping[str, Any]]) -> List[str]:
    """Why each deletion is refused: a team marked absent, not forced, whose namespace holds PVCs.

    claim_lookups: the results of a looped k8s_info of PVCs, each with the team under `tenancy_absent`.
    """
    refused = []
    for lookup in claim_lookups:
        team = lookup.get("tenancy_absent", {})
        claims = [claim["metadata"]["name"] for claim in lookup.get("resources") or []]
        if claims and team.get("force", False) is not True:
            refused.append("tenancy_teams entry %r has state=absent and force=%r, but its namespace holds persistent "
                           "volume claims %s; allowed: delete or move the data first, or force: true to delete them "
                           "with the namespace" % (team.get("name"), team.get("force", False), ", ".join(claims)))
    return refused


class FilterModule:
    def filters(self) -> Dict[str, Any]:
        return {"tenancy_team_problems": tenancy_team_problems,
                "tenancy_gpu_resource_problems": tenancy_gpu_resource_problems,
                "tenancy_quantity_problems": tenancy_quantity_problems,
                "tenancy_gpu_quota": tenancy_gpu_quota,
                "tenancy_device_class_problems": tenancy_device_class_problems,
                "tenancy_device_class_quota": tenancy_device_class_quota,
                "tenancy_teams_in_state": tenancy_teams_in_state,
                "tenancy_managed_namespaces": tenancy_managed_namespaces,
                "tenancy_refused_deletions": tenancy_refused_deletions}
