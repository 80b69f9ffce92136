"""The node roles' package probe: installed packages in package_facts' format, held packages, and whether apt has a
package index (images delete /var/lib/apt/lists/*_* and keep a fresh mtime, which cache_valid_time trusts)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import load_ansible_module

apt_state = load_ansible_module("apt_state")

# dpkg-query -W -f='${Package}\t${Version}\t${Architecture}\t${Status}\n', as a host with holds prints it.
RECORDED = (
    "nvidia-driver\t550.163.01-2\tamd64\thold ok installed\n"
    "nvidia-smi\t550.163.01-2\tamd64\tinstall ok installed\n"
    "libc6\t2.36-9+deb12u10\tamd64\tinstall ok installed\n"
    "libc6\t2.36-9+deb12u10\ti386\tinstall ok installed\n"
    "nvidia-kernel-dkms\t535.247.01-1\tamd64\tdeinstall ok config-files\n"
    "cuda-toolkit-12-8\t\t\tunknown ok not-installed\n"
)
# What a run interrupted during dpkg's configure step leaves.
INTERRUPTED = RECORDED + "nvidia-persistenced\t550.163.01-1\tamd64\tinstall ok half-configured\n"

NOT_INDEXES = ["lock", "deb.debian.org_debian_dists_bookworm_InRelease",
               "deb.debian.org_debian_dists_bookworm_main_i18n_Translation-en.lz4",
               "deb.debian.org_debian_dists_bookworm_main_source_Sources.xz"]


def test_installed_packages_are_read_in_package_facts_format_with_their_holds():
    packages, held, pending = apt_state.parse_query(RECORDED)
    assert sorted(packages) == ["libc6", "nvidia-driver", "nvidia-smi"]
    assert packages["nvidia-smi"] == [{"name": "nvidia-smi", "version": "550.163.01-2", "arch": "amd64",
                                       "source": "apt"}]
    assert [item["arch"] for item in packages["libc6"]] == ["amd64", "i386"]
    assert held == ["nvidia-driver"] and pending == []


def test_a_package_dpkg_left_between_states_or_a_journal_entry_means_dpkg_was_interrupted(tmp_path: Path):
    _, _, pending = apt_state.parse_query(INTERRUPTED)
    assert pending == ["nvidia-persistenced half-configured"]
    (tmp_path / "updates").mkdir()
    assert apt_state.journal_entries(str(tmp_path)) == 0
    (tmp_path / "updates" / "0000").write_bytes(b"Package: nvidia-smi\n")
    (tmp_path / "updates" / "tmp.i").write_bytes(b"")  # dpkg's scratch name, not an entry
    assert apt_state.journal_entries(str(tmp_path)) == 1
    assert apt_state.journal_entries(str(tmp_path / "absent")) == 0


@pytest.mark.parametrize("index", [
    "deb.debian.org_debian_dists_bookworm_main_binary-amd64_Packages",
    "deb.debian.org_debian_dists_bookworm_main_binary-amd64_Packages.lz4",  # Acquire::GzipIndexes (Docker's images)
    "deb.debian.org_debian_dists_bookworm_main_binary-amd64_Packages.xz",
    "127.0.0.1:8080_libnvidia-container_stable_deb_amd64_Packages",  # a flat repository (NVIDIA's layout)
])
def test_a_package_index_is_counted(tmp_path: Path, index):
    for name in NOT_INDEXES + [index]:
        (tmp_path / name).write_bytes(b"")
    assert apt_state.count_indexes(str(tmp_path)) == 1


def test_an_emptied_image_and_a_missing_directory_have_no_index(tmp_path: Path):
    (tmp_path / "partial").mkdir()
    (tmp_path / "partial" / "x_main_binary-amd64_Packages.xz").write_bytes(b"")  # unfinished download
    (tmp_path / "lock").write_bytes(b"")
    assert apt_state.count_indexes(str(tmp_path)) == 0
    assert apt_state.count_indexes(str(tmp_path / "absent")) == 0


@pytest.mark.skipif(shutil.which("dpkg-query") is None, reason="dpkg is not installed here")
def test_the_recorded_format_is_what_dpkg_query_prints():
    out = subprocess.run(["dpkg-query", "-W", "-f=" + apt_state.QUERY_FORMAT, "dpkg"], capture_output=True, text=True, check=True).stdout
    packages, _, _ = apt_state.parse_query(out)
    assert packages["dpkg"][0]["version"]
