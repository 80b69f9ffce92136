# -*- coding: utf-8 -*-
# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)
"""MIG layouts in NVIDIA mig-parted's format, checked and planned against what a node's GPUs have now.

mig-parted's config file (api/spec/v1 Spec) is `{version: v1, mig-configs: {<name>: [...]}}`; its loader refuses a
file without `version`, a version other than v1, any other top-level key, and an empty `mig-configs`.
A named config (mig-parted's `mig-configs: {<name>: [...]}`) is a list of entries, each
`{device-filter: <id> | [<id>, ...] (optional), devices: all | [index, ...], mig-enabled: bool,
mig-devices: {"1g.10gb": 2, ...}}`. Which entry a GPU gets follows mig-parted (api/spec/v1 MatchesDeviceFilter and
MatchesDevices, walked by WalkSelectedMigConfigForEachGPU for `apply` and `assert`):

- `device-filter` is a PCI id, `0x<device><vendor>` as `0x233010DE` (H100 80GB HBM3), optionally followed by
  `:0x<subsystem device><subsystem vendor>`; each part is read as Go's strconv.ParseUint(text, 0, 32) reads it, so
  `0x` (or `0X`) means hex, digits are of any case, and a number without a prefix is decimal. A list matches a GPU
  when any of its ids does; no filter, `""` or `[]` matches every GPU. Without a subsystem part only the device and
  vendor ids are compared; with one, all four.
- `devices: all` takes every GPU the filter matches, except those that cannot do MIG (mig-parted skips them);
  `devices: [0, 2]` takes those indexes when the filter matches them too.
- The entries are applied in order, so when several take the same GPU the last one is what the GPU ends with.
- A GPU no entry takes is left as it is.

The plan compares each taken GPU's MIG mode and GPU instances (by profile, counted) with its entry: nothing is
destroyed on a GPU that already has the wanted instances, whatever their order or placement.

Pure functions (parsing nvidia-smi's output, checks, plans); the module nvidia_mig runs the commands.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ansible_collections.gpu_ops.cluster.plugins.module_utils import mig_profiles

STRATEGIES = ("none", "single", "mixed")
ENTRY_KEYS = ("device-filter", "devices", "mig-enabled", "mig-devices")
# mig-parted's config file: the one version its loader reads (api/spec/v1 Version) and the keys it allows.
PARTED_VERSION = "v1"
PARTED_KEYS = ("version", "mig-configs")

# Go's strconv.ParseUint(s, 0, 32) literal forms (base prefix, or a leading 0 for octal; `_` only between digits or
# after a prefix), which mig-parted's types.NewDeviceIDFromString uses for each side of "<id>[:<subsystem id>]".
_GO_UINT = (
    (re.compile(r"0[xX](?:_?[0-9a-fA-F])+"), 16),
    (re.compile(r"0[bB](?:_?[01])+"), 2),
    (re.compile(r"0[oO](?:_?[0-7])+"), 8),
    (re.compile(r"0(?:_?[0-7])+"), 8),
    (re.compile(r"0|[1-9](?:_?[0-9])*"), 10),
)

# `nvidia-smi mig -lgi`: "|   0  MIG 3g.20gb       9        1          4:4     |"
_LGI_ROW = re.compile(r"^\|\s*(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)\s+(\d+):(\d+)\s*\|")
# `nvidia-smi -L`: "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-...)" then "  MIG 1g.10gb     Device  0: (UUID: MIG-...)"
_L_GPU = re.compile(r"^GPU\s+(\d+):\s+(.*?)\s+\(UUID:\s*([^)\s]+)\)\s*$")
_L_MIG = re.compile(r"^\s+MIG\s+(\S+)\s+Device\s+(\d+):\s+\(UUID:\s*([^)\s]+)\)\s*$")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _go_uint32(text: str) -> Optional[int]:
    for pattern, base in _GO_UINT:
        if pattern.fullmatch(text):
            digits = text.replace("_", "")
            value = int(digits[2:] if base != 10 and digits[1:2].isalpha() else digits, base)
            return value if value <= 0xFFFFFFFF else None
    return None


def parse_device_id(text: Any) -> Optional[Tuple[int, Optional[int]]]:
    """(device << 16 | vendor, subsystem device << 16 | subsystem vendor or None) from a device-filter id such as
    "0x233010DE" or "0x233010DE:0x16C110DE"; None when mig-parted could not read it (it then matches no GPU)."""
    if not isinstance(text, str):
        return None
    parts = text.split(":")
    if len(parts) > 2:
        return None
    values = [_go_uint32(part) for part in parts]
    if any(value is None for value in values):
        return None
    return values[0], (values[1] if len(values) == 2 else None)


def format_device_id(value: int) -> str:
    """mig-parted's DeviceID.String() form, as nvidia-smi prints pci.device_id: 0x233010DE."""
    return "0x%08X" % value


