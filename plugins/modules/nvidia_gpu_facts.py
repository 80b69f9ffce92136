#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nvidia_gpu_facts
short_description: Report, as data, whether every NVIDIA GPU on a host is there and usable
description:
  - Read-only. It never changes the host and always reports C(changed=false).
  - Reads the driver, CUDA driver and NVML versions, the kernel module, and for each GPU its identity, memory, MIG
    mode and MIG devices, compute, persistence and ECC modes, uncorrected ECC errors, pending page retirement or row
    remapping, temperature, power and active clocks event (throttle) reasons.
  - Uses NVML through C(nvidia-ml-py) (module C(pynvml)) when it is importable and NVML initialises; otherwise
    C(nvidia-smi --query-gpu) completed by C(nvidia-smi -q -x). Both give the same structure;
    RV(ansible_facts.nvidia_gpu.source) says which was used.
  - Every failure is data, never a traceback. A missing C(nvidia-smi), a driver that is not loaded, a driver/library
    version mismatch, no devices, a hung C(nvidia-smi) and unanswered fields (C([N/A]), C([Not Supported])) are
    reported in RV(ansible_facts.nvidia_gpu.error_kind) or as C(null) values.
  - Compares what it finds with the expectations given and reports a verdict, RV(ansible_facts.nvidia_gpu.healthy),
    with the reasons in RV(ansible_facts.nvidia_gpu.problems).
options:
  expected_gpu_count:
    description: Number of GPUs the host should have. Not checked when omitted.
    type: int
  expected_driver_branch:
    description: Driver branch (the major version, for example C("550")) the host should run. Not checked when omitted.
    type: str
  expected_product:
    description:
      - Regular expression (Python C(re.search)) every GPU name should match, for example C(H100|H200).
    type: str
  expected_mig_mode:
    description:
      - MIG mode every GPU should be in. A GPU without MIG support counts as C(disabled).
    type: str
    choices: [enabled, disabled]
  fail_on_unmet:
    description:
      - Fail the task, with the problems and the facts in the result, when anything is unhealthy or unexpected.
      - When false, the verdict is only reported.
    type: bool
    default: false
  timeout:
    description: Seconds each C(nvidia-smi) run may take before it is killed and reported as C(timeout).
    type: int
    default: 30
  nvidia_smi_path:
    description: Path of C(nvidia-smi). Searched for in C(PATH) when omitted.
    type: path
  kernel_log:
    description:
      - Where to read the driver's Xid reports since boot (RV(ansible_facts.nvidia_gpu.xid_errors)).
      - C(auto) reads the journal's kernel messages (C(journalctl --dmesg --boot)) where C(journalctl) exists, else
        C(dmesg); C(file) reads O(kernel_log_file) (a syslog C(kern.log)); C(none) reads nothing.
      - A log that cannot be read is reported in RV(ansible_facts.nvidia_gpu.kernel_log), not as a problem.
    type: str
    choices: [auto, journal, dmesg, file, none]
    default: auto
  kernel_log_file:
    description: The file C(kernel_log=file) reads, for example C(/var/log/kern.log).
    type: path
  xid_ignore:
    description:
      - Xid codes that are the application's fault, not the GPU's, and so no problem. The default is the NVIDIA
        device plugin's (13, 31, 43, 45, 68, 109). They are still listed in RV(ansible_facts.nvidia_gpu.xid_errors).
    type: list
    elements: int
notes:
  - Supports check mode; the module makes no changes in either mode.
  - C(retired_pages_pending) applies to GPUs before Ampere; Ampere and later GPUs remap rows instead
    (C(remapped_rows_pending), C(remapped_rows_failure)). Either is C(null) where the GPU does not support it.
requirements:
  - C(nvidia-smi) from the NVIDIA driver, or the C(nvidia-ml-py) Python package on the host.
