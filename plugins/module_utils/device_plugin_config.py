# -*- coding: utf-8 -*-
# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)
"""The NVIDIA device plugin's config file (k8s-device-plugin `api/config/v1`), checked once for everything that reads
it: the device plugin role's preflight (filter device_plugin_config_problems) and the cluster check
(gpu_cluster_check, through module_utils/gpu_cluster.py).

Two kinds of rule, and each message says which:

* The plugin's own: what its loader and start-up checks refuse (spec.NewConfig, DisableResourceNamingInConfig and
  validateFlags of v0.18.0, read in the plugin's source, plus what v0.20, the pinned image's release, adds:
  flags.plugin.sharedDevicesAllocationPolicy and a gfd sleepInterval of "infinite"; docs/device_plugin.md), in the
  environment this project's DaemonSet gives the plugin (MPS_ROOT set to the role's nvidia_device_plugin_mps_root,
  passed here as mps_root). The unit tests run the plugin's own loader (lab/go/device-plugin-config) on the same
  inputs and compare (tests/unit/test_device_plugin_oracle.py).
* This project's stricter rules, each marked "(project rule: ...)" with its reason: unknown keys (the plugin ignores
  them, so a misspelt key would silently do nothing); settings the plugin accepts but ignores with a warning (a custom
  `rename`, a `devices` selection, top-level `resources`); timeSlicing and mps together (the plugin silently uses
  mps); MPS with migStrategy single or for another resource than nvidia.com/gpu (the plugin accepts both, but
  shares nothing: MPS skips MIG devices, and with migStrategy none only nvidia.com/gpu exists); a flags.mpsRoot other
  than the DaemonSet's MPS root (the plugin takes MPS_ROOT from its environment over the file, and the MPS control
  daemon's hostPath is the role's root).

Each problem names the config, the key, the bad value and what is allowed.
"""

from __future__ import absolute_import, annotations, division, print_function

import re
from typing import Any, List, Mapping, Optional, Tuple

from ansible_collections.gpu_ops.cluster.plugins.module_utils.k8s_values import is_dns_subdomain, is_label_value

RESOURCE_PREFIX = "nvidia.com/"
MAX_RESOURCE_NAME_LENGTH = 63
GPU_RESOURCE = "nvidia.com/gpu"
# The MPS root NVIDIA's Helm chart gives the plugin (values.yaml mps.root) and this role's default
# (nvidia_device_plugin_mps_root): the DaemonSet sets it as MPS_ROOT and mounts it from the host.
DEFAULT_MPS_ROOT = "/run/nvidia/mps"
MIG_STRATEGIES = ("none", "single", "mixed")
SHARING_KINDS = ("timeSlicing", "mps")
DEVICE_LIST_STRATEGIES = ("envvar", "volume-mounts", "cdi-annotations", "cdi-cri")
DEVICE_ID_STRATEGIES = ("uuid", "index")
DEVICE_DISCOVERY_STRATEGIES = ("auto", "nvml", "tegra")
# v0.20's flags.plugin.sharedDevicesAllocationPolicy (the pinned image's release; the v0.18.0 loader the tests run has
# no such key and ignores it).
ALLOCATION_POLICIES = ("distributed", "packed")
KNOWN_TOP = ("version", "flags", "resources", "sharing", "imex")
_FLAG_STRINGS = ("mpsRoot", "nvidiaDriverRoot", "nvidiaDevRoot")
_FLAG_BOOLS = ("failOnInitError", "gdrcopyEnabled", "gdsEnabled", "mofedEnabled", "useNodeFeatureAPI")
KNOWN_FLAGS = ("migStrategy", "deviceDiscoveryStrategy", "plugin", "gfd") + _FLAG_STRINGS + _FLAG_BOOLS
_PLUGIN_STRINGS = ("cdiAnnotationPrefix", "nvidiaCTKPath", "containerDriverRoot")
KNOWN_PLUGIN_FLAGS = ("passDeviceSpecs", "deviceListStrategy", "deviceIDStrategy",
                      "sharedDevicesAllocationPolicy") + _PLUGIN_STRINGS
_GFD_STRINGS = ("outputFile", "machineTypeFile")
KNOWN_GFD_FLAGS = ("oneshot", "noTimestamp", "sleepInterval") + _GFD_STRINGS
KNOWN_SHARING_KEYS = ("renameByDefault", "failRequestsGreaterThanOne", "resources")
KNOWN_RESOURCE_KEYS = ("name", "rename", "devices", "replicas")
KNOWN_IMEX_KEYS = ("channelIDs", "required")

