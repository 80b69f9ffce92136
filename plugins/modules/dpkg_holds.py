#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: dpkg_holds
short_description: Set the dpkg selection (hold or install) of many packages in one task
description:
  - Reads the selections of all O(names) with one C(dpkg --get-selections) and, where one differs from O(selection),
    sets those with one C(dpkg --set-selections). The same end state as M(ansible.builtin.dpkg_selections) in a loop,
    in one remote task instead of one per package.
  - A package dpkg does not know (not installed) cannot be held; it is reported in RV(unknown) and fails the task
    unless O(unknown) is V(ignore). In check mode such packages are never a failure (a real run would install them
    first); they are reported as RV(unknown).
options:
  names:
    description: The packages.
    type: list
    elements: str
    required: true
  selection:
    description: The selection to set (V(hold) keeps apt from upgrading or removing a package; V(install) releases it).
    type: str
    choices: [hold, install]
    required: true
  unknown:
    description: What to do with a package dpkg does not know.
    type: str
    choices: [fail, ignore]
    default: fail
notes:
  - Supports check mode and diff mode (one line per package, C(name selection)).
requirements:
  - dpkg
author:
  - GPU platform team (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Hold the driver packages at their version
  gpu_ops.cluster.dpkg_holds:
    names: [nvidia-driver, nvidia-smi, nvidia-kernel-dkms]
    selection: hold
"""

RETURN = r"""
changed_packages:
  description: The packages whose selection this task changed (or, in check mode, would change).
  returned: always
  type: list
  elements: str
  sample: [nvidia-smi]
selections:
  description: Each known package's selection before the task.
  returned: always
  type: dict
  sample: {"nvidia-driver": "hold", "nvidia-smi": "install"}
unknown:
  description: Packages dpkg does not know.
  returned: always
  type: list
  elements: str
"""

from typing import Dict, List

from ansible.module_utils.basic import AnsibleModule


def parse_selections(text: str) -> Dict[str, str]:
    """{package: selection} from `dpkg --get-selections` output ("name[:arch]<TAB...>selection")."""
    selections: Dict[str, str] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 2:
            name = fields[0].split(":", 1)[0]
            selections[name] = fields[1]
    return selections


def plan(names: List[str], selection: str, current: Dict[str, str]) -> tuple:
    """(packages to change, packages dpkg does not know), both in the order of names."""
    known = [name for name in dict.fromkeys(names) if name in current]
    unknown = [name for name in dict.fromkeys(names) if name not in current]
    return [name for name in known if current[name] != selection], unknown


def main() -> None:
    module = AnsibleModule(argument_spec={
        "names": {"type": "list", "elements": "str", "required": True},
        "selection": {"type": "str", "choices": ["hold", "install"], "required": True},
        "unknown": {"type": "str", "choices": ["fail", "ignore"], "default": "fail"},
    }, supports_check_mode=True)
    names, selection = module.params["names"], module.params["selection"]
    dpkg = module.get_bin_path("dpkg", required=True)
    current: Dict[str, str] = {}
    if names:
        # dpkg exits 0 and says "no packages found matching" on stderr for names it does not know.
        rc, out, err = module.run_command([dpkg, "--get-selections"] + list(names))
        if rc != 0:
            module.fail_json(msg="dpkg --get-selections failed: %s" % (err or out).strip(), rc=rc)
        current = parse_selections(out)
    change, unknown = plan(names, selection, current)
    result = {"changed": bool(change), "changed_packages": change, "selections": current, "unknown": unknown}
    if module._diff:
        result["diff"] = {"before": "".join("%s %s\n" % (n, current[n]) for n in change),
                          "after": "".join("%s %s\n" % (n, selection) for n in change)}
    if unknown and module.params["unknown"] == "fail" and not module.check_mode:
        module.fail_json(msg="dpkg does not know %s: a package must be installed before it can be set to %s"
                         % (", ".join(unknown), selection), **result)
    if change and not module.check_mode:
        data = "".join("%s %s\n" % (name, selection) for name in change)
        rc, out, err = module.run_command([dpkg, "--set-selections"], data=data)
        if rc != 0:
            module.fail_json(msg="dpkg --set-selections failed: %s" % (err or out).strip(), rc=rc, **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