def device_filter_ids(device_filter: Any) -> List[str]:
    """The filter's ids as a list (a string is one id; "" and [] are no filter)."""
    if device_filter is None or device_filter == "":
        return []
    return [device_filter] if isinstance(device_filter, str) else list(device_filter)


def device_filter_problems(device_filter: Any, where: str) -> List[str]:
    """The form mig-parted's loader takes (a string or a list of strings), and ids it can read."""
    if device_filter is None:
        return []
    if not (isinstance(device_filter, str)
            or (isinstance(device_filter, list) and all(isinstance(i, str) for i in device_filter))):
        return [f"{where}.device-filter={device_filter!r}: must be a PCI device id string or a list of them, quoted "
                f"(as \"0x233010DE\": YAML reads an unquoted 0x233010DE as a number, which mig-parted refuses)"]
    problems = []
    for number, text in enumerate(device_filter_ids(device_filter)):
        if parse_device_id(text) is None:
            at = f"{where}.device-filter" + (f"[{number}]" if isinstance(device_filter, list) else "")
            problems.append(f"{at}={text!r}: not a PCI id mig-parted can read (it would match no GPU); write "
                            f"0x<device><vendor> as nvidia-smi --query-gpu=pci.device_id prints it, e.g. 0x233010DE, "
                            f"optionally followed by :0x<subsystem device><subsystem vendor> (pci.sub_device_id)")
    return problems


def matches_device_filter(device_filter: Any, gpu: Mapping[str, Any]) -> bool:
    """mig-parted's MatchesDeviceFilter: no filter matches every GPU; else any id whose device and vendor (and, when
    the id names one, subsystem) equal the GPU's pci_device_id (and pci_sub_system_id)."""
    ids = device_filter_ids(device_filter)
    if not ids:
        return True
    device = parse_device_id(gpu.get("pci_device_id") or "")
    subsystem = parse_device_id(gpu.get("pci_sub_system_id") or "")
    for text in ids:
        wanted = parse_device_id(text)
        if wanted is None or device is None or wanted[0] != device[0]:
            continue
        if wanted[1] is None or (subsystem is not None and wanted[1] == subsystem[0]):
            return True
    return False


def entry_problems(entries: Any, path: str) -> List[str]:
    """Format problems of one named config (a list of entries), each naming its full path, value and what is allowed."""
    if not isinstance(entries, list) or not entries:
        return [f"{path}={entries!r}: must be a non-empty list of {{devices, mig-enabled, mig-devices}} entries"]
    problems: List[str] = []
    for number, entry in enumerate(entries):
        where = f"{path}[{number}]"
        if not isinstance(entry, Mapping):
            problems.append(f"{where}={entry!r}: must be a mapping with devices, mig-enabled and mig-devices")
            continue
        unknown = sorted(set(entry) - set(ENTRY_KEYS))
        if unknown:
            problems.append(f"{where}: unknown keys {', '.join(map(str, unknown))}; allowed: {', '.join(ENTRY_KEYS)}")
        problems.extend(device_filter_problems(entry.get("device-filter"), where))
        devices = entry.get("devices")
        if not (devices == "all" or (isinstance(devices, list) and devices
                                     and all(_is_int(i) and i >= 0 for i in devices))):
            problems.append(f"{where}.devices={devices!r}: must be 'all' or a non-empty list of GPU indexes (0 or more)")
        elif isinstance(devices, list) and len(set(devices)) != len(devices):
            problems.append(f"{where}.devices={devices!r}: names a GPU twice")
        enabled = entry.get("mig-enabled")
        if not isinstance(enabled, bool):
            problems.append(f"{where}.mig-enabled={enabled!r}: must be true or false")
        if enabled is True and "mig-devices" not in entry:
            # mig-parted's loader: "missing required field 'mig-devices' when 'mig-enabled' is true"
            problems.append(f"{where}: mig-enabled true needs mig-devices (mig-parted refuses the entry without it; "
                            f"write mig-devices: {{}} for MIG mode with no instances)")
        wanted = entry.get("mig-devices", {})
        if wanted is None:
            wanted = {}
        if not isinstance(wanted, Mapping):
            problems.append(f"{where}.mig-devices={wanted!r}: must be a mapping of MIG profile to count")
            continue
        for profile, count in wanted.items():
            if not _is_int(count) or count < 0:
                problems.append(f"{where}.mig-devices[{profile!r}]={count!r}: must be a whole number, 0 or more")
        if enabled is False and any(c for c in wanted.values() if _is_int(c)):
            problems.append(f"{where}: mig-devices {dict(wanted)!r} with mig-enabled false; MIG devices need "
                            f"mig-enabled: true")
    return problems