_UUID = r"(?:[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12})"
# google/uuid's Parse, which the plugin uses: the 36-character form, also in braces or after urn:uuid:, or 32 hex digits.
_ANY_UUID = r"(?:%s|\{%s\}|[Uu][Rr][Nn]:[Uu][Uu][Ii][Dd]:%s|[0-9A-Fa-f]{32})" % (_UUID, _UUID, _UUID)
# A device in a `devices` list: a GPU index, a MIG index (GPU:MIG), a GPU UUID or a MIG UUID (both MIG forms).
DEVICE_REF = re.compile(r"^(?:[0-9]+|[0-9]+:[0-9]+|GPU-%s|MIG-%s|MIG-GPU-%s/[0-9]+/[0-9]+)\Z"
                        % (_ANY_UUID, _ANY_UUID, _ANY_UUID))
# A Go duration (time.ParseDuration), or v0.20's "infinite".
_GO_DURATION = re.compile(r"^(?:infinite|[-+]?(?:0|(?:(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:ns|us|\u00b5s|\u03bcs|ms|s|m|h))+))\Z")

DEVICES_ALLOWED = ("'all', a count above 0, or a list of GPU indexes (0), MIG indexes (0:1), GPU UUIDs "
                   "(GPU-<uuid>) or MIG UUIDs (MIG-<uuid>, MIG-GPU-<uuid>/<gi>/<ci>)")
NAME_ALLOWED = ("a resource name such as nvidia.com/gpu (nvidia.com/ added when missing; the part after it a DNS "
                "subdomain; at most %d characters in all)" % MAX_RESOURCE_NAME_LENGTH)
_UNKNOWN_KEY_WHY = "(project rule: the plugin ignores unknown keys, so a misspelt key would silently do nothing)"
_IGNORED_WHY = ("(project rule: the plugin accepts it but ignores it with the warning \"not yet supported in the "
                "config. Ignoring...\", so the config would not do what it says)")


def is_bool(value: Any) -> bool:
    return value is None or isinstance(value, bool)


def is_string(value: Any) -> bool:
    return value is None or isinstance(value, str)


def is_whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def full_resource_name(value: Any) -> Optional[str]:
    """The plugin's NewResourceName: the name with nvidia.com/ added when missing, or None where the plugin refuses it."""
    if not isinstance(value, str):
        return None
    full = value if value.startswith(RESOURCE_PREFIX) else RESOURCE_PREFIX + value
    if len(full) > MAX_RESOURCE_NAME_LENGTH or not is_dns_subdomain(full[len(RESOURCE_PREFIX):]):
        return None
    return full


def devices_allowed(value: Any) -> bool:
    """The plugin's ReplicatedDevices: 'all', a count above 0, or a list of device references."""
    if value == "all":
        return True
    if is_whole(value):
        return value > 0
    if isinstance(value, list):
        return all((is_whole(item) and item >= 0) or (isinstance(item, str) and bool(DEVICE_REF.match(item)))
                   for item in value)
    return False


def _unknown_keys(where: str, section: Mapping[Any, Any], known: Tuple[str, ...]) -> List[str]:
    unknown = sorted(str(key) for key in set(section) - set(known))
    if not unknown:
        return []
    return ["%s: unknown keys %s; allowed: %s %s" % (where, unknown, ", ".join(known), _UNKNOWN_KEY_WHY)]


def _typed(where: str, section: Mapping[str, Any], keys: Tuple[str, ...], check: Any, allowed: str) -> List[str]:
    return ["%s.%s=%r; allowed: %s" % (where, key, section[key], allowed)
            for key in keys if key in section and not check(section[key])]


def _choice(where: str, section: Mapping[str, Any], key: str, choices: Tuple[str, ...]) -> List[str]:
    value = section.get(key)
    if value is None or value in choices:
        return []
    return ["%s.%s=%r; allowed: %s" % (where, key, value, ", ".join(choices))]


