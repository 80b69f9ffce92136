"""mig-parted's whole config file taken as published: `nvidia_mig_parted_config` holds a file in the shape of NVIDIA's
config-default.yaml (`version: v1` on top, `mig-configs` below; our own fixture, fixtures/mig_parted/, since
mig-parted's Go module is not served to this project) unchanged, and every config in it can be named in
`nvidia_mig_config`. The file is read as an inventory's group_vars are (Ansible's DataLoader), checked by the role's
argument spec (as Ansible validates a role's inputs at its start) and by the role's preflight rendered by Ansible's
templar, and the config the role's tasks hand to the nvidia_mig module is the file's entry list itself.

The file's own rules are those of mig-parted's loader (api/spec/v1 Spec.UnmarshalJSON): `version` present and `v1`,
no top-level key but `version` and `mig-configs`, `mig-configs` not empty; each refusal names the full path, the
value and what is allowed, before anything is read or changed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

import pytest
import yaml

from conftest import REPO_ROOT
from test_input_forms import preflight

from ansible_collections.gpu_ops.cluster.plugins.filter.mig import nvidia_mig_config_problems
from ansible_collections.gpu_ops.cluster.plugins.module_utils import mig_layout as ml

FIXTURE = Path(__file__).parent / "fixtures" / "mig_parted" / "device-filter-configs.yaml"
ROLE = REPO_ROOT / "roles" / "nvidia_mig"


def published_file() -> Dict[str, Any]:
    """The fixture as an inventory's group_vars file gives it to a play (Ansible's loader and YAML types)."""
    from ansible.parsing.dataloader import DataLoader

    return DataLoader().load_from_file(str(FIXTURE))


DOCUMENT = published_file()
NAMES = sorted(DOCUMENT["mig-configs"])


def test_the_fixture_is_a_whole_file_with_several_devices_all_entries_told_apart_by_device_filter():
    """What makes the fixture worth testing with: the published file's shape, not a hand-picked part of it."""
    assert set(DOCUMENT) == {"version", "mig-configs"} and DOCUMENT["version"] == "v1"
    filtered_all = [entry for entries in DOCUMENT["mig-configs"].values() for entry in entries
                    if entry["devices"] == "all" and "device-filter" in entry]
    assert len(filtered_all) >= 6
    assert any(isinstance(e["device-filter"], str) for e in filtered_all)
    assert any(isinstance(e["device-filter"], list) for e in filtered_all)
    assert any(sum(1 for e in entries if e["devices"] == "all" and "device-filter" in e) >= 3
               for entries in DOCUMENT["mig-configs"].values())


@pytest.mark.parametrize("name", NAMES)
def test_every_config_of_the_whole_file_passes_the_roles_preflight(name):
    assert preflight("nvidia_mig").problems(nvidia_mig_parted_config=DOCUMENT, nvidia_mig_config=name) == []


def _module_configs(tasks: List[Any]) -> List[Any]:
    """The `config:` of every nvidia_mig module task, blocks and rescues included."""
    found = []
    for task in tasks:
        if "gpu_ops.cluster.nvidia_mig" in task:
            found.append(task["gpu_ops.cluster.nvidia_mig"]["config"])
        for key in ("block", "rescue", "always"):
            found.extend(_module_configs(task.get(key) or []))
    return found


def _config_given_to_the_module(**variables: Any) -> Any:
    """The value of `config:` of the role's nvidia_mig tasks (plan, apply, apply after a reboot: one expression),
    rendered as a play renders it."""
    from ansible.template import Templar

    role = preflight("nvidia_mig")
    tasks = role.loader.load_from_file(str(ROLE / "tasks" / "main.yml"), trusted_as_template=True)
    expressions = _module_configs(tasks)
    assert len(expressions) == 3 and len(set(map(str, expressions))) == 1, expressions
    return Templar(loader=role.loader, variables=dict(role.base, **variables)).template(expressions[0])


@pytest.mark.parametrize("name", NAMES)
def test_the_roles_tasks_give_the_module_the_files_entries_unchanged(name):
    assert _config_given_to_the_module(nvidia_mig_parted_config=DOCUMENT, nvidia_mig_config=name) == \
        DOCUMENT["mig-configs"][name]


def test_without_a_file_the_built_ins_and_ones_own_configs_are_given():
    builtin = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())["_nvidia_mig_builtin_configs"]
    assert _config_given_to_the_module(nvidia_mig_config="all-enabled") == builtin["all-enabled"]
    own = {"inference": [{"devices": [0], "mig-enabled": True, "mig-devices": {"3g.40gb": 2}}]}
    assert _config_given_to_the_module(nvidia_mig_configs=own, nvidia_mig_config="inference") == own["inference"]