def configs_problems(configs: Any, path: str = "nvidia_mig_configs") -> List[str]:
    if not isinstance(configs, Mapping):
        return [f"{path}={configs!r}: must be a mapping of config name to a list of entries"]
    problems: List[str] = []
    for name, entries in configs.items():
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?", name):
            problems.append(f"{path} key {name!r}: a config name must be a valid label value (it becomes the node "
                            f"label nvidia.com/mig.config)")
        problems.extend(entry_problems(entries, f"{path}[{name!r}]"))
    return problems


def parted_config_problems(document: Any, path: str = "nvidia_mig_parted_config") -> List[str]:
    """Problems of a whole mig-parted config file, as its loader (api/spec/v1 Spec.UnmarshalJSON) finds them, then
    each config's entries as configs_problems finds them; every message names its path, value and what is allowed.
    {} or null is no file (mig-parted takes an empty file too)."""
    if document is None or (isinstance(document, Mapping) and not document):
        return []
    if not isinstance(document, Mapping):
        return [f"{path}={document!r}: must be mig-parted's config file, a mapping; allowed: "
                f"{{version: {PARTED_VERSION}, mig-configs: {{<name>: [entries]}}}}"]
    problems: List[str] = []
    unknown = sorted(map(str, set(document) - set(PARTED_KEYS)))
    if unknown:
        problems.append(f"{path}: unexpected keys {', '.join(unknown)} (mig-parted refuses the file); allowed: "
                        f"{', '.join(PARTED_KEYS)}")
    if "version" not in document:
        problems.append(f"{path}: no version (mig-parted refuses a file without one); allowed: version: "
                        f"{PARTED_VERSION}")
    elif document["version"] != PARTED_VERSION:
        problems.append(f"{path}.version={document['version']!r}: not a version mig-parted reads (api/spec/v1); "
                        f"allowed: {PARTED_VERSION!r}")
    if "mig-configs" in document:
        configs = document["mig-configs"]
        if isinstance(configs, Mapping) and not configs:
            problems.append(f"{path}.mig-configs={{}}: mig-parted needs at least one config there; allowed: a "
                            f"mapping of config name to a list of entries, or no mig-configs key")
        else:
            problems.extend(configs_problems(configs, f"{path}.mig-configs"))
    return problems


def parted_configs(document: Any) -> Dict[str, Any]:
    """The configs of a whole mig-parted config file ({} when there is none, or it is not well formed)."""
    configs = document.get("mig-configs") if isinstance(document, Mapping) else None
    return dict(configs) if isinstance(configs, Mapping) else {}


def defined_twice_problems(document: Any, configs: Any, document_path: str = "nvidia_mig_parted_config",
                           configs_path: str = "nvidia_mig_configs") -> List[str]:
    """A config name in both the whole file and the mapping is refused: neither silently replaces the other."""
    both = sorted(set(parted_configs(document)) & set(configs if isinstance(configs, Mapping) else {}), key=str)
    return [f"{configs_path}[{name!r}]: also defined in {document_path}.mig-configs; allowed: each config name "
            f"once (rename one)" for name in both]


def known_configs(builtin: Any, document: Any, configs: Any) -> Dict[str, Any]:
    """Config name -> entries a node can be given: the built-ins, replaced by the whole file's configs and by the
    mapping's (the preflight refuses a name the two inputs both define)."""
    known = dict(builtin or {})
    known.update(parted_configs(document))
    known.update(configs if isinstance(configs, Mapping) else {})
    return known