def _plugin_flags_problems(where: str, plugin: Any) -> List[str]:
    if plugin is None:
        return []
    if not isinstance(plugin, Mapping):
        return ["%s=%r; allowed: a mapping" % (where, plugin)]
    problems = _unknown_keys(where, plugin, KNOWN_PLUGIN_FLAGS)
    problems += _typed(where, plugin, ("passDeviceSpecs",), is_bool, "true or false")
    problems += _typed(where, plugin, _PLUGIN_STRINGS, is_string, "a string")
    problems += _choice(where, plugin, "deviceIDStrategy", DEVICE_ID_STRATEGIES)
    problems += _choice(where, plugin, "sharedDevicesAllocationPolicy", ALLOCATION_POLICIES)
    strategies = plugin.get("deviceListStrategy")
    listed = [strategies] if isinstance(strategies, str) else strategies
    if strategies is not None and (not isinstance(listed, list)
                                   or any(item not in DEVICE_LIST_STRATEGIES for item in listed)):
        problems.append("%s.deviceListStrategy=%r; allowed: one of %s, or a list of them"
                        % (where, strategies, ", ".join(DEVICE_LIST_STRATEGIES)))
    return problems


def _gfd_flags_problems(where: str, gfd: Any) -> List[str]:
    if gfd is None:
        return []
    if not isinstance(gfd, Mapping):
        return ["%s=%r; allowed: a mapping" % (where, gfd)]
    problems = _unknown_keys(where, gfd, KNOWN_GFD_FLAGS)
    problems += _typed(where, gfd, ("oneshot", "noTimestamp"), is_bool, "true or false")
    problems += _typed(where, gfd, _GFD_STRINGS, is_string, "a string")
    problems += _typed(where, gfd, ("sleepInterval",), lambda v: v is None or (
        isinstance(v, (int, float)) and not isinstance(v, bool)) or (isinstance(v, str) and bool(_GO_DURATION.match(v))),
        "a duration such as 60s or 1m30s, infinite, or nanoseconds as a number")
    return problems


def _flags_problems(where: str, flags: Any) -> List[str]:
    if not isinstance(flags, Mapping):
        return ["%s=%r; allowed: a mapping" % (where, flags)]
    problems = _unknown_keys(where, flags, KNOWN_FLAGS)
    problems += _choice(where, flags, "migStrategy", MIG_STRATEGIES)
    problems += _choice(where, flags, "deviceDiscoveryStrategy", DEVICE_DISCOVERY_STRATEGIES)
    problems += _typed(where, flags, _FLAG_BOOLS, is_bool, "true or false")
    problems += _typed(where, flags, _FLAG_STRINGS, is_string, "a string")
    problems += _plugin_flags_problems(where + ".plugin", flags.get("plugin"))
    problems += _gfd_flags_problems(where + ".gfd", flags.get("gfd"))
    return problems


def _imex_problems(where: str, imex: Any) -> List[str]:
    if imex is None:
        return []
    if not isinstance(imex, Mapping):
        return ["%s=%r; allowed: a mapping with channelIDs and required" % (where, imex)]
    problems = _unknown_keys(where, imex, KNOWN_IMEX_KEYS)
    problems += _typed(where, imex, ("required",), is_bool, "true or false")
    channels = imex.get("channelIDs")
    if channels is not None and (not isinstance(channels, list) or [c for c in channels if not is_whole(c)]
                                 or channels not in ([], [0])):
        problems.append("%s.channelIDs=%r; allowed: [] or [0] (the plugin refuses any other channel list)"
                        % (where, channels))
    return problems


def _top_resources_problems(where: str, resources: Any) -> List[str]:
    if resources is None:
        return []
    if not isinstance(resources, Mapping):
        return ["%s=%r; allowed: a mapping with gpus and mig" % (where, resources)]
    problems = _unknown_keys(where, resources, ("gpus", "mig"))
    if any(resources.get(kind) for kind in ("gpus", "mig")):
        problems.append("%s=%r; allowed: no resources patterns %s" % (where, dict(resources), _IGNORED_WHY))
    return problems


