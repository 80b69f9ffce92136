# -*- coding: utf-8 -*-
# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)
"""Filters of the nvidia_container_toolkit role: Docker's daemon.json merge and package version checks."""

from __future__ import annotations

import json

from ansible.errors import AnsibleFilterError


def json_problem(text: str) -> str:
    """'' when text is a JSON object, else why not (an empty file counts as an empty object, as dockerd reads it)."""
    if not text.strip():
        return ""
    try:
        document = json.loads(text)
    except ValueError as exc:
        return f"invalid JSON: {exc}"
    return "" if isinstance(document, dict) else f"the top level is a JSON {type(document).__name__}, not an object"


def docker_daemon_config(text: str, runtime_name: str, runtime_binary: str, as_default: bool,
                         restore_default: str | None = None) -> dict:
    """The user's daemon.json with the NVIDIA runtime merged in; every other key is kept as it was.

    restore_default is None unless an earlier run made the runtime Docker's default; then it is the default-runtime
    that run found ('' for none), put back when the runtime is no longer asked to be the default and the file still
    names it (a default someone changed since is theirs and stays)."""
    problem = json_problem(text)
    if problem:
        raise AnsibleFilterError(f"daemon.json: {problem}")
    config = json.loads(text) if text.strip() else {}
    runtimes = dict(config.get("runtimes") or {})
    runtime = dict(runtimes.get(runtime_name) or {})
    runtime["path"] = runtime_binary
    runtime.setdefault("args", [])
    runtimes[runtime_name] = runtime
    merged = {**config, "runtimes": runtimes}
    if as_default:
        merged["default-runtime"] = runtime_name
    elif restore_default is not None and config.get("default-runtime") == runtime_name:
        if restore_default:
            merged["default-runtime"] = restore_default
        else:
            del merged["default-runtime"]
    return merged


def docker_foreign_runtime(text: str, runtime_name: str, runtime_binary: str, recorded: dict | None = None,
                           path: str = "daemon.json") -> str:
    """Why daemon.json's runtime entry runtime_name is another owner's, or '' when there is none, it already runs
    runtime_binary (nothing to change), or the role's record says an earlier run of the role wrote it (then a changed
    runtime_binary is the role's to change). The GPU Operator's toolkit and a hand-run `nvidia-ctk runtime configure
    --runtime=docker` write `runtimes.nvidia` with path `nvidia-container-runtime`."""
    if json_problem(text) or not text.strip():
        return ""
    runtime = (json.loads(text).get("runtimes") or {}).get(runtime_name)
    if runtime is None:
        return ""
    recorded = recorded or {}
    if "docker" in (recorded.get("runtimes") or []) and recorded.get("runtime_name") == runtime_name:
        return ""
    if isinstance(runtime, dict) and runtime.get("path") == runtime_binary:
        return ""
    return (f"{path} already has a runtime {runtime_name!r} that this role did not write ({json.dumps(runtime)}; the "
            f"GPU Operator's toolkit or a hand-run `nvidia-ctk runtime configure --runtime=docker` writes one): it was "
            f"left as it is and nothing was changed. Choose one: leave Docker's NVIDIA runtime to that owner (take "
            f"docker out of nvidia_container_toolkit_runtimes), or let the role set it to {runtime_binary} "
            f"(nvidia_container_toolkit_take_over: true).")


def off_version(packages: dict, names: list, version: str) -> list:
    """Names of installed packages whose upstream version is not version (package_facts' apt data)."""
    found = []
    for name in names:
        installed = [entry.get("version", "") for entry in packages.get(name, [])]
        if installed and not any(v.split("-")[0].split(":")[-1] == version for v in installed):
            found.append(name)
    return found


class FilterModule:
    def filters(self) -> dict:
        return {
            "nvidia_container_toolkit_json_problem": json_problem,
            "nvidia_container_toolkit_daemon_config": docker_daemon_config,
            "nvidia_container_toolkit_off_version": off_version,
            "nvidia_container_toolkit_docker_foreign_runtime": docker_foreign_runtime,
        }
