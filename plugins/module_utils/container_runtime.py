# -*- coding: utf-8 -*-
# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)
"""Pure logic for wiring the NVIDIA runtime into containerd: TOML out, import lines, drop-in content.

containerd 1.x (config version 2) merges an imported file by replacing each of its `plugins` sections whole. A drop-in
that defines only the nvidia runtime would therefore wipe the user's CRI settings (sandbox image, runc's SystemdCgroup,
registry mirrors). So the drop-in carries the user's effective CRI runtime section, read from config.toml and the
files it imports, with the nvidia runtime merged in. config.toml itself gets one change only: our drop-in in its
`imports` list; every other key stays exactly as the user wrote it (checked by parsing before and after).
"""

from __future__ import annotations

import datetime
import fnmatch
import json
import re

from ansible_collections.gpu_ops.cluster.plugins.module_utils.support_matrix import CONTAINERD_CONFIG_VERSIONS

# Where the CRI plugin keeps its runtimes, per config schema version. Version 4 (containerd 2.3) moved only the server
# settings (grpc, ttrpc, debug, metrics) into plugins (containerd's own migration, serviceMigrate); the CRI plugins
# kept their names.
CRI_RUNTIME_PLUGIN = {2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime",
                      4: "io.containerd.cri.v1.runtime"}
# support_matrix's table as ((major, minor), version), newest line first.
CONFIG_VERSION_SINCE = sorted(((tuple(int(part) for part in line.split(".")), version)
                               for line, version in CONTAINERD_CONFIG_VERSIONS.items()), reverse=True)
SUPPORTED_RANGE = ", ".join(f"{version} (containerd {line} and later)"
                            for line, version in sorted(CONTAINERD_CONFIG_VERSIONS.items(), key=lambda item: item[1]))
RUNC_V2 = "io.containerd.runc.v2"
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_VERSION = re.compile(r"containerd\s+\S+\s+v?(?P<major>\d+)\.(?P<minor>\d+)")


class ConfigError(Exception):
    """Input the module must refuse before it changes anything."""


# ---------------------------------------------------------------------------------------------------------------------
# TOML writing (tomllib reads; nothing in the standard library writes)
# ---------------------------------------------------------------------------------------------------------------------


def toml_key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else toml_string(key)


def toml_string(value: str) -> str:
    # JSON's escapes (\" \\ \n \t \uXXXX for control characters) are all valid in a TOML basic string; TOML also
    # forbids a raw DEL, which JSON leaves alone.
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")


def toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + "}"
    raise ConfigError(f"cannot write a {type(value).__name__} value to TOML: {value!r}")


def _is_table_array(value: object) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(item, dict) for item in value)


def toml_dumps(document: dict) -> str:
    """Serialise a parsed TOML document (nested dicts) so that tomllib reads back an equal document."""
    lines: list[str] = []
    _emit_table(document, [], lines, header=False)
    return "\n".join(lines).strip("\n") + "\n"


def _emit_table(table: dict, path: list[str], lines: list[str], header: bool, array: bool = False) -> None:
    scalars = {k: v for k, v in table.items() if not isinstance(v, dict) and not _is_table_array(v)}
    if header:
        lines.append("")
        name = ".".join(toml_key(part) for part in path)
        lines.append(f"[[{name}]]" if array else f"[{name}]")
    for key, value in scalars.items():
        lines.append(f"{toml_key(key)} = {toml_value(value)}")
    for key, value in table.items():
        if isinstance(value, dict):
            # A table with only sub-tables needs no header of its own unless it is empty.
            has_own = not value or any(not isinstance(v, dict) for v in value.values())
            _emit_table(value, path + [key], lines, header=has_own)
        elif _is_table_array(value):
            for item in value:
                _emit_table(item, path + [key], lines, header=True, array=True)


# ---------------------------------------------------------------------------------------------------------------------
# Versions and merging
# ---------------------------------------------------------------------------------------------------------------------


def containerd_release(version_output: str) -> tuple[int, int]:
    """(major, minor) from `containerd --version` ("containerd github.com/containerd/containerd 1.6.20~ds1 ...")."""
    match = _VERSION.search(version_output)
    if not match:
        raise ConfigError(f"cannot read a version from `containerd --version`: {version_output.strip()!r}")
    return int(match["major"]), int(match["minor"])


def native_config_version(release: tuple[int, int]) -> int:
    """The config version the containerd release writes itself (`containerd config default`), which it reads
    without migrating: what a new config.toml gets."""
    for since, version in CONFIG_VERSION_SINCE:
        if release >= since:
            return version
    return CONFIG_VERSION_SINCE[-1][1]


def deep_merge(base: dict, override: dict) -> dict:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def effective_plugin_section(documents: list[dict], plugin: str, replace_sections: bool) -> dict:
    """The plugin's section as containerd sees it after merging documents in order (config.toml first).

    containerd 1.x replaces a whole plugin section with the last file's; 2.x merges them key by key.
    """
    section: dict = {}
    for document in documents:
        found = document.get("plugins", {}).get(plugin)
        if isinstance(found, dict):
            section = dict(found) if replace_sections else deep_merge(section, found)
    return section