def _resource_problems(at: str, resource: Any, kind: str, rename_by_default: bool) -> List[str]:
    if not isinstance(resource, Mapping):
        return ["%s=%r; allowed: a mapping {name, replicas}" % (at, resource)]
    problems = _unknown_keys(at, resource, KNOWN_RESOURCE_KEYS)
    name = full_resource_name(resource.get("name"))
    if name is None:
        problems.append("%s.name=%r; allowed: %s" % (at, resource.get("name"), NAME_ALLOWED))
    elif kind == "mps" and name != GPU_RESOURCE:
        problems.append("%s.name=%r; allowed: nvidia.com/gpu only (project rule: the plugin accepts it, but MPS "
                        "shares only full GPUs, which are nvidia.com/gpu)" % (at, resource.get("name")))
    replicas = resource.get("replicas")
    if not is_whole(replicas) or replicas < 2:
        problems.append("%s.replicas=%r; allowed: an integer of at least 2 (the plugin refuses 1 and below)"
                        % (at, replicas))
    if "rename" in resource:
        rename = full_resource_name(resource["rename"])
        if rename is None:
            problems.append("%s.rename=%r; allowed: %s" % (at, resource["rename"], NAME_ALLOWED))
        elif name is not None and not (rename_by_default and rename == name + ".shared"):
            problems.append("%s.rename=%r; allowed: no rename, or renameByDefault: true (which advertises %s.shared) %s"
                            % (at, resource["rename"], name, _IGNORED_WHY))
    if "devices" in resource:
        if not devices_allowed(resource["devices"]):
            problems.append("%s.devices=%r; allowed: %s" % (at, resource["devices"], DEVICES_ALLOWED))
        elif resource["devices"] != "all":
            problems.append("%s.devices=%r; allowed: all %s" % (at, resource["devices"], _IGNORED_WHY))
    return problems


def _sharing_problems(where: str, kind: str, section: Any) -> List[str]:
    if not isinstance(section, Mapping):
        return ["%s=%r; allowed: a mapping with resources" % (where, section)]
    problems = _unknown_keys(where, section, KNOWN_SHARING_KEYS)
    problems += _typed(where, section, ("renameByDefault", "failRequestsGreaterThanOne"), is_bool, "true or false")
    resources = section.get("resources")
    if not isinstance(resources, list) or not resources:
        return problems + ["%s.resources=%r; allowed: a non-empty list of {name, replicas}" % (where, resources)]
    rename_by_default = section.get("renameByDefault") is True
    for index, resource in enumerate(resources):
        problems.extend(_resource_problems("%s.resources[%d]" % (where, index), resource, kind, rename_by_default))
    return problems


def _mps_problems(name: str, flags: Mapping[str, Any], mps_root: Optional[str]) -> List[str]:
    where = "config %r: sharing.mps" % name
    strategy = flags.get("migStrategy") or "none"
    if strategy == "mixed":
        return ["%s with flags.migStrategy='mixed'; allowed: MPS only with migStrategy none (the plugin refuses "
                "mixed)" % where]
    problems = []
    if strategy == "single":
        problems.append("%s with flags.migStrategy='single'; allowed: MPS only with migStrategy none (project rule: "
                        "the plugin starts, but its MPS daemon skips MIG devices, so nothing would be shared)" % where)
    file_root = flags.get("mpsRoot")
    if not mps_root and not file_root:
        problems.append("%s without flags.mpsRoot; allowed: MPS with flags.mpsRoot set, or an MPS_ROOT in the "
                        "plugin's environment (the plugin refuses MPS without an MPS root)" % where)
    elif mps_root and isinstance(file_root, str) and file_root and file_root != mps_root:
        problems.append("config %r: flags.mpsRoot=%r; allowed: unset, or %r (project rule: the plugin takes MPS_ROOT "
                        "from its environment over the file, so the DaemonSet's %r applies, where the MPS control "
                        "daemon runs; change nvidia_device_plugin_mps_root instead)"
                        % (name, file_root, mps_root, mps_root))
    return problems


def uses_mps(config: Any) -> bool:
    """Whether the plugin shares by MPS with this config (its SharingStrategy: an mps section that is not null)."""
    sharing = config.get("sharing") if isinstance(config, Mapping) else None
    return isinstance(sharing, Mapping) and sharing.get("mps") is not None


