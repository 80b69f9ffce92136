# -*- coding: utf-8 -*-
# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)
"""The plan of the NVIDIA runtime's containerd drop-in, shared by the nvidia_containerd_runtime module (which writes it)
and host_probe (which reads it in a node role's one probe): config.toml and the drop-in as they are and as they would
be, and containerd's own `config dump` of the planned files (copies in a scratch directory, so nothing changes).
"""

from __future__ import annotations

import glob
import os
import tempfile
from typing import Callable

from ansible_collections.gpu_ops.cluster.plugins.module_utils.container_runtime import (
    CRI_RUNTIME_PLUGIN,
    DROPIN_MARKER,
    ConfigError,
    config_schema_version,
    containerd_release,
    dropin_document,
    effective_plugin_section,
    import_covers,
    render_dropin,
    set_imports,
    systemd_cgroup_choice,
    without_imports,
)

# The plan's parameters as an argument spec: nvidia_containerd_runtime takes them (with verify and state), host_probe
# takes them as its containerd option.
PLAN_OPTIONS = {
    "config_path": {"type": "path", "default": "/etc/containerd/config.toml"},
    "drop_in_path": {"type": "path", "default": "/etc/containerd/conf.d/99-nvidia.toml"},
    "containerd_binary": {"type": "path", "default": "containerd"},
    "runtime_name": {"type": "str", "default": "nvidia"},
    "runtime_binary": {"type": "path", "default": "/usr/bin/nvidia-container-runtime"},
    "set_as_default": {"type": "bool", "default": False},
    "systemd_cgroup": {"type": "str", "choices": ["auto", "true", "false"], "default": "auto"},
    "take_over": {"type": "bool", "default": False},
}

# A hand-run `nvidia-ctk runtime configure` writes here since toolkit 1.18, as does the GPU Operator's toolkit.
NVIDIA_CTK_DROP_IN = "/etc/containerd/conf.d/99-nvidia.toml"
CHOICES = ("Choose one: leave containerd's NVIDIA runtime to that owner (take containerd out of "
           "nvidia_container_toolkit_runtimes), or let the role replace it with its own (nvidia_container_toolkit_take_over: "
           "true, after switching the other owner off: the GPU Operator's toolkit with spec.toolkit.enabled=false in "
           "its ClusterPolicy)")

try:
    import tomllib
except ImportError:  # Python < 3.11
    tomllib = None


def read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def parse(text: str, path: str) -> dict:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML ({exc}); it was left as it is") from exc


def imported_files(entries: list[str], base_dir: str) -> list[str]:
    """Files containerd merges after config.toml, in its order (globs expanded sorted; relative to config.toml)."""
    files: list[str] = []
    for entry in (os.path.join(base_dir, entry) for entry in entries):
        matches = sorted(glob.glob(entry)) if glob.has_magic(entry) else [entry]
        for path in matches:
            if path not in files:  # an explicit entry counts even before its file exists (the drop-in's own)
                files.append(path)
    return files


def imported_before_ours(entries: list[str], ours: str, base_dir: str) -> list[str]:
    """Files containerd merges before our drop-in, in its order (globs expanded sorted; relative to config.toml)."""
    files: list[str] = []
    for path in imported_files(entries, base_dir):
        if path == ours:
            return files
        if os.path.isfile(path):
            files.append(path)
    return files


def is_own_drop_in(text: str | None) -> bool:
    """Whether the file at the drop-in's path is the role's (missing counts as ours: nothing to overwrite)."""
    return text is None or text.startswith(DROPIN_MARKER)


def foreign_drop_in_problem(drop_in: str, text: str | None) -> str:
    """Why the file at the drop-in's path must not be overwritten, or '' when it is the role's or missing."""
    if is_own_drop_in(text):
        return ""
    who = ("the GPU Operator's toolkit or a hand-run `nvidia-ctk runtime configure` writes there since toolkit 1.18"
           if drop_in == NVIDIA_CTK_DROP_IN else "another tool or a person wrote it")
    return (f"{drop_in} exists and this role did not write it (its first line is not {DROPIN_MARKER!r}; {who}). "
            f"It was left as it is and nothing was changed. {CHOICES}.")


def runtime_definers(files: list[tuple[str, dict]], version: int, runtime_name: str) -> list[str]:
    """The files (path, parsed) that define containerd's runtime runtime_name in the CRI plugin of `version`."""
    plugin = CRI_RUNTIME_PLUGIN[version]
    found = []
    for path, document in files:
        section = ((document.get("plugins") or {}).get(plugin) or {}).get("containerd") or {}
        if runtime_name in (section.get("runtimes") or {}):
            found.append(path)
    return found