def desired_by_gpu(entries: Sequence[Mapping[str, Any]], gpus: Sequence[Mapping[str, Any]], path: str
                   ) -> Tuple[Dict[int, Dict[str, Any]], List[str]]:
    """GPU index -> {enabled, devices, entry} for each GPU an entry takes, as mig-parted walks them: in entry order,
    a GPU taken when the entry's device-filter matches its PCI id and its devices name it (`all`: every matching
    MIG-capable GPU); a later entry replaces an earlier one's. Problems: an index the node lacks (the project's rule:
    mig-parted would skip it silently, which hides a typo)."""
    wanted: Dict[int, Dict[str, Any]] = {}
    problems: List[str] = []
    indexes = [gpu["index"] for gpu in gpus]
    for number, entry in enumerate(entries):
        devices = entry.get("devices")
        if devices != "all":
            for index in devices:
                if index not in indexes:
                    problems.append(f"{path}[{number}].devices names GPU {index}; the node has GPUs "
                                    f"{', '.join(map(str, indexes)) or 'none'}")
        for gpu in gpus:
            if not matches_device_filter(entry.get("device-filter"), gpu):
                continue
            if devices == "all":
                if not gpu.get("mig_capable"):
                    continue  # mig-parted's apply: "Skipping -- non MIG-capable GPU"
            elif gpu["index"] not in devices:
                continue
            enabled = bool(entry.get("mig-enabled"))
            layout = {mig_profiles.canonical_profile_name(p): int(c)
                      for p, c in (entry.get("mig-devices") or {}).items() if int(c)}
            wanted[gpu["index"]] = {"enabled": enabled, "devices": layout if enabled else {}, "entry": number}
    return wanted, problems


def fit_problems(gpus: Sequence[Mapping[str, Any]], wanted: Mapping[int, Mapping[str, Any]], node: str) -> List[str]:
    """Each wanted GPU must support MIG (when enabled) and its layout must exist and fit that product."""
    problems: List[str] = []
    by_index = {gpu["index"]: gpu for gpu in gpus}
    for index, want in sorted(wanted.items()):
        gpu = by_index[index]
        where = f"node {node}, GPU {index} ({gpu['name']})"
        if not want["enabled"]:
            continue
        if not gpu.get("mig_capable"):
            problems.append(f"{where}: not MIG-capable (nvidia-smi reports MIG mode {gpu.get('mig_mode_raw')!r}); "
                            f"give it mig-enabled: false or leave it out of the config's devices")
            continue
        problems.extend(mig_profiles.layout_problems(gpu["name"], want["devices"], where))
    return problems


def instance_counts(gpu: Mapping[str, Any]) -> Dict[str, int]:
    """Profile -> how many GPU instances the GPU has now."""
    return mig_profiles.counts([instance["profile"] for instance in gpu.get("instances") or []])


def final_layout(gpus: Sequence[Mapping[str, Any]], wanted: Mapping[int, Mapping[str, Any]]
                 ) -> Dict[int, Dict[str, Any]]:
    """GPU index -> {enabled, devices} once the layout is applied: the wanted state, or what a GPU the config does
    not name has now."""
    return {gpu["index"]: dict(wanted.get(gpu["index"]) or {"enabled": gpu.get("mig_mode") == "enabled",
                                                            "devices": instance_counts(gpu)})
            for gpu in gpus}


def strategy_problems(strategy: str, gpus: Sequence[Mapping[str, Any]], wanted: Mapping[int, Mapping[str, Any]],
                      node: str, config: str) -> List[str]:
    """Whether the device plugin's MIG strategy can serve the node's GPUs as the layout leaves them."""
    if strategy not in STRATEGIES:
        return [f"MIG strategy {strategy!r}: allowed {', '.join(STRATEGIES)}"]
    final = final_layout(gpus, wanted)
    enabled = {i: f for i, f in final.items() if f["enabled"]}
    if not enabled:
        return []
    if strategy == "none":
        return [f"node {node}: config {config!r} enables MIG on GPUs {', '.join(map(str, sorted(enabled)))}, but the "
                f"device plugin's MIG strategy is none (it would advertise whole GPUs that no longer exist); set the "
                f"node's device plugin config to migStrategy single or mixed"]
    if strategy == "single":
        layouts = {tuple(sorted(f["devices"].items())) for f in final.values()}
        profiles = {p for f in final.values() for p in f["devices"]}
        if len(enabled) != len(final) or len(profiles) != 1 or len(layouts) != 1:
            shown = "; ".join(f"GPU {i}: {f['devices'] if f['enabled'] else 'MIG disabled'}"
                              for i, f in sorted(final.items()))
            return [f"node {node}: config {config!r} with the device plugin's MIG strategy single needs every GPU "
                    f"split into the same count of one profile ({shown}); use migStrategy mixed for this layout"]
    return []