def config_problems(name: Any, config: Any, mps_root: Optional[str] = DEFAULT_MPS_ROOT) -> List[str]:
    """Everything wrong with one named config, for a plugin whose environment sets MPS_ROOT=mps_root (none or "":
    no MPS_ROOT, as for a plugin deployed without one)."""
    if not is_label_value(name, allow_empty=False):
        return ["config name %r; allowed: letters, digits, '-', '_', '.', at most 63 characters (it becomes a "
                "ConfigMap key and a node label value)" % (name,)]
    if not isinstance(config, Mapping):
        return ["config %r=%r; allowed: a mapping in the device plugin's version v1 format" % (name, config)]
    where = "config %r" % name
    problems = _unknown_keys(where, config, KNOWN_TOP)
    if config.get("version") not in (None, "", "v1"):
        problems.append("%s: version=%r; allowed: v1" % (where, config.get("version")))
    flags = config.get("flags")
    problems += _flags_problems(where + ": flags", flags) if flags is not None else []
    flags = flags if isinstance(flags, Mapping) else {}
    problems += _imex_problems(where + ": imex", config.get("imex"))
    problems += _top_resources_problems(where + ": resources", config.get("resources"))
    sharing = config.get("sharing")
    if sharing is None:
        return problems
    if not isinstance(sharing, Mapping):
        return problems + ["%s: sharing=%r; allowed: a mapping with timeSlicing or mps" % (where, sharing)]
    unknown = sorted(str(key) for key in set(sharing) - set(SHARING_KINDS))
    if unknown:
        problems.append("%s: unknown sharing kinds %s; allowed: timeSlicing, mps %s"
                        % (where, unknown, _UNKNOWN_KEY_WHY))
    # mps: null is no MPS (a pointer in the plugin); timeSlicing: null is read as a section without resources.
    present = [kind for kind in SHARING_KINDS if kind in sharing and (kind == "timeSlicing" or sharing[kind] is not None)]
    if len(present) > 1:
        problems.append("%s: sharing.timeSlicing and sharing.mps are both set; allowed: one of them (project rule: "
                        "the plugin silently uses mps and ignores timeSlicing)" % where)
    for kind in present:
        problems.extend(_sharing_problems("%s: sharing.%s" % (where, kind), kind, sharing[kind]))
    if "mps" in present:
        problems.extend(_mps_problems(name, flags, mps_root))
    return problems


# --- Which config serves a node, and the MIG strategy the plugin runs with there ------------------------------------
# As k8s-device-plugin v0.18.0 decides it (read in its source): the plugin container's MIG_STRATEGY environment
# variable or --mig-strategy argument, when set, wins over the config file (api/config/v1 UpdateFromCLIFlags); the file
# is the one the config-manager sidecar copies (cmd/config-manager updateConfigName): the ConfigMap key the node's label
# names (env NODE_LABEL, default nvidia.com/device-plugin.config), else DEFAULT_CONFIG, else FALLBACK_STRATEGIES in
# order ("named": the key "default"; "single": the only key; "empty": no file). A file without flags.migStrategy, or
# no file, means the flag's default, none.
CONFIG_MANAGER_LABEL = "nvidia.com/device-plugin.config"


def _env(container: Mapping[str, Any]) -> dict:
    return {str(item.get("name")): item.get("value") for item in container.get("env") or []
            if isinstance(item, Mapping) and "value" in item}


def _argument(container: Mapping[str, Any], flag: str) -> Optional[str]:
    argv = [str(a) for a in (container.get("command") or []) + (container.get("args") or [])]
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def _is_config_manager(container: Mapping[str, Any]) -> bool:
    return "CONFIG_FILE_SRCDIR" in _env(container) or "config-manager" in " ".join(
        str(a) for a in (container.get("command") or []) + (container.get("args") or []))


def _requirement(requirement: Mapping[str, Any], values: Mapping[str, str]) -> bool:
    key, operator, wanted = requirement.get("key"), requirement.get("operator"), requirement.get("values") or []
    if operator == "In":
        return key in values and values[key] in wanted
    if operator == "NotIn":
        return key not in values or values[key] not in wanted
    if operator == "Exists":
        return key in values
    if operator == "DoesNotExist":
        return key not in values
    if operator in ("Gt", "Lt") and key in values and len(wanted) == 1:
        try:
            have, limit = int(values[key]), int(wanted[0])
        except ValueError:
            return False
        return have > limit if operator == "Gt" else have < limit
    return False