def foreign_runtime_problem(config_path: str, entries: list[str], document: dict, version: int, params: dict) -> str:
    """Why another file's definition of the runtime stops the role, or ''. One in config.toml or a file imported
    before the drop-in is another owner's (the drop-in would override it silently): refused unless take_over. One in
    a file imported after the drop-in overrides the role's whatever it writes: always refused."""
    drop_in, name = params["drop_in_path"], params["runtime_name"]
    files = imported_files(entries, os.path.dirname(config_path))
    position = files.index(drop_in) if drop_in in files else len(files)
    # The role's own files are never another owner's: a drop-in an earlier run wrote at another path (the path
    # setting changed since) carries the same header.
    parsed = [(path, parse(text, path)) for path, text in ((path, read_text(path) or "") for path in files
                                                           if path != drop_in and os.path.isfile(path))
              if not text.startswith(DROPIN_MARKER)]
    before = runtime_definers([(config_path, document)] + [item for item in parsed if files.index(item[0]) < position],
                              version, name)
    after = runtime_definers([item for item in parsed if files.index(item[0]) > position], version, name)
    if after:
        return (f"containerd's runtime {name!r} is also defined in {', '.join(after)}, which {config_path} imports "
                f"after the role's drop-in {drop_in}, so it would override the role's whatever it writes: nothing was "
                f"changed. Remove that file or its runtime {name!r} (or take containerd out of "
                f"nvidia_container_toolkit_runtimes to leave the runtime to that owner).")
    if before and not params.get("take_over"):
        return (f"containerd's runtime {name!r} is already defined in {', '.join(before)} by another owner (the GPU "
                f"Operator's toolkit, a hand-run `nvidia-ctk runtime configure`, a person): the role's drop-in "
                f"{drop_in} would silently override it, so nothing was changed. {CHOICES}.")
    return ""


def new_main_config(version: int, drop_in: str) -> str:
    return (
        "# Created by Ansible (role nvidia_container_toolkit) because no containerd config existed.\n"
        "# Yours from here on: the role only keeps its drop-in in `imports`.\n"
        f"version = {version}\n"
        f'imports = ["{drop_in}"]\n'
    )


def plan_present(params: dict, release: tuple[int, int]) -> dict:
    config_path, drop_in = params["config_path"], params["drop_in_path"]
    text = read_text(config_path)
    document = parse(text, config_path) if text is not None else {}
    version = config_schema_version(document, text is not None, release)
    entries = document.get("imports", [])
    if not isinstance(entries, list) or not all(isinstance(entry, str) for entry in entries):
        raise ConfigError(f"`imports` in {config_path} is not a list of paths: {entries!r}")
    dropin_text = read_text(drop_in)
    if not params.get("take_over"):
        problem = foreign_drop_in_problem(drop_in, dropin_text)
        if problem:
            raise ConfigError(problem)
    problem = foreign_runtime_problem(config_path, entries, document, version, params)
    if problem:
        raise ConfigError(problem)

    if text is None:
        new_text = new_main_config(version, drop_in)
    elif import_covers(entries, drop_in):
        new_text = text
    else:
        new_text = set_imports(text, entries + [drop_in])
        if without_imports(parse(new_text, config_path)) != without_imports(document):
            raise ConfigError(f"adding the import to {config_path} would change other keys; it was left as it is")

    earlier = imported_before_ours(entries, drop_in, os.path.dirname(config_path))
    documents = [document] + [parse(read_text(path) or "", path) for path in earlier]
    plugin = CRI_RUNTIME_PLUGIN[version]
    for other in documents[1:]:
        if other.get("version", version) != version:
            raise ConfigError(f"an imported file has config version {other.get('version')}, {config_path} has {version}")
    base = effective_plugin_section(documents, plugin, replace_sections=release[0] < 2)
    systemd = systemd_cgroup_choice(params["systemd_cgroup"], base, os.path.isdir("/run/systemd/system"))
    dropin_doc = dropin_document(version, base, params["runtime_name"], params["runtime_binary"], systemd,
                                 params["set_as_default"])
    return {
        "config": (text, new_text),
        "drop_in": (dropin_text, render_dropin(dropin_doc, params["runtime_name"], config_path)),
        "config_version": version,
        "systemd_cgroup": systemd,
    }


def plan_absent(params: dict) -> dict:
    config_path, drop_in = params["config_path"], params["drop_in_path"]
    text = read_text(config_path)
    dropin_text = read_text(drop_in)
    if not is_own_drop_in(dropin_text):
        # Another owner's file (and its import) stays: absent removes only what the role wrote.
        return {"config": (text, text), "drop_in": (dropin_text, dropin_text)}
    new_text = text
    if text is not None:
        document = parse(text, config_path)
        entries = document.get("imports", [])
        if isinstance(entries, list) and drop_in in entries:
            new_text = set_imports(text, [entry for entry in entries if entry != drop_in])
    return {"config": (text, new_text), "drop_in": (dropin_text, None)}


