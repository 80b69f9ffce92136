#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nvidia_mig
short_description: Apply a named MIG layout (NVIDIA mig-parted's format) to the GPUs of a host
description:
  - Reads each GPU's MIG mode and GPU instances (C(nvidia-smi --query-gpu), C(nvidia-smi mig -lgi), C(nvidia-smi -L)),
    checks the layout against the product's MIG profiles and the device plugin's MIG strategy, and changes only the
    GPUs that differ. A GPU that already has the wanted instances keeps them, whatever their order or placement.
  - Refuses before any change when a GPU is not MIG-capable, a profile does not exist for the product, a layout does
    not fit one GPU, the strategy cannot serve the result, or a process runs on a GPU that would change.
  - Switches MIG mode with C(nvidia-smi -i N -mig 1|0). A mode left pending (the GPU in use, or a product that needs
    it) is made effective with C(nvidia-smi --gpu-reset) when O(gpu_reset) is true; otherwise, or when the reset does
    not take, the GPU is reported in RV(reboot_required) and its instances are made after the reboot, by a re-run.
  - Destroys a changing GPU's compute and GPU instances, then creates the wanted ones with
    C(nvidia-smi mig -cgi <ids> -C), trying other creation orders when the driver cannot place one (as mig-parted
    does). With O(tool=mig-parted) (or C(auto) and C(nvidia-mig-parted) installed) C(nvidia-mig-parted apply) does
    both steps. Either way the GPUs are read again and must match.
  - In check mode nothing changes; the result says what would.
options:
  config_name:
    description: Name of the config (shown in messages and the node label C(nvidia.com/mig.config)).
    type: str
    required: true
  config:
    description:
      - The config's entries, as mig-parted writes them under C(mig-configs.<name>). Each has C(devices) (C(all) or a
        list of GPU indexes), C(mig-enabled) (bool), C(mig-devices) (MIG profile to count per GPU) and optionally
        C(device-filter) (a PCI id such as C(0x233010DE), or a list of them), matched against each GPU's
        C(pci.device_id) as mig-parted matches it. Entries apply in order; a GPU that several take ends with the last
        one's layout; C(devices=all) skips GPUs that cannot do MIG; a GPU no entry takes is left as it is.
    type: list
    elements: dict
    required: true
  strategy:
    description: The device plugin's MIG strategy on this node, which must be able to serve the result.
    type: str
    choices: [none, single, mixed]
    default: mixed
  tool:
    description: C(auto) uses C(nvidia-mig-parted) when it is installed, else C(nvidia-smi).
    type: str
    choices: [auto, mig-parted, nvidia-smi]
    default: auto
  gpu_reset:
    description: Reset a GPU whose MIG mode is left pending (C(nvidia-smi --gpu-reset -i N)).
    type: bool
    default: true
  node:
    description: The node's name in messages. The host name when omitted.
    type: str
  nvidia_smi_path:
    description: Path of C(nvidia-smi). Searched for in C(PATH) when omitted.
    type: path
  timeout:
    description: Seconds each command may take.
    type: int
    default: 120
notes:
  - Nothing here cordons the node or moves its pods; the nvidia_mig role does that (through the Kubernetes API) before
    it calls this module for a change.