def test_the_whole_file_and_configs_of_ones_own_are_both_known():
    own = {"inference": [{"devices": [0], "mig-enabled": True, "mig-devices": {"3g.40gb": 2}}]}
    assert preflight("nvidia_mig").problems(nvidia_mig_parted_config=DOCUMENT, nvidia_mig_configs=own,
                                            nvidia_mig_config="inference") == []
    known = ml.known_configs({"all-disabled": []}, DOCUMENT, own)
    assert sorted(known) == sorted(set(NAMES) | {"inference"})
    assert known["all-disabled"] == DOCUMENT["mig-configs"]["all-disabled"]  # the file's replaces the built-in


def test_a_config_named_in_neither_lists_the_files_configs():
    problems = preflight("nvidia_mig").problems(nvidia_mig_parted_config=DOCUMENT, nvidia_mig_config="all-2g.20gb")
    assert len(problems) == 1 and problems[0].startswith("nvidia_mig_config='all-2g.20gb' names no config; known: ")
    assert "all-balanced" in problems[0] and "all-1g.10gb.me" in problems[0]


def _with(**changes: Any) -> Dict[str, Any]:
    document = dict(DOCUMENT)
    for key, value in changes.items():
        if value is _DROP:
            document.pop(key)
        else:
            document[key] = value
    return document


_DROP = object()
P = "nvidia_mig_parted_config"


@pytest.mark.parametrize("document, message", [
    (_with(version=_DROP), f"{P}: no version (mig-parted refuses a file without one); allowed: version: v1"),
    (_with(version="v2"), f"{P}.version='v2': not a version mig-parted reads (api/spec/v1); allowed: 'v1'"),
    (_with(version=1), f"{P}.version=1: not a version mig-parted reads (api/spec/v1); allowed: 'v1'"),
    (_with(bogus="field"), f"{P}: unexpected keys bogus (mig-parted refuses the file); allowed: version, mig-configs"),
    (_with(**{"mig-configs": {}}), f"{P}.mig-configs={{}}: mig-parted needs at least one config there; allowed: "),
    (_with(**{"mig-configs": [{"all-disabled": []}]}),
     f"{P}.mig-configs=[{{'all-disabled': []}}]: must be a mapping of config name to a list of entries"),
    (_with(**{"mig-configs": {"x": []}}), f"{P}.mig-configs['x']=[]: must be a non-empty list"),
    (_with(**{"mig-configs": {"x": [{"devices": "some", "mig-enabled": False}]}}),
     f"{P}.mig-configs['x'][0].devices='some': must be 'all' or a non-empty list of GPU indexes"),
    (_with(**{"mig-configs": {"x": [{"device-filter": 0x233010DE, "devices": "all", "mig-enabled": False}]}}),
     f"{P}.mig-configs['x'][0].device-filter=590352606: must be a PCI device id string or a list of them, quoted"),
    ("version: v1", f"{P}='version: v1': must be mig-parted's config file, a mapping; allowed: "),
])
def test_a_file_mig_parted_would_refuse_is_refused_before_anything_changes_naming_path_value_and_allowed(
        document, message):
    problems = preflight("nvidia_mig").problems(nvidia_mig_parted_config=document)
    assert any(problem.startswith(message) for problem in problems), problems


def test_an_empty_file_or_one_with_only_a_version_is_taken_as_mig_parted_takes_it():
    for document in ({}, None, {"version": "v1"}):
        assert ml.parted_config_problems(document) == []
        assert nvidia_mig_config_problems({}, "all-disabled", {"all-disabled": []}, document) == []


def test_a_name_in_the_file_and_in_nvidia_mig_configs_is_refused():
    own = {"all-balanced": [{"devices": "all", "mig-enabled": False}]}
    problems = preflight("nvidia_mig").problems(nvidia_mig_parted_config=DOCUMENT, nvidia_mig_configs=own)
    assert problems == ["nvidia_mig_configs['all-balanced']: also defined in nvidia_mig_parted_config.mig-configs; "
                        "allowed: each config name once (rename one)"]


def _argument_spec() -> Dict[str, Any]:
    return yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]["options"]


def _spec_errors(value: Any) -> List[str]:
    """What Ansible's role argument validation (validate_argument_spec) says of nvidia_mig_parted_config=value."""
    from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

    spec = {P: _argument_spec()[P]}
    return [str(error) for error in ArgumentSpecValidator(spec).validate({P: value}).error_messages]


def test_the_argument_spec_takes_the_whole_file_and_refuses_another_version():
    assert _spec_errors(DOCUMENT) == []
    assert _spec_errors({}) == []
    assert any("v1" in error and "v2" in error for error in _spec_errors(_with(version="v2")))
    assert any("bogus" in error for error in _spec_errors(_with(bogus="field")))