author:
  - GPU platform team (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Read the GPU facts
  gpu_ops.cluster.nvidia_gpu_facts:

- name: Fail unless the node has eight healthy H100 GPUs on the 550 driver with MIG disabled
  gpu_ops.cluster.nvidia_gpu_facts:
    expected_gpu_count: 8
    expected_driver_branch: "550"
    expected_product: "H100"
    expected_mig_mode: disabled
    fail_on_unmet: true

- name: Reboot a node whose driver and library disagree
  ansible.builtin.reboot:
    msg: "{{ ansible_facts['nvidia_gpu']['advice'] }}"
  when: ansible_facts['nvidia_gpu']['error_kind'] == 'version_mismatch'
"""

RETURN = r"""
healthy:
  description: Same as RV(ansible_facts.nvidia_gpu.healthy).
  returned: always
  type: bool
problems:
  description: Same as RV(ansible_facts.nvidia_gpu.problems).
  returned: always
  type: list
  elements: str
ansible_facts:
  description: Facts about the NVIDIA GPUs.
  returned: always
  type: dict
  contains:
    nvidia_gpu:
      description: The GPU report.
      returned: always
      type: dict
      contains:
        source:
          description: Where the data came from; C(none) when neither NVML nor nvidia-smi could be used.
          returned: always
          type: str
          choices: [nvml, nvidia-smi, none]
        error_kind:
          description: Why the GPUs could not be read, or null.
          returned: always
          type: str
          choices: [not_installed, driver_not_loaded, version_mismatch, no_devices, timeout, nvml_init_failed,
                    invalid_field, command_failed, parse_error]
        error:
          description: The message behind RV(ansible_facts.nvidia_gpu.error_kind), as the tool printed it, or null.
          returned: always
          type: str
          sample: "Failed to initialize NVML: Driver/library version mismatch NVML library version: 550.144"
        advice:
          description: What usually fixes RV(ansible_facts.nvidia_gpu.error_kind), or null.
          returned: always
          type: str
        driver_version:
          description: Version of the running driver, or null.
          returned: always
          type: str
          sample: 550.54.15
        cuda_driver_version:
          description: Highest CUDA version the driver supports, or null.
          returned: always
          type: str
          sample: "12.4"
        nvml_version:
          description: NVML library version (NVML path, or from a version mismatch message), or null.
          returned: always
          type: str
          sample: 12.550.54.15
        kernel_module:
          description: The nvidia kernel module, read from /sys/module/nvidia and /proc/driver/nvidia/version.
          returned: always
          type: dict
          sample: {loaded: true, version: 550.54.15}
        gpu_count:
          description: Number of GPUs found.
          returned: always
          type: int
        gpus:
          description:
            - One entry per GPU, in index order. Any value the GPU or tool does not report is null.
            - Keys C(index), C(uuid), C(name), C(pci_bus_id), C(pci_device_id) and C(pci_sub_system_id) (device << 16
              | vendor as C(nvidia-smi --query-gpu=pci.device_id) prints it, C(0x233010DE); from NVML's
              C(nvmlDeviceGetPciInfo) or the XML's C(pci_device_id); what a mig-parted C(device-filter) names),
              C(memory_total_mib), C(memory_used_mib),
              C(mig_mode_current) and C(mig_mode_pending) (C(enabled), C(disabled) or null), C(mig_devices) (list of
              C(index), C(uuid), C(profile) such as C(1g.10gb), C(gpu_instance_id), C(compute_instance_id), C(memory_total_mib),
              C(memory_used_mib); profile and UUID from C(nvidia-smi -L) where the XML lacks them),
              C(compute_mode), C(persistence_mode), C(ecc_mode_current), C(ecc_errors_uncorrected_volatile),
              C(ecc_errors_uncorrected_aggregate), C(retired_pages_pending), C(remapped_rows_pending),
              C(remapped_rows_failure), C(temperature_c), C(power_draw_w), C(power_limit_w) and
              C(clocks_event_reasons) (list of active reasons such as C(gpu_idle), C(sw_power_cap), C(hw_slowdown)).
          returned: always
          type: list
          elements: dict
        healthy:
          description: Whether no problem was found.
          returned: always
          type: bool
        problems:
          description: Each unmet expectation or unhealthy state, naming what was expected and what was found.
          returned: always
          type: list
          elements: str
          sample: ["expected 8 GPU(s), found 7"]
        kernel_log:
          description: Where the Xid reports were read (C(source) journal, dmesg, file or none) and why not (C(error)).
          returned: always
          type: dict
          sample: {source: journal, error: null}
        xid_errors:
          description:
            - The driver's Xid reports since boot, in order, each with C(xid), C(pci_bus_id) (as the driver printed
              it), C(gpu_index) (null for a GPU not listed now), C(time) (null when the log has none), C(detail),
              C(line) and C(application) (true for a code in O(xid_ignore)). Every code not ignored is a problem.
          returned: always
          type: list
          elements: dict
"""

import re
from typing import Any, Dict, Optional

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpu_ops.cluster.plugins.module_utils.gpu_xid import (
    APPLICATION_XIDS,
    KERNEL_LOG_SOURCES,
    attach_gpus,
    parse_kernel_log,
    read_kernel_log,
    xid_problems,
)
from ansible_collections.gpu_ops.cluster.plugins.module_utils.nvidia_gpu import find_problems, gather_gpu_facts, run_with_timeout

try:
    import pynvml  # nvidia-ml-py

    HAS_PYNVML = True
except ImportError:  # nvidia-smi is the fallback, so a missing binding is not an error
    pynvml = None
    HAS_PYNVML = False


def build_argspec() -> Dict[str, Any]:
    return dict(
        expected_gpu_count=dict(type="int"),
        expected_driver_branch=dict(type="str"),
        expected_product=dict(type="str"),
        expected_mig_mode=dict(type="str", choices=["enabled", "disabled"]),
        fail_on_unmet=dict(type="bool", default=False),
        timeout=dict(type="int", default=30),
        nvidia_smi_path=dict(type="path"),
        kernel_log=dict(type="str", choices=list(KERNEL_LOG_SOURCES), default="auto"),
        kernel_log_file=dict(type="path"),
        xid_ignore=dict(type="list", elements="int"),
    )


def compile_product(module: AnsibleModule) -> Optional["re.Pattern[str]"]:
    pattern = module.params["expected_product"]
    if pattern is None:
        return None
    try:
        return re.compile(pattern)
    except re.error as error:
        module.fail_json(msg="expected_product={0!r} is not a valid regular expression: {1}".format(pattern, error))
    return None


def main() -> None:
    module = AnsibleModule(argument_spec=build_argspec(), supports_check_mode=True,
                           required_if=[("kernel_log", "file", ("kernel_log_file",))])
    if module.params["timeout"] <= 0:
        module.fail_json(msg="timeout={0} must be a positive number of seconds".format(module.params["timeout"]))
    product = compile_product(module)
    nvidia_smi = module.params["nvidia_smi_path"] or module.get_bin_path("nvidia-smi")

    facts = gather_gpu_facts(
        nvml=pynvml if HAS_PYNVML else None,
        nvidia_smi=nvidia_smi,
        runner=run_with_timeout,
        timeout=module.params["timeout"],
    )
    source, text, error = read_kernel_log(module.params["kernel_log"], run_with_timeout, module.params["timeout"],
                                          module.params["kernel_log_file"], module.get_bin_path)
    ignore = APPLICATION_XIDS if module.params["xid_ignore"] is None else module.params["xid_ignore"]
    facts["kernel_log"] = {"source": source, "error": error}
    facts["xid_errors"] = attach_gpus(parse_kernel_log(text or ""), facts["gpus"], ignore)
    problems = find_problems(
        facts,
        expected_gpu_count=module.params["expected_gpu_count"],
        expected_driver_branch=module.params["expected_driver_branch"],
        expected_product=product,
        expected_mig_mode=module.params["expected_mig_mode"],
    ) + xid_problems(facts["xid_errors"])
    facts["problems"] = problems
    facts["healthy"] = not problems
    result = dict(changed=False, healthy=facts["healthy"], problems=problems, ansible_facts={"nvidia_gpu": facts})
    if problems and module.params["fail_on_unmet"]:
        module.fail_json(msg="; ".join(problems), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
