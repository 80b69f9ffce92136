#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nvidia_containerd_runtime
short_description: Define the NVIDIA runtime for containerd in a drop-in file, keeping the user's config.toml
description:
  - Writes a drop-in file that defines the C(nvidia) runtime for containerd's CRI plugin, and adds that file to the
    C(imports) list of the main config. Nothing else in the main config changes; the module parses the file before
    and after its edit and refuses to write if any other key would differ.
  - containerd 1.x (config version 2) replaces a whole plugin section when it merges an imported file, so the drop-in
    carries a copy of the user's effective CRI runtime section (from the main config and the files it imports before
    ours) with the runtime merged in. containerd 2.x (config version 3) is handled the same way, in its
    C(io.containerd.cri.v1.runtime) plugin.
  - The schema version follows the main config's own C(version); a new main config gets containerd's native version
    (2 for 1.x, 3 for 2.x, read from C(containerd --version)).
  - Before writing (and in check mode), it asks containerd itself (C(containerd --config <copy> config dump) on
    scratch copies of the planned files) whether the runtime is there, so the result is judged by the runtime, not by
    this module's parser. If containerd disagrees, nothing is written.
  - Supports check mode and diff mode. With O(state=absent) it removes the drop-in and its import entry only.
options:
  config_path:
    description: containerd's main config file.
    type: path
    default: /etc/containerd/config.toml
  drop_in_path:
    description: The drop-in file this module owns.
    type: path
    default: /etc/containerd/conf.d/99-nvidia.toml
  containerd_binary:
    description: The containerd executable, for its version and for the config dump check.
    type: path
    default: containerd
  runtime_name:
    description: Runtime name, which a RuntimeClass handler must match.
    type: str
    default: nvidia
  runtime_binary:
    description: The OCI runtime the nvidia runtime runs (C(BinaryName)).
    type: path
    default: /usr/bin/nvidia-container-runtime
  set_as_default:
    description: Make the runtime containerd's default runtime (C(default_runtime_name)).
    type: bool
    default: false
  systemd_cgroup:
    description:
      - C(SystemdCgroup) of the runtime. V(auto) copies runc's setting in the user's config, else uses the systemd
        cgroup driver when systemd runs the host.
    type: str
    choices: [auto, "true", "false"]
    default: auto
  verify:
    description: Run containerd's config dump on the planned files and fail, changing nothing, if the runtime is not in it.
    type: bool
    default: true
  state:
    description: V(present) writes the drop-in and the import; V(absent) removes both (only ours).
    type: str
    choices: [present, absent]
    default: present
requirements:
  - Python 3.11 or newer on the host (tomllib).
