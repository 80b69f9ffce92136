# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)
"""The lab's connection to its podman containers: containers.podman.podman with pipelining.

containers.podman.podman runs `podman exec` without `-i`, so it cannot pipeline: every module task costs a
`podman mount`, a temporary directory, a copy, a chmod, the run and a clean-up, about five podman calls. Here a
module goes to the container's Python over the stdin of one `podman exec -i`, and the container is mounted only when a
file has to be copied (template, copy). Measured on a converged Molecule host (nvidia_container_toolkit, 40 tasks, no
change): 41 s with containers.podman.podman, 25 s with this plugin. Lab and test tooling only (inventories/lab,
Molecule): it is not part of the collection.
"""

from __future__ import annotations

DOCUMENTATION = r"""
name: gpu_lab_podman
short_description: Run tasks in the lab's podman containers, with pipelining
description:
  - containers.podman.podman with modules piped to the container's Python through C(podman exec -i).
  - The container's file system is mounted only when a file is copied in or out.
author: GPU platform team
options:
  podman_executable:
    description: The podman executable.
    default: podman
    vars:
      - name: ansible_podman_executable
    env:
      - name: ANSIBLE_PODMAN_EXECUTABLE
  podman_extra_args:
    description: Extra arguments for every podman call.
    default: ""
    vars:
      - name: ansible_podman_extra_args
    env:
      - name: ANSIBLE_PODMAN_EXTRA_ARGS
  pipelining:
    description: Send modules over stdin instead of copying them (the reason this plugin exists).
    type: boolean
    default: true
    vars:
      - name: ansible_pipelining
"""

import shlex

from ansible.errors import AnsibleConnectionFailure
from ansible.module_utils.common.text.converters import to_native
from ansible_collections.containers.podman.plugins.connection.podman import Connection as PodmanConnection


# podman's words (exit 255 or 125) for a container that cannot run a command because it is not running or does not exist.
NOT_RUNNING = ("container state improper", "no such container")


class Connection(PodmanConnection):
    transport = "gpu_lab_podman"
    has_pipelining = True

    def _connect(self):
        # ConnectionBase._connect only: the mount waits until a file is copied.
        super(PodmanConnection, self)._connect()
        self._connected = True
        return self

    def _mount(self) -> None:
        if self._mount_point is None:
            PodmanConnection._connect(self)

    def exec_command(self, cmd, in_data=None, sudoable=False):
        super(PodmanConnection, self).exec_command(cmd, in_data=in_data, sudoable=sudoable)
        exec_args = ["exec", "-i"] if in_data is not None else ["exec"]
        if self.user:
            exec_args.extend(("--user", self.user))
        rc, stdout, stderr = self._podman(exec_args, shlex.split(to_native(cmd, errors="surrogate_or_strict")), in_data)
        # A container that is stopped or gone is the lab's host that is down: unreachable, as SSH reports a host it
        # cannot reach, not a module that failed on a host that answered. That includes a command the container's
        # stop killed (rc 137, no word from podman): asked once a command failed, podman says whether it still runs.
        if rc != 0 and (any(sign in to_native(stderr) for sign in NOT_RUNNING) or not self._running()):
            raise AnsibleConnectionFailure(f"container {self._container_id} is not running: "
                                           f"{to_native(stderr).strip() or 'it stopped during the command'}")
        return rc, stdout, stderr

    def _running(self) -> bool:
        rc, stdout, _ = self._podman(["container", "inspect", "--format", "{{.State.Running}}"])
        return rc == 0 and to_native(stdout).strip() == "true"

    def put_file(self, in_path, out_path):
        self._mount()
        super().put_file(in_path, out_path)

    def fetch_file(self, in_path, out_path):
        self._mount()
        super().fetch_file(in_path, out_path)
