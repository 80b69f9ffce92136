"""roles/_common/tasks/apt_lists.yml: does the host have a package index? Its find task runs here through Ansible's
own find module, in check mode as in a drift run, against a directory laid out like /var/lib/apt/lists (names as apt
writes them), and its fact is rendered by Ansible's templar from that result.

An image that deleted /var/lib/apt/lists/*_* (the lab's, most container and cloud images) keeps a fresh directory
mtime, which the apt module's cache_valid_time trusts: the roles refresh the index when this fact says it is empty.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

import pytest
import yaml
from ansible.modules import find
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template
from conftest import ModuleRunner, REPO_ROOT

TASKS = yaml.safe_load((REPO_ROOT / "roles" / "_common" / "tasks" / "apt_lists.yml").read_text(encoding="utf-8"))

# What apt leaves next to its indexes, and after an image's `rm -rf /var/lib/apt/lists/*_*`.
NOT_INDEXES = [
    "lock",
    "auxfiles/",
    "partial/",
    "deb.debian.org_debian_dists_bookworm_InRelease",
    "deb.debian.org_debian_dists_bookworm_Release",
    "deb.debian.org_debian_dists_bookworm_Release.gpg",
    "deb.debian.org_debian_dists_bookworm_main_i18n_Translation-en",
    "deb.debian.org_debian_dists_bookworm_main_i18n_Translation-en.lz4",
    "deb.debian.org_debian_dists_bookworm_main_dep11_Components-amd64.yml.gz",
    "deb.debian.org_debian_dists_bookworm_main_source_Sources.xz",
    "partial/deb.debian.org_debian_dists_bookworm_main_binary-amd64_Packages.xz",
]


def task(module: str) -> Dict[str, Any]:
    (found,) = [entry for entry in TASKS if module in entry]
    return found


def lay_out(root: Path, names: List[str]) -> Path:
    lists = root / "lists"
    lists.mkdir()
    for name in names:
        path = lists / name
        if name.endswith("/"):
            path.mkdir(exist_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"")
    return lists


def lists_empty(tmp_path: Path, patched_ansible_module: List[str], names: List[str]) -> bool:
    """The fact the callers read, from the role's own find arguments and set_fact expression."""
    args = dict(task("ansible.builtin.find")["ansible.builtin.find"], paths=str(lay_out(tmp_path, names)))
    runner = ModuleRunner(find, patched_ansible_module)
    found = runner.exit(args, check_mode=True)
    assert runner.ran_in_check_mode, "the find task must answer in check mode too"
    expression = task("ansible.builtin.set_fact")["ansible.builtin.set_fact"]["__common_apt_lists_empty"]
    templar = Templar(loader=DataLoader(), variables={"__common_apt_indexes": found})
    return templar.template(trust_as_template(expression))


@pytest.mark.parametrize("index", [
    "deb.debian.org_debian_dists_bookworm_main_binary-amd64_Packages",
    "deb.debian.org_debian_dists_bookworm_main_binary-amd64_Packages.lz4",  # Acquire::GzipIndexes (Docker's images)
    "deb.debian.org_debian_dists_bookworm_main_binary-amd64_Packages.gz",
    "deb.debian.org_debian_dists_bookworm_main_binary-amd64_Packages.xz",
    "deb.debian.org_debian_dists_bookworm_main_binary-amd64_Packages.zst",
    "127.0.0.1:8080_libnvidia-container_stable_deb_amd64_Packages",  # a flat repository (NVIDIA's layout)
])
def test_a_package_index_is_seen(tmp_path, patched_ansible_module, index):
    assert lists_empty(tmp_path, patched_ansible_module, NOT_INDEXES + [index]) is False


def test_lists_without_a_package_index_are_empty(tmp_path, patched_ansible_module):
    assert lists_empty(tmp_path, patched_ansible_module, NOT_INDEXES) is True


def test_an_emptied_image_is_empty(tmp_path, patched_ansible_module):
    """What labctl's customise_rootfs and most images leave: lock and partial/ only."""
    assert lists_empty(tmp_path, patched_ansible_module, ["lock", "partial/"]) is True


def test_a_missing_lists_directory_is_empty(tmp_path, patched_ansible_module):
    args = dict(task("ansible.builtin.find")["ansible.builtin.find"], paths=str(tmp_path / "absent"))
    found = ModuleRunner(find, patched_ansible_module).exit(args, check_mode=True)
    assert found["matched"] == 0
