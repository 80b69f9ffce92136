# -*- coding: utf-8 -*-
# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)
"""The owner of a repository entry several node roles need (`<role>_repository: auto|own|external`): the probe's
question and the decision from its answer (module_utils/apt_repository.py holds the rule)."""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional

from ansible.errors import AnsibleFilterError
from ansible_collections.gpu_ops.cluster.plugins.module_utils import apt_repository


def apt_repository_search(repository: Optional[Mapping[str, Any]], mode: str, package_manager: str,
                          sources_file: str) -> Dict[str, Any]:
    """host_probe's `search` option: the other apt sources that list the repository's URL."""
    try:
        return apt_repository.search_spec(repository, mode, package_manager, sources_file)
    except ValueError as exc:
        raise AnsibleFilterError("apt_repository_search: %s" % exc) from exc


def apt_repository_plan(probe: Optional[Mapping[str, Any]], repository: Optional[Mapping[str, Any]], mode: str,
                        package_manager: str, key_file: str, sources_file: str, key_url: str = "",
                        role: str = "") -> Dict[str, Any]:
    """Whether the role writes its own entry or uses another file's, from host_probe's answer."""
    try:
        return apt_repository.plan(probe, repository, mode, package_manager, key_file, sources_file,
                                   key_url=key_url, role=role)
    except ValueError as exc:
        raise AnsibleFilterError("apt_repository_plan: %s" % exc) from exc


class FilterModule:
    def filters(self) -> Dict[str, Any]:
        return {"apt_repository_search": apt_repository_search, "apt_repository_plan": apt_repository_plan}