def parse_lgi(text: str) -> Dict[int, List[Dict[str, Any]]]:
    """GPU index -> its GPU instances from `nvidia-smi mig -lgi`."""
    out: Dict[int, List[Dict[str, Any]]] = {}
    for line in text.splitlines():
        match = _LGI_ROW.match(line.strip())
        if match:
            gpu, profile, profile_id, instance, start, size = match.groups()
            out.setdefault(int(gpu), []).append({
                "profile": mig_profiles.canonical_profile_name(profile), "profile_id": int(profile_id),
                "gpu_instance_id": int(instance), "placement": [int(start), int(size)]})
    return out


def parse_list(text: str) -> List[Dict[str, Any]]:
    """GPUs and their MIG devices (profile, UUID) from `nvidia-smi -L`."""
    gpus: List[Dict[str, Any]] = []
    for line in text.splitlines():
        gpu = _L_GPU.match(line)
        if gpu:
            gpus.append({"index": int(gpu.group(1)), "name": gpu.group(2), "uuid": gpu.group(3), "mig_devices": []})
            continue
        mig = _L_MIG.match(line)
        if mig and gpus:
            gpus[-1]["mig_devices"].append({"profile": mig_profiles.canonical_profile_name(mig.group(1)),
                                            "device": int(mig.group(2)), "uuid": mig.group(3)})
    return gpus


def pci_id_of(value: Optional[str]) -> Optional[str]:
    """nvidia-smi's pci.device_id / pci.sub_device_id ("0x233010DE") in the one form the facts use; None for N/A."""
    parsed = parse_device_id((value or "").strip())
    return format_device_id(parsed[0]) if parsed is not None and parsed[1] is None else None


def mode_of(value: Optional[str]) -> Optional[str]:
    """"Enabled"/"Disabled" -> enabled/disabled; "[N/A]", "N/A", "[Not Supported]" -> None (no MIG)."""
    text = (value or "").strip().lower()
    return text if text in ("enabled", "disabled") else None


def plan(gpus: Sequence[Mapping[str, Any]], wanted: Mapping[int, Mapping[str, Any]]) -> List[Dict[str, Any]]:
    """Per wanted GPU that differs: what to do. Keys: index, mode (enable/disable/None: switch the pending mode),
    destroy (its GPU instances go), create (the wanted ones are made), before/after ({enabled, devices})."""
    by_index = {gpu["index"]: gpu for gpu in gpus}
    actions = []
    for index, want in sorted(wanted.items()):
        gpu = by_index[index]
        have_devices = instance_counts(gpu)
        # The mode that counts is the one pending: a GPU already switched but not yet reset needs no new switch.
        pending = gpu.get("mig_mode_pending") or gpu.get("mig_mode")
        mode = None
        if want["enabled"] and pending != "enabled":
            mode = "enable"
        elif not want["enabled"] and pending == "enabled":
            mode = "disable"
        effective = gpu.get("mig_mode") == "enabled"
        differ = have_devices != want["devices"]
        create = want["enabled"] and differ and bool(want["devices"])
        destroy = bool(have_devices) and differ
        if mode or create or destroy or want["enabled"] != effective:
            actions.append({"index": index, "mode": mode, "create": create, "destroy": destroy,
                            "before": {"enabled": effective, "devices": have_devices},
                            "after": {"enabled": want["enabled"], "devices": dict(want["devices"])}})
    return actions


def expected_resources(strategy: str, layout: Mapping[int, Mapping[str, Any]], gpu_count: int) -> Dict[str, int]:
    """What the device plugin should advertise on the node once the layout is in place (GPU index -> final state)."""
    enabled = {i: f for i, f in layout.items() if f["enabled"]}
    whole = gpu_count - len(enabled)
    resources: Dict[str, int] = {}
    if strategy == "none" or not enabled:
        return {"nvidia.com/gpu": gpu_count}
    if strategy == "single":
        return {"nvidia.com/gpu": sum(sum(f["devices"].values()) for f in enabled.values())}
    if whole:
        resources["nvidia.com/gpu"] = whole
    for final in enabled.values():
        for profile, count in final["devices"].items():
            key = mig_profiles.resource_name(profile)
            resources[key] = resources.get(key, 0) + count
    return resources