def _schedules_on(pod: Mapping[str, Any], node: str, labels: Mapping[str, str]) -> bool:
    """Whether a pod spec's nodeSelector and required node affinity take the node (Kubernetes' rules: the terms are
    ORed, a term's expressions and fields ANDed; taints and tolerations are not judged here)."""
    if not all(labels.get(k) == v for k, v in (pod.get("nodeSelector") or {}).items()):
        return False
    required = (((pod.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = required.get("nodeSelectorTerms") or []
    if not terms:
        return True
    return any(all(_requirement(r, labels) for r in term.get("matchExpressions") or [])
               and all(_requirement(r, {"metadata.name": node}) for r in term.get("matchFields") or [])
               for term in terms)


def _config_name(manager: dict, keys: List[str], node_labels: Mapping[str, str]) -> Tuple[Optional[str], str]:
    """(the key the config-manager picks, or None for no file; why): raises ValueError where it would fail."""
    label = str(manager.get("NODE_LABEL") or CONFIG_MANAGER_LABEL)
    if node_labels.get(label):
        name = node_labels[label]
        if name not in keys:
            raise ValueError(f"the node's label {label}={name} names no key of it (keys: {', '.join(keys) or 'none'})")
        return name, f"the node's label {label}"
    if manager.get("DEFAULT_CONFIG"):
        name = str(manager["DEFAULT_CONFIG"])
        if name not in keys:
            raise ValueError(f"its DEFAULT_CONFIG {name} is no key of it (keys: {', '.join(keys) or 'none'})")
        return name, f"DEFAULT_CONFIG (no {label} label on the node)"
    for fallback in [s.strip() for s in str(manager.get("FALLBACK_STRATEGIES") or "").split(",") if s.strip()]:
        if fallback == "named" and "default" in keys:
            return "default", f"the fallback to the key \"default\" (no {label} label, no DEFAULT_CONFIG)"
        if fallback == "single" and len(keys) == 1:
            return keys[0], f"the fallback to its only key (no {label} label, no DEFAULT_CONFIG)"
        if fallback == "empty":
            return None, "the fallback to no config file"
    raise ValueError(f"no label, no DEFAULT_CONFIG and no fallback picks one of its keys ({', '.join(keys) or 'none'})")


def served_mig_strategies(node: str, node_labels: Mapping[str, str], daemonsets: Any,
                          config_maps: Any) -> List[dict]:
    """For each device plugin DaemonSet whose pods go to the node: {daemonset, strategy, source} or
    {daemonset, error}. daemonsets and config_maps are API objects (dicts) of the plugin's namespace."""
    import yaml  # the controller's PyYAML, as Ansible's own

    maps = {str((m.get("metadata") or {}).get("name")): m.get("data") or {} for m in config_maps or []}
    served = []
    for daemonset in daemonsets or []:
        meta = daemonset.get("metadata") or {}
        where = f"DaemonSet {meta.get('namespace')}/{meta.get('name')}"
        pod = ((daemonset.get("spec") or {}).get("template") or {}).get("spec") or {}
        if not _schedules_on(pod, node, node_labels):
            continue
        containers = [c for c in pod.get("containers") or [] if isinstance(c, Mapping)]
        managers = [c for c in containers if _is_config_manager(c)]
        plugins = [c for c in containers if not _is_config_manager(c)]
        plugin = plugins[0] if plugins else {}
        explicit = _env(plugin).get("MIG_STRATEGY") or _argument(plugin, "--mig-strategy")
        if explicit:
            served.append({"daemonset": where, "strategy": str(explicit),
                           "source": f"the plugin container's {'MIG_STRATEGY' if _env(plugin).get('MIG_STRATEGY') else '--mig-strategy'}"})
            continue
        if not managers:
            served.append({"daemonset": where, "strategy": "none",
                           "source": "the plugin's default (no MIG_STRATEGY, no config-manager)"})
            continue
        manager = _env(managers[0])
        srcdir = str(manager.get("CONFIG_FILE_SRCDIR") or "")
        mount = next((m for m in managers[0].get("volumeMounts") or [] if m.get("mountPath") == srcdir), {})
        volume = next((v for v in pod.get("volumes") or [] if v.get("name") == mount.get("name")), {})
        map_name = str((volume.get("configMap") or {}).get("name") or "")
        if map_name not in maps:
            served.append({"daemonset": where, "error": f"its configs' ConfigMap {map_name or '(none)'} does not exist"})
            continue
        try:
            key, why = _config_name(manager, sorted(maps[map_name]), node_labels)
        except ValueError as exc:
            served.append({"daemonset": where, "error": f"ConfigMap {meta.get('namespace')}/{map_name}: {exc}"})
            continue
        if key is None:
            served.append({"daemonset": where, "strategy": "none", "source": why})
            continue
        try:
            document = yaml.safe_load(maps[map_name][key]) or {}
        except yaml.YAMLError as exc:
            served.append({"daemonset": where, "error": f"ConfigMap {meta.get('namespace')}/{map_name} key {key}: "
                                                        f"not YAML ({exc})"})
            continue
        flags = document.get("flags") if isinstance(document, Mapping) else None
        strategy = (flags or {}).get("migStrategy") if isinstance(flags, Mapping) else None
        served.append({"daemonset": where, "strategy": str(strategy or "none"),
                       "source": f"ConfigMap {meta.get('namespace')}/{map_name} key {key}, chosen by {why}"})
    return served