def config_schema_version(document: dict, exists: bool, release: tuple[int, int]) -> int:
    """Schema version of config.toml: its own `version`, or containerd's native one for a new file. The drop-in is
    written in this version, never in a newer one (a `config dump`'s): containerd 2.3.2 refuses to start on an import
    whose version is higher than config.toml's (NVIDIA/aicr#1688, a toolkit's version 4 drop-in beside AKS's version
    2 config)."""
    if not exists:
        return native_config_version(release)
    version = document.get("version")
    if version is None:
        raise ConfigError(
            "the existing containerd config has no `version` line, which containerd reads as version 1 "
            "(not supported: convert it with `containerd config migrate`, or add `version = 2` if it is already "
            "in the version 2 format)"
        )
    if isinstance(version, bool) or version not in CRI_RUNTIME_PLUGIN:
        raise ConfigError(f"the containerd config has version = {version!r}; supported: {SUPPORTED_RANGE}")
    if version > native_config_version(release):
        first = next(since for since, newest in reversed(CONFIG_VERSION_SINCE) if newest >= version)
        needs = ".".join(str(part) for part in first)
        raise ConfigError(f"the containerd config has version = {version}, but the installed containerd is "
                          f"{release[0]}.{release[1]}, which reads config versions up to "
                          f"{native_config_version(release)} (version {version} needs containerd {needs} or later)")
    return version


def import_covers(entries: list[str], path: str) -> bool:
    """Whether an `imports` entry (a path or a glob) already names path."""
    return any(entry == path or fnmatch.fnmatchcase(path, entry) for entry in entries)


def wanted_runtime(binary: str, systemd_cgroup: bool, existing: dict) -> dict:
    """The nvidia runtime's table: the user's extra keys kept, ours set."""
    options = deep_merge(existing.get("options", {}) if isinstance(existing.get("options"), dict) else {},
                         {"BinaryName": binary, "SystemdCgroup": systemd_cgroup})
    return deep_merge(existing, {"runtime_type": RUNC_V2, "options": options})


def systemd_cgroup_choice(setting: str, base_section: dict, systemd_pid1: bool) -> bool:
    """auto: what runc is set to in the user's config, else whether systemd runs the host."""
    if setting in ("true", "false"):
        return setting == "true"
    runc = base_section.get("containerd", {}).get("runtimes", {}).get("runc", {})
    user = runc.get("options", {}).get("SystemdCgroup") if isinstance(runc, dict) else None
    return user if isinstance(user, bool) else systemd_pid1


def dropin_document(version: int, base_section: dict, runtime_name: str, binary: str, systemd_cgroup: bool,
                    set_as_default: bool) -> dict:
    plugin = CRI_RUNTIME_PLUGIN[version]
    section = json.loads(json.dumps(base_section, default=str))  # a deep copy of plain data
    containerd = section.setdefault("containerd", {})
    runtimes = containerd.setdefault("runtimes", {})
    runtimes[runtime_name] = wanted_runtime(binary, systemd_cgroup, runtimes.get(runtime_name, {}))
    if set_as_default:
        containerd["default_runtime_name"] = runtime_name
    return {"version": version, "plugins": {plugin: section}}


# The drop-in's first line marks it as the role's own: a file at the drop-in's path without it belongs to someone else
# (the GPU Operator's toolkit, a hand-run `nvidia-ctk runtime configure`) and is never overwritten unless asked.
DROPIN_MARKER = "# Managed by Ansible (role nvidia_container_toolkit)"
DROPIN_HEADER = (
    DROPIN_MARKER + ": the {name} runtime for containerd.\n"
    "# containerd 1.x replaces a whole plugin section on import, so this file also carries a copy of the CRI runtime\n"
    "# settings found in {config}: change those there and re-run the role; changes made here are overwritten.\n"
)


def render_dropin(document: dict, runtime_name: str, config_path: str) -> str:
    return DROPIN_HEADER.format(name=runtime_name, config=config_path) + "\n" + toml_dumps(document)


# ---------------------------------------------------------------------------------------------------------------------
# Editing config.toml's imports without touching anything else
# ---------------------------------------------------------------------------------------------------------------------


def _top_level_end(text: str) -> int:
    """Offset of the first table header: top-level keys must come before it."""
    match = re.search(r"^[ \t]*\[", text, re.MULTILINE)
    return match.start() if match else len(text)


def _array_end(text: str, start: int) -> int:
    """Offset just past the `]` closing the array that opens at text[start] == '['."""
    depth, index, quote = 0, start, ""
    while index < len(text):
        char = text[index]
        if quote:
            if char == "\\" and quote == '"':
                index += 1
            elif char == quote:
                quote = ""
        elif char in "\"'":
            quote = char
        elif char == "#":
            index = text.find("\n", index)
            if index < 0:
                break
        elif char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth == 0:
                return index + 1
        index += 1
    raise ConfigError("the `imports` array in the containerd config is not closed")


def set_imports(text: str, entries: list[str]) -> str:
    """Rewrite (or add) the top-level `imports = [...]`, leaving every other byte of the file as it was."""
    rendered = "imports = " + toml_value(entries)
    head_end = _top_level_end(text)
    match = re.search(r"^[ \t]*imports[ \t]*=[ \t]*(?=\[)", text[:head_end], re.MULTILINE)
    if match:
        end = _array_end(text, match.end())
        return text[:match.start()] + rendered + text[end:]
    version = re.search(r"^[ \t]*version[ \t]*=.*$", text[:head_end], re.MULTILINE)
    if version:
        return text[:version.end()] + "\n" + rendered + text[version.end():]
    return rendered + "\n" + text


def without_imports(document: dict) -> dict:
    return {key: value for key, value in document.items() if key != "imports"}