author: GPU platform team (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Split every GPU into two 3g.40gb instances
  gpu_ops.cluster.nvidia_mig:
    config_name: all-3g.40gb
    config:
      - devices: all
        mig-enabled: true
        mig-devices:
          3g.40gb: 2
    strategy: single
"""

RETURN = r"""
plan:
  description: Per GPU that differs, what was (or in check mode would be) done.
  returned: always
  type: list
  elements: dict
gpus:
  description: Each GPU after the run, with its MIG mode and MIG devices (profile, UUID).
  returned: always
  type: list
  elements: dict
reboot_required:
  description: GPU indexes whose MIG mode is still pending; their instances are made by a run after the reboot.
  returned: always
  type: list
  elements: int
expected_resources:
  description: What the device plugin should advertise on the node once the layout is in place.
  returned: always
  type: dict
tool:
  description: The tool that made the changes (C(nvidia-smi) or C(mig-parted)); C(none) when nothing changed.
  returned: always
  type: str
"""

import json
import os
import shutil
import tempfile
from typing import Any, Callable, Dict, List, Sequence

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpu_ops.cluster.plugins.module_utils import mig_layout, mig_profiles
from ansible_collections.gpu_ops.cluster.plugins.module_utils.nvidia_gpu import CommandResult, run_with_timeout

QUERY = "--query-gpu=index,name,uuid,mig.mode.current,mig.mode.pending,pci.device_id,pci.sub_device_id"
APPS = "--query-compute-apps=pid,process_name,gpu_uuid,used_memory"


class MigError(Exception):
    pass


class Host:
    """The nvidia-smi calls; `runner` is swapped in unit tests."""

    def __init__(self, nvidia_smi: str, timeout: float,
                 runner: Callable[[Sequence[str], float], CommandResult] = run_with_timeout) -> None:
        self.nvidia_smi, self.timeout, self.runner = nvidia_smi, timeout, runner
        self.commands: List[str] = []

    def run(self, *args: str, record: bool = False) -> CommandResult:
        argv = [self.nvidia_smi] + list(args)
        if record:
            self.commands.append(" ".join(["nvidia-smi"] + list(args)))
        result = self.runner(argv, self.timeout)
        if result.timed_out:
            raise MigError("%s did not finish within %s s" % (" ".join(argv), self.timeout))
        return result

    def must(self, *args: str) -> str:
        result = self.run(*args, record=True)
        if result.rc != 0:
            raise MigError("nvidia-smi %s exited with %s: %s" % (" ".join(args), result.rc,
                                                                 " ".join((result.stdout + result.stderr).split())))
        return result.stdout

    def read(self) -> List[Dict[str, Any]]:
        """Each GPU: index, name, uuid, mig_mode, mig_mode_pending, mig_capable, pci_device_id, pci_sub_system_id
        (0x233010DE, as nvidia-smi prints them; what a config's device-filter is matched with), instances,
        mig_devices."""
        result = self.run(QUERY, "--format=csv,noheader")
        if result.rc != 0:
            raise MigError("nvidia-smi %s exited with %s: %s" % (QUERY, result.rc, " ".join(result.stdout.split())))
        gpus = []
        for line in result.stdout.splitlines():
            cells = [cell.strip() for cell in line.split(", ")]
            if len(cells) != 7 or not cells[0].isdigit():
                continue
            gpus.append({"index": int(cells[0]), "name": cells[1], "uuid": cells[2], "mig_mode_raw": cells[3],
                         "mig_mode": mig_layout.mode_of(cells[3]), "mig_mode_pending": mig_layout.mode_of(cells[4]),
                         "mig_capable": mig_layout.mode_of(cells[3]) is not None,
                         "pci_device_id": mig_layout.pci_id_of(cells[5]),
                         "pci_sub_system_id": mig_layout.pci_id_of(cells[6]), "instances": [], "mig_devices": []})
        if any(gpu["mig_mode"] == "enabled" for gpu in gpus):
            listed = self.run("mig", "-lgi")
            instances = mig_layout.parse_lgi(listed.stdout) if listed.rc == 0 else {}
            devices = {gpu["index"]: gpu["mig_devices"] for gpu in mig_layout.parse_list(self.run("-L").stdout)}
            for gpu in gpus:
                gpu["instances"] = instances.get(gpu["index"], [])
                gpu["mig_devices"] = devices.get(gpu["index"], [])
        return gpus

    def processes(self) -> List[Dict[str, str]]:
        result = self.run(APPS, "--format=csv,noheader")
        out = []
        for line in result.stdout.splitlines() if result.rc == 0 else []:
            cells = [cell.strip() for cell in line.split(", ")]
            if len(cells) >= 3 and cells[0].isdigit():
                out.append({"pid": cells[0], "name": cells[1], "gpu_uuid": cells[2]})
        return out


def _gpu(gpus: Sequence[Dict[str, Any]], index: int) -> Dict[str, Any]:
    return next(gpu for gpu in gpus if gpu["index"] == index)


def destroy(host: Host, index: int) -> None:
    """Every compute then GPU instance of one GPU (nothing there is not an error)."""
    for flag in ("-dci", "-dgi"):
        result = host.run("mig", flag, "-i", str(index), record=True)
        text = result.stdout + result.stderr
        if result.rc != 0 and "not found" not in text.lower() and "no gpu instance" not in text.lower() \
                and "no compute instance" not in text.lower():
            raise MigError("nvidia-smi mig %s -i %d exited with %s: %s" % (flag, index, result.rc, " ".join(text.split())))


def create(host: Host, gpu: Dict[str, Any], devices: Dict[str, int]) -> None:
    geometry = mig_profiles.product(gpu["name"])
    tried = []
    for order in mig_profiles.creation_orders(geometry, devices):
        ids = ",".join(str(geometry.profile(name).id) for name in order)
        result = host.run("mig", "-cgi", ids, "-i", str(gpu["index"]), "-C", record=True)
        if result.rc == 0:
            return
        tried.append("%s: %s" % (" ".join(order), " ".join((result.stdout + result.stderr).split())[-200:]))
        destroy(host, gpu["index"])
        if len(tried) >= 12:
            break
    raise MigError("GPU %d (%s): the driver placed none of the creation orders tried (%s)"
                   % (gpu["index"], gpu["name"], "; ".join(tried)))


def mode_now(host: Host, index: int) -> str:
    """One GPU's current MIG mode (one query of that GPU, not the whole read with its instances and devices)."""
    result = host.run("-i", str(index), "--query-gpu=mig.mode.current", "--format=csv,noheader")
    if result.rc != 0:
        raise MigError("nvidia-smi -i %d --query-gpu=mig.mode.current exited with %s: %s"
                       % (index, result.rc, " ".join((result.stdout + result.stderr).split())))
    return mig_layout.mode_of(result.stdout.strip()) or "unsupported"


def apply_nvidia_smi(host: Host, gpus: List[Dict[str, Any]], actions: Sequence[Dict[str, Any]], gpu_reset: bool
                     ) -> List[int]:
    """Change each GPU of the plan; the indexes whose MIG mode stays pending (a reboot makes it effective)."""
    reboot: List[int] = []
    for action in actions:
        index, enabled = action["index"], action["after"]["enabled"]
        wanted_mode = "enabled" if enabled else "disabled"
        if action["destroy"]:
            destroy(host, index)
        if action["mode"]:
            host.must("-i", str(index), "-mig", "1" if enabled else "0")
        mode = mode_now(host, index)
        if mode != wanted_mode and gpu_reset:
            host.run("--gpu-reset", "-i", str(index), record=True)
            mode = mode_now(host, index)
        if mode != wanted_mode:
            reboot.append(index)
            continue
        if action["create"]:
            create(host, _gpu(gpus, index), action["after"]["devices"])
    return reboot


def apply_mig_parted(module: AnsibleModule, binary: str, name: str, config: List[Dict[str, Any]]) -> List[str]:
    document = {"version": mig_layout.PARTED_VERSION, "mig-configs": {name: config}}
    handle, path = tempfile.mkstemp(prefix="gpu-mig-", suffix=".json")
    try:
        with os.fdopen(handle, "w") as stream:
            json.dump(document, stream)  # JSON is YAML: mig-parted reads it as its config file
        argv = [binary, "apply", "-f", path, "-c", name]
        rc, out, err = module.run_command(argv)
        if rc != 0:
            raise MigError("%s exited with %s: %s" % (" ".join(argv), rc, " ".join((out + err).split())[-800:]))
    finally:
        os.unlink(path)
    return ["nvidia-mig-parted apply -f <config> -c %s" % name]


def decide(host: Host, params: Dict[str, Any]) -> Dict[str, Any]:
    """Read, check and plan; raises MigError with every problem found."""
    gpus = host.read()
    where = "config %r" % params["config_name"]
    problems = mig_layout.entry_problems(params["config"], where)
    if problems:
        raise MigError("; ".join(problems))
    wanted, problems = mig_layout.desired_by_gpu(params["config"], gpus, where)
    node = params["node"]
    # The input the user chose the layout with, named first (the layout itself may come from a file of NVIDIA's).
    problems += ["nvidia_mig_config=%r: %s" % (params["config_name"], problem)
                 for problem in mig_layout.fit_problems(gpus, wanted, node)]
    if not problems:
        problems += mig_layout.strategy_problems(params["strategy"], gpus, wanted, node, params["config_name"])
    if problems:
        raise MigError("; ".join(problems))
    return {"gpus": gpus, "wanted": wanted, "plan": mig_layout.plan(gpus, wanted),
            "expected_resources": mig_layout.expected_resources(params["strategy"], mig_layout.final_layout(gpus, wanted),
                                                                len(gpus))}


def busy(host: Host, gpus: Sequence[Dict[str, Any]], actions: Sequence[Dict[str, Any]]) -> List[str]:
    changing = {_gpu(gpus, a["index"])["uuid"]: a["index"] for a in actions}
    return ["GPU %d: pid %s (%s)" % (changing[p["gpu_uuid"]], p["pid"], p["name"])
            for p in host.processes() if p["gpu_uuid"] in changing]


def run(module: AnsibleModule, host: Host, params: Dict[str, Any]) -> Dict[str, Any]:
    decided = decide(host, params)
    gpus, actions = decided["gpus"], decided["plan"]
    result = {"changed": bool(actions), "plan": actions, "gpus": gpus, "reboot_required": [],
              "expected_resources": decided["expected_resources"], "tool": "none", "commands": []}
    if not actions or module.check_mode:
        return result
    running = busy(host, gpus, actions)
    if running:
        raise MigError("processes run on GPUs the layout changes, nothing was changed: %s; stop them (the nvidia_mig "
                       "role evicts the node's GPU pods first)" % "; ".join(running))
    binary = shutil.which("nvidia-mig-parted") if params["tool"] in ("auto", "mig-parted") else None
    if params["tool"] == "mig-parted" and not binary:
        raise MigError("tool=mig-parted, but nvidia-mig-parted is not installed on %s" % params["node"])
    if binary:
        result["tool"] = "mig-parted"
        result["commands"] = apply_mig_parted(module, binary, params["config_name"], params["config"])
        reboot = []
    else:
        result["tool"] = "nvidia-smi"
        reboot = apply_nvidia_smi(host, gpus, actions, params["gpu_reset"])
        result["commands"] = host.commands
    after = host.read()
    left = [a for a in mig_layout.plan(after, decided["wanted"]) if a["index"] not in reboot]
    result["gpus"], result["reboot_required"] = after, reboot
    if left:
        raise MigError("after the change GPUs still differ from config %r: %s" % (
            params["config_name"], "; ".join("GPU %d has %s, wants %s" % (a["index"], a["before"], a["after"])
                                             for a in left)))
    return result


def main() -> None:
    module = AnsibleModule(argument_spec=dict(
        config_name=dict(type="str", required=True),
        config=dict(type="list", elements="dict", required=True),
        strategy=dict(type="str", choices=list(mig_layout.STRATEGIES), default="mixed"),
        tool=dict(type="str", choices=["auto", "mig-parted", "nvidia-smi"], default="auto"),
        gpu_reset=dict(type="bool", default=True),
        node=dict(type="str"),
        nvidia_smi_path=dict(type="path"),
        timeout=dict(type="int", default=120),
    ), supports_check_mode=True)
    params = dict(module.params)
    params["node"] = params["node"] or os.uname()[1]
    nvidia_smi = params["nvidia_smi_path"] or module.get_bin_path("nvidia-smi")
    if not nvidia_smi:
        module.fail_json(msg="nvidia-smi was not found on %s; the driver must be installed first" % params["node"])
    try:
        result = run(module, Host(nvidia_smi, params["timeout"]), params)
    except MigError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
