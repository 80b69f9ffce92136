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
    ours) with the runtime merged in. containerd 2.0 to 2.2 (config version 3) and 2.3 and later (config version 4)
    are handled the same way, in their C(io.containerd.cri.v1.runtime) plugin.
  - The schema version follows the main config's own C(version), which the drop-in always shares (never the newer
    version of a C(config dump), since containerd 2.3.2 refuses to start on an import newer than the main config).
    A new main config gets containerd's native version (2 for 1.x, 3 for 2.0 to 2.2, 4 for 2.3 and later, read from
    C(containerd --version)). A version the installed containerd cannot read is refused, changing nothing.
  - Before writing (and in check mode), it asks containerd itself (C(containerd --config <copy> config dump) on
    scratch copies of the planned files) whether the runtime is there, so the result is judged by the runtime, not by
    this module's parser. If containerd disagrees, nothing is written.
  - A file at O(drop_in_path) that this module did not write (its first line is the module's header) belongs to
    another owner and is never overwritten or removed unless O(take_over) says so; see O(take_over).
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
  take_over:
    description:
      - What to do with another owner's NVIDIA runtime configuration (the GPU Operator's toolkit, a hand-run
        C(nvidia-ctk runtime configure), whose default drop-in since toolkit 1.18 is
        C(/etc/containerd/conf.d/99-nvidia.toml), a person).
      - V(false) fails, changing nothing, naming the file, when a file at O(drop_in_path) does not start with this
        module's header line, or when the main config or a file it imports defines the runtime O(runtime_name).
      - V(true) replaces such a file at O(drop_in_path) and overrides a definition imported before the drop-in. A
        definition in a file imported after the drop-in is always refused (it would override the drop-in).
      - With O(state=absent) another owner's file at O(drop_in_path) and its import stay, whatever this says.
    type: bool
    default: false
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
containerd_version:
  description: Major and minor version of the installed containerd.
  returned: always
  type: str
  sample: "2.4"
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

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpu_ops.cluster.plugins.module_utils.atomic_file import write_atomically
from ansible_collections.gpu_ops.cluster.plugins.module_utils.container_runtime import ConfigError
from ansible_collections.gpu_ops.cluster.plugins.module_utils.containerd_plan import PLAN_OPTIONS, plan_runtime


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            PLAN_OPTIONS,
            verify=dict(type="bool", default=True),
            state=dict(type="str", choices=["present", "absent"], default="present"),
        ),
        supports_check_mode=True,
    )
    params = module.params
    try:
        result, plan = plan_runtime(params, module.run_command, module.get_bin_path)
    except ConfigError as exc:
        module.fail_json(msg=str(exc))
    if module.check_mode:
        module.exit_json(**result)

    config_before, config_after = plan["config"]
    dropin_after = plan["drop_in"][1]
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
