#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: host_files
short_description: Make several small files on a host have a given content and mode, or be absent, in one remote task
description:
  - Each entry of O(files) is a file the caller owns whole, with its content (given, or fetched by the host from a URL), its
    owner, group and mode, or its absence. The module reads every file, changes only those that differ and says which.
  - One remote task for what M(ansible.builtin.template), M(ansible.builtin.copy), M(ansible.builtin.file) and
    M(ansible.builtin.uri) cost several round trips each (a temporary directory, a stat, the transfer, the attributes).
    Render templates on the controller with P(ansible.builtin.template#lookup) and pass the text as O(files[].content).
  - A file is written to a temporary file in its own directory, synced, then renamed over the old one, so an
    interrupted run leaves the old file or the new one, never half of one. Missing parent directories are created
    (root, mode 0755).
options:
  files:
    description: The files.
    type: list
    elements: dict
    required: true
    suboptions:
      path:
        description: Absolute path of the file.
        type: path
        required: true
      state:
        description: V(present) writes the file, V(absent) removes it (a missing file is no change).
        type: str
        choices: [present, absent]
        default: present
      content:
        description: The whole content. One of O(files[].content) and O(files[].url) with O(files[].state=present).
        type: str
      url:
        description: Fetch the content from this URL on the host (a repository signing key from a mirror).
        type: str
      expect:
        description: >-
          What the fetched or given content must be, checked before anything is written: V(openpgp_armored_key)
          (an ASCII-armoured OpenPGP public key block).
        type: str
        choices: [any, openpgp_armored_key]
        default: any
      inputs:
        description: The inputs the content or URL came from, named in a failure.
        type: list
        elements: str
        default: []
      owner:
        description: Owner of the file.
        type: str
        default: root
      group:
        description: Group of the file.
        type: str
        default: root
      mode:
        description: Mode of the file, an octal string.
        type: str
        default: "0644"
  timeout:
    description: Seconds to wait for each URL.
    type: int
    default: 30
notes:
  - Supports check mode (nothing is written; RV(changed_paths) says what a real run changes) and diff mode (the text
    before and after of each changed file).
author:
  - GPU platform team (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Signing key and apt source of the driver repository
  gpu_ops.cluster.host_files:
    files:
      - path: /etc/apt/keyrings/nvidia-driver.asc
        url: "{{ nvidia_driver_mirror_key_url }}"
        expect: openpgp_armored_key
        inputs: [nvidia_driver_mirror_key_url]
      - path: /etc/apt/sources.list.d/nvidia-driver.sources
        content: "{{ lookup('ansible.builtin.template', 'nvidia-driver.sources.j2') }}"
      - path: /etc/apt/keyrings/cuda-archive.asc
        state: absent
  register: repository
"""

RETURN = r"""
changed_paths:
  description: The files this task changed (or, in check mode, would change), in the order given.
  returned: always
  type: list
  elements: str
  sample: [/etc/apt/sources.list.d/nvidia-driver.sources]
files:
  description: Per file, what was found and done.
  returned: always
  type: list
  elements: dict
  sample: [{"path": "/etc/modprobe.d/blacklist-nouveau.conf", "changed": true, "reason": "content differs"}]
"""

import os
from typing import List

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.text.converters import to_text
from ansible_collections.gpu_ops.cluster.plugins.module_utils.atomic_file import write_atomically
from ansible_collections.gpu_ops.cluster.plugins.module_utils.host_state import FILE_OPTIONS, FileProblem, plan_file


def main() -> None:
    module = AnsibleModule(argument_spec={
        "files": {"type": "list", "elements": "dict", "required": True, "options": FILE_OPTIONS,
                  "mutually_exclusive": [["content", "url"]]},
        "timeout": {"type": "int", "default": 30},
    }, supports_check_mode=True)

    plans: List[dict] = []
    for index, entry in enumerate(module.params["files"]):
        try:
            plans.append(plan_file(entry, "files[%d] (%s)" % (index, entry["path"]), module.params["timeout"]))
        except FileProblem as problem:
            module.fail_json(msg=str(problem))

    changed_paths = [plan["entry"]["path"] for plan in plans if plan["reasons"]]
    if not module.check_mode:
        for plan in plans:
            if not plan["reasons"]:
                continue
            path = plan["entry"]["path"]
            try:
                if plan["entry"]["state"] == "absent":
                    os.unlink(path)
                else:
                    write_atomically(path, plan["body"], plan["mode"], (plan["uid"], plan["gid"]))
            except OSError as error:
                module.fail_json(msg="Could not %s %s: %s" % (
                    "remove" if plan["entry"]["state"] == "absent" else "write", path, error),
                    changed_paths=changed_paths[:changed_paths.index(path)])
    result = {"changed": bool(changed_paths), "changed_paths": changed_paths,
              "files": [{"path": plan["entry"]["path"], "changed": bool(plan["reasons"]),
                         "reason": ", ".join(plan["reasons"])} for plan in plans]}
    if module._diff:
        result["diff"] = [{"before_header": plan["entry"]["path"], "after_header": plan["entry"]["path"],
                           "before": to_text(plan["before"] or b"", errors="replace"),
                           "after": to_text(plan.get("body", b""), errors="replace")}
                          for plan in plans if plan["reasons"]]
    module.exit_json(**result)


if __name__ == "__main__":
    main()
