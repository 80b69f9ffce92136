# -*- coding: utf-8 -*-
# Copyright: the gpu-cluster project. Apache License 2.0 (see LICENSE)
"""The owner of a repository entry several node roles need (`<role>_repository: auto|own|external`): the probe's
question and the decision from its answer (module_utils/apt_repository.py holds the rule)."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence

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


def apt_repository_index(repository: Optional[Mapping[str, Any]], package_manager: str, names: Sequence[str],
                         prefixes: Sequence[str] = (), architecture: str = "x86_64") -> Dict[str, Any]:
    """host_probe's `index` option: the repository's own Packages index and the names to look for in it."""
    return apt_repository.index_spec(repository, package_manager, list(names or []), list(prefixes or []),
                                     architecture)


def apt_repository_index_problems(index: Optional[Mapping[str, Any]], names: Sequence[str], variable: str, value: Any,
                                  offered_pattern: str = "") -> List[str]:
    """A refusal naming the input when the repository's index lacks a package the selection installs."""
    return apt_repository.index_problems(index, list(names or []), variable, value, offered_pattern)


class FilterModule:
    def filters(self) -> Dict[str, Any]:
        return {"apt_repository_search": apt_repository_search, "apt_repository_plan": apt_repository_plan,
                "apt_repository_index": apt_repository_index,
                "apt_repository_index_problems": apt_repository_index_problems}
