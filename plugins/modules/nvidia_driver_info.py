#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nvidia_driver_info
short_description: Report the state of the NVIDIA driver on a host
description:
  - Read-only inspection for the C(nvidia_driver) role. It never changes the host and always reports C(changed=false).
  - Reports what is loaded (kernel module version and flavour), what is installed (C(modinfo), DKMS module, NVML
    library), Secure Boot, nouveau, runfile and GPU Operator leftovers, the role's own state file, and the action the
    node needs (C(none), C(load) or C(reboot)) so that the installed driver is the one running.
  - Anything it cannot read is reported as C(null), C(false) or C(unknown), never as a failure.
options:
  root:
    description:
      - Filesystem root to inspect. Every path below, including O(state_file), is read relative to it.
      - With a root other than C(/), C(modinfo) reads modules under that root and C(mokutil) is not run, because it
        only describes the live host.
    type: path
    default: /
  state_file:
    description:
      - JSON file the C(nvidia_driver) role writes after an install, relative to O(root).
      - Keys C(source), C(branch), C(kernel_modules), C(version) and C(packages) (a list). Missing or invalid means
        an empty C(managed) dict; invalid JSON also adds a warning.
    type: path
    default: /etc/ansible/facts.d/nvidia_driver.fact
notes:
  - Supports check mode; the module makes no changes in either mode.
requirements:
  - C(modinfo) (kmod) for RV(ansible_facts.nvidia_driver.installed_module_version); C(mokutil) is optional.
author:
  - GPU platform team (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Inspect the NVIDIA driver
  gpu_ops.cluster.nvidia_driver_info:

- name: Reboot when the loaded module is older than the installed one
  ansible.builtin.reboot:
    msg: "{{ ansible_facts['nvidia_driver']['action_reason'] }}"
  when: ansible_facts['nvidia_driver']['reboot_required']

- name: Stop before installing an unsigned module on a Secure Boot host
  ansible.builtin.assert:
    that: ansible_facts['nvidia_driver']['secure_boot'] != 'enabled'
    fail_msg: "Secure Boot is enabled on {{ inventory_hostname }}; enrol a MOK key or use signed modules"
"""

RETURN = r"""
ansible_facts:
  description: Facts about the NVIDIA driver.
  returned: always
  type: dict
  contains:
    nvidia_driver:
      description: The driver report.
      returned: always
      type: dict
      contains:
        kernel_release:
          description: Release of the running kernel.
          returned: always
          type: str
          sample: 6.8.0-52-generic
        in_container:
          description: Whether the module runs inside a container.
          returned: always
          type: bool
        secure_boot:
          description: Secure Boot state; C(unsupported) on legacy BIOS hosts.
          returned: always
          type: str
          choices: [enabled, disabled, unsupported, unknown]
        module_loaded:
          description: Whether the nvidia kernel module is loaded.
          returned: always
          type: bool
        loaded_version:
          description: Version of the loaded nvidia kernel module, or null.
          returned: always
          type: str
          sample: 535.261.03
        loaded_flavor:
          description: Flavour of the loaded module from /proc/driver/nvidia/version, or null when unknown.
          returned: always
          type: str
          choices: [open, proprietary]
        installed_module_version:
          description: Version C(modinfo) reports for the running kernel, or null.
          returned: always
          type: str
          sample: 535.261.03
        installed_module_present:
          description: Whether a DKMS-built nvidia.ko exists for the running kernel.
          returned: always
          type: bool
        library_version:
          description: Version of the newest libnvidia-ml (NVML) library found, or null.
          returned: always
          type: str
          sample: 535.261.03
        nouveau_loaded:
          description: Whether the nouveau module is loaded.
          returned: always
          type: bool
        runfile_installed:
          description: Whether a .run installer left its uninstaller or log behind.
          returned: always
          type: bool
        operator_driver:
          description: Whether the GPU Operator's driver container populated /run/nvidia/driver.
          returned: always
          type: bool
        managed:
          description: Content of the role's state file; empty when missing or invalid.
          returned: always
          type: dict
          sample: {source: packages, branch: "535", version: 535.261.03, kernel_modules: proprietary, packages: []}
        version_mismatch:
          description: Whether the loaded module and the NVML library versions are both known and differ.
          returned: always
          type: bool
        mismatch_message:
          description: Explanation of the mismatch, or null.
          returned: always
          type: str
        action:
          description: What the node needs so that the installed driver is the one running.
          returned: always
          type: str
          choices: [none, load, reboot]
        action_reason:
          description: Why that action.
          returned: always
          type: str
        reboot_required:
          description: Whether C(action) is C(reboot).
          returned: always
          type: bool
"""

from typing import Any, Dict

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpu_ops.cluster.plugins.module_utils.host_state import driver_facts
from ansible_collections.gpu_ops.cluster.plugins.module_utils.nvidia_driver import DEFAULT_STATE_FILE


def build_argspec() -> Dict[str, Any]:
    return dict(
        root=dict(type="path", default="/"),
        state_file=dict(type="path", default=DEFAULT_STATE_FILE),
    )


def main() -> None:
    module = AnsibleModule(argument_spec=build_argspec(), supports_check_mode=True)
    facts, warnings = driver_facts(module, module.params["root"], module.params["state_file"])
    for warning in warnings:
        module.warn(warning)
    module.exit_json(changed=False, ansible_facts={"nvidia_driver": facts})


if __name__ == "__main__":
    main()