def dump_check(run_command: Callable, binary: str, params: dict, plan: dict) -> str:
    """Ask containerd to merge the planned files (copies in a scratch directory, so nothing changes yet) and return
    why its view lacks the runtime or the default, or '' when it shows both. run_command is AnsibleModule's."""
    config_text, dropin_text = plan["config"][1], plan["drop_in"][1]
    with tempfile.TemporaryDirectory(prefix="nvidia-containerd-") as scratch:
        dropin_copy = os.path.join(scratch, os.path.basename(params["drop_in_path"]))
        with open(dropin_copy, "w", encoding="utf-8") as out:
            out.write(dropin_text)
        entries = tomllib.loads(config_text).get("imports", [])
        base_dir = os.path.dirname(params["config_path"])
        entries = [dropin_copy if entry == params["drop_in_path"] else os.path.join(base_dir, entry) for entry in entries]
        if dropin_copy not in entries:
            entries.append(dropin_copy)
        config_copy = os.path.join(scratch, "config.toml")
        with open(config_copy, "w", encoding="utf-8") as out:
            out.write(set_imports(config_text, entries))
        rc, out, err = run_command([binary, "--config", config_copy, "config", "dump"])
    if rc != 0:
        return f"`containerd config dump` of the planned config failed (rc={rc}): {err.strip() or out.strip()}"
    dumped = tomllib.loads(out)
    # containerd dumps in its own config version, whatever the files' (2.x migrates a version 2 or 3 file on load and
    # keeps a plugin named io.containerd.grpc.v1.cri for other settings): the runtimes are read in the dump's layout.
    dump_version = dumped.get("version")
    if dump_version not in CRI_RUNTIME_PLUGIN:
        return (f"containerd's config dump of the planned config has version = {dump_version!r}, which this role "
                f"cannot read (it knows {sorted(CRI_RUNTIME_PLUGIN)})")
    section = dumped.get("plugins", {}).get(CRI_RUNTIME_PLUGIN[dump_version], {})
    containerd = section.get("containerd", {})
    runtime = containerd.get("runtimes", {}).get(params["runtime_name"], {})
    if runtime.get("options", {}).get("BinaryName") != params["runtime_binary"]:
        return (f"containerd's config dump of the planned config shows no {params['runtime_name']!r} runtime running "
                f"{params['runtime_binary']}")
    if params["set_as_default"] and containerd.get("default_runtime_name") != params["runtime_name"]:
        return (f"containerd's config dump of the planned config shows default runtime "
                f"{containerd.get('default_runtime_name')!r}, not {params['runtime_name']!r}")
    return ""


def plan_runtime(params: dict, run_command: Callable, get_bin_path: Callable) -> tuple[dict, dict]:
    """(result, plan) for the module's parameters: what would change, checked by containerd's dump when asked.
    Raises ConfigError for what must be refused before anything changes."""
    if tomllib is None:
        raise ConfigError("nvidia_containerd_runtime needs Python 3.11 or newer on the host (tomllib)")
    binary = get_bin_path(params["containerd_binary"]) if "/" not in params["containerd_binary"] \
        else params["containerd_binary"]
    if not binary or not os.access(binary, os.X_OK):
        raise ConfigError(f"containerd is not installed here ({params['containerd_binary']!r} not found): install the "
                          "container runtime first, or choose another runtime in nvidia_container_toolkit_runtimes")
    rc, out, err = run_command([binary, "--version"])
    release = containerd_release(out if rc == 0 else err)
    plan = plan_present(params, release) if params.get("state", "present") == "present" else plan_absent(params)
    config_before, config_after = plan["config"]
    dropin_before, dropin_after = plan["drop_in"]
    result = {
        "changed": False,
        "containerd_major": release[0],
        "containerd_version": f"{release[0]}.{release[1]}",
        "config_changed": config_before != config_after,
        "drop_in_changed": dropin_before != dropin_after,
        "dump_checked": False,
        "diff": [
            {"before_header": params["config_path"], "after_header": params["config_path"],
             "before": config_before or "", "after": config_after or ""},
            {"before_header": params["drop_in_path"], "after_header": params["drop_in_path"],
             "before": dropin_before or "", "after": dropin_after or ""},
        ],
    }
    result["changed"] = result["config_changed"] or result["drop_in_changed"]
    for key in ("config_version", "systemd_cgroup"):
        if key in plan:
            result[key] = plan[key]
    # containerd judges the result before anything is written (in check mode too).
    if params.get("state", "present") == "present" and params.get("verify", True):
        problem = dump_check(run_command, binary, params, plan)
        if problem:
            raise ConfigError(problem + "; nothing was changed")
        result["dump_checked"] = True
    return result, plan