author:
  - gpu-cluster project (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Define the nvidia runtime for containerd
  gpu_ops.cluster.nvidia_containerd_runtime:
    config_path: /etc/containerd/config.toml
    drop_in_path: /etc/containerd/conf.d/99-nvidia.toml
    set_as_default: false
  notify: Containerd | restart
"""

RETURN = r"""
config_version:
  description: The config schema version the drop-in is written in.
  returned: state is present
  type: int
  sample: 2
containerd_major:
  description: Major version of the installed containerd.
  returned: always
  type: int
  sample: 1
systemd_cgroup:
  description: The SystemdCgroup value given to the runtime.
  returned: state is present
  type: bool
config_changed:
  description: Whether the main config's imports changed.
  returned: always
  type: bool
drop_in_changed:
  description: Whether the drop-in changed.
  returned: always
  type: bool
dump_checked:
  description: Whether containerd's own config dump of the planned files (scratch copies) was checked.
  returned: always
  type: bool
"""

import glob
import os
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpu_ops.cluster.plugins.module_utils.atomic_file import write_atomically
from ansible_collections.gpu_ops.cluster.plugins.module_utils.container_runtime import (
    CRI_RUNTIME_PLUGIN,
    ConfigError,
    config_schema_version,
    containerd_major,
    dropin_document,
    effective_plugin_section,
    import_covers,
    render_dropin,
    set_imports,
    systemd_cgroup_choice,
    without_imports,
)

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


def imported_before_ours(entries: list[str], ours: str, base_dir: str) -> list[str]:
    """Files containerd merges before our drop-in, in its order (globs expanded sorted; relative to config.toml)."""
    files: list[str] = []
    for entry in (os.path.join(base_dir, entry) for entry in entries):
        matches = sorted(glob.glob(entry)) if glob.has_magic(entry) else [entry]
        for path in matches:
            if path == ours:
                return files
            if os.path.isfile(path) and path not in files:
                files.append(path)
    return files


def new_main_config(version: int, drop_in: str) -> str:
    return (
        "# Created by Ansible (role nvidia_container_toolkit) because no containerd config existed.\n"
        "# Yours from here on: the role only keeps its drop-in in `imports`.\n"
        f"version = {version}\n"
        f'imports = ["{drop_in}"]\n'
    )


def plan_present(module: AnsibleModule, major: int) -> dict:
    params = module.params
    config_path, drop_in = params["config_path"], params["drop_in_path"]
    text = read_text(config_path)
    document = parse(text, config_path) if text is not None else {}
    version = config_schema_version(document, text is not None, major)
    entries = document.get("imports", [])
    if not isinstance(entries, list) or not all(isinstance(entry, str) for entry in entries):
        raise ConfigError(f"`imports` in {config_path} is not a list of paths: {entries!r}")

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
    base = effective_plugin_section(documents, plugin, replace_sections=major < 2)
    systemd = systemd_cgroup_choice(params["systemd_cgroup"], base, os.path.isdir("/run/systemd/system"))
    dropin_doc = dropin_document(version, base, params["runtime_name"], params["runtime_binary"], systemd,
                                 params["set_as_default"])
    return {
        "config": (text, new_text),
        "drop_in": (read_text(drop_in), render_dropin(dropin_doc, params["runtime_name"], config_path)),
        "config_version": version,
        "systemd_cgroup": systemd,
    }


def plan_absent(module: AnsibleModule) -> dict:
    config_path, drop_in = module.params["config_path"], module.params["drop_in_path"]
    text = read_text(config_path)
    new_text = text
    if text is not None:
        document = parse(text, config_path)
        entries = document.get("imports", [])
        if isinstance(entries, list) and drop_in in entries:
            new_text = set_imports(text, [entry for entry in entries if entry != drop_in])
    return {"config": (text, new_text), "drop_in": (read_text(drop_in), None)}


def dump_check(module: AnsibleModule, binary: str, plan: dict) -> str:
    """Ask containerd to merge the planned files (copies in a scratch directory, so nothing changes yet) and return
    why its view lacks the runtime or the default, or '' when it shows both."""
    params = module.params
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
        rc, out, err = module.run_command([binary, "--config", config_copy, "config", "dump"])
    if rc != 0:
        return f"`containerd config dump` of the planned config failed (rc={rc}): {err.strip() or out.strip()}"
    plugins = tomllib.loads(out).get("plugins", {})
    # containerd 2.x dumps a version 2 config migrated to its own schema: look in the version 3 layout then.
    section = plugins.get(CRI_RUNTIME_PLUGIN[plan["config_version"]]) or plugins.get(CRI_RUNTIME_PLUGIN[3], {})
    containerd = section.get("containerd", {})
    runtime = containerd.get("runtimes", {}).get(params["runtime_name"], {})
    if runtime.get("options", {}).get("BinaryName") != params["runtime_binary"]:
        return (f"containerd's config dump of the planned config shows no {params['runtime_name']!r} runtime running "
                f"{params['runtime_binary']}")
    if params["set_as_default"] and containerd.get("default_runtime_name") != params["runtime_name"]:
        return (f"containerd's config dump of the planned config shows default runtime "
                f"{containerd.get('default_runtime_name')!r}, not {params['runtime_name']!r}")
    return ""


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            config_path=dict(type="path", default="/etc/containerd/config.toml"),
            drop_in_path=dict(type="path", default="/etc/containerd/conf.d/99-nvidia.toml"),
            containerd_binary=dict(type="path", default="containerd"),
            runtime_name=dict(type="str", default="nvidia"),
            runtime_binary=dict(type="path", default="/usr/bin/nvidia-container-runtime"),
            set_as_default=dict(type="bool", default=False),
            systemd_cgroup=dict(type="str", choices=["auto", "true", "false"], default="auto"),
            verify=dict(type="bool", default=True),
            state=dict(type="str", choices=["present", "absent"], default="present"),
        ),
        supports_check_mode=True,
    )
    if tomllib is None:
        module.fail_json(msg="nvidia_containerd_runtime needs Python 3.11 or newer on the host (tomllib)")
    params = module.params
    binary = module.get_bin_path(params["containerd_binary"]) if "/" not in params["containerd_binary"] \
        else params["containerd_binary"]
    if not binary or not os.access(binary, os.X_OK):
        module.fail_json(msg=f"containerd is not installed here ({params['containerd_binary']!r} not found): install the "
                             "container runtime first, or choose another runtime in nvidia_container_toolkit_runtimes")
    rc, out, err = module.run_command([binary, "--version"])
    try:
        major = containerd_major(out if rc == 0 else err)
        plan = plan_present(module, major) if params["state"] == "present" else plan_absent(module)
    except ConfigError as exc:
        module.fail_json(msg=str(exc))

    config_before, config_after = plan["config"]
    dropin_before, dropin_after = plan["drop_in"]
    result = {
        "changed": False,
        "containerd_major": major,
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
    if params["state"] == "present" and params["verify"]:
        problem = dump_check(module, binary, plan)
        if problem:
            module.fail_json(msg=problem + "; nothing was changed", **result)
        result["dump_checked"] = True
    if module.check_mode:
        module.exit_json(**result)

    # The drop-in first: config.toml never points at a file that is not there.
    if result["drop_in_changed"]:
        if dropin_after is None:
            os.unlink(params["drop_in_path"])
        else:
            write_atomically(params["drop_in_path"], dropin_after.encode("utf-8"), 0o644)
    if result["config_changed"] and config_after is not None:
        mode = os.stat(params["config_path"]).st_mode & 0o7777 if config_before is not None else 0o644
        write_atomically(params["config_path"], config_after.encode("utf-8"), mode)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
