"""The node roles' one read per role (host_probe): installed packages in package_facts' format, held packages, whether
apt has a package index (images delete /var/lib/apt/lists/*_* and keep a fresh mtime, which cache_valid_time trusts)
and whether dpkg was interrupted; files compared as host_files would write them; commands, paths, searches, units."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from ansible_collections.gpu_ops.cluster.plugins.module_utils import host_state as apt_state
from conftest import ModuleRunner, load_ansible_module

probe_module = load_ansible_module("host_probe")

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


OWNER = {"owner": str(os.getuid()), "group": str(os.getgid())}


@pytest.fixture
def probe(patched_ansible_module):
    return ModuleRunner(probe_module, patched_ansible_module)


def test_files_are_compared_as_host_files_would_write_them_and_nothing_is_written(probe, tmp_path):
    same, other, missing, stray = (tmp_path / name for name in ("same", "other", "missing", "stray"))
    for path in (same, other, stray):
        path.write_text("old\n")
        path.chmod(0o644)
    result = probe.exit({"files": [{"path": str(same), "content": "old\n", **OWNER},
                                   {"path": str(other), "content": "new\n", **OWNER},
                                   {"path": str(missing), "content": "x\n", **OWNER},
                                   {"path": str(stray), "state": "absent"}]}, check_mode=True)
    assert probe.ran_in_check_mode is True and not result["changed"]
    assert result["differ"] == [str(other), str(missing), str(stray)]
    assert result["files"][str(same)] == {"exists": True, "reason": ""}
    assert result["files"][str(other)] == {"exists": True, "reason": "content differs"}
    assert result["files"][str(missing)] == {"exists": False, "reason": "missing"}
    assert result["files"][str(stray)] == {"exists": True, "reason": "present"}
    assert other.read_text() == "old\n" and not missing.exists() and stray.exists()


def test_a_key_that_cannot_be_fetched_or_is_not_a_key_counts_as_a_difference_with_the_reason(probe, tmp_path):
    page = tmp_path / "page.html"
    page.write_text("<html>404</html>")
    result = probe.exit({"files": [
        {"path": str(tmp_path / "a.asc"), "url": (tmp_path / "gone.asc").as_uri(), "inputs": ["x_key_url"], **OWNER},
        {"path": str(tmp_path / "b.asc"), "url": page.as_uri(), "expect": "openpgp_armored_key", **OWNER}]})
    assert result["differ"] == [str(tmp_path / "a.asc"), str(tmp_path / "b.asc")]
    assert result["files"][str(tmp_path / "a.asc")]["reason"].startswith("Could not fetch file://")
    assert "x_key_url" in result["files"][str(tmp_path / "a.asc")]["reason"]
    assert "not an ASCII-armoured OpenPGP public key" in result["files"][str(tmp_path / "b.asc")]["reason"]


def test_commands_paths_binaries_and_searches_are_answered_by_name(probe, tmp_path):
    (tmp_path / "cuda-12.8").mkdir()
    (tmp_path / "cuda").symlink_to(tmp_path / "cuda-12.8")
    (tmp_path / "state.json").write_text('{"a": 1}\n')
    sources = tmp_path / "sources"
    sources.mkdir()
    (sources / "mine.sources").write_text("URIs: http://mirror/cuda\n")
    (sources / "other.list").write_text("# deb http://mirror/cuda /\ndeb [signed-by=/k] http://mirror/cuda /\n")
    (sources / "commented.list").write_text("# deb http://mirror/cuda /\n")
    result = probe.exit({
        "commands": {"says": ["sh", "-c", "echo release 12.8; echo oops >&2; exit 3"],
                     "absent": ["/nonexistent/nvcc", "--version"]},
        "paths": {"home": str(tmp_path / "cuda"), "state": str(tmp_path / "state.json"),
                  "gone": str(tmp_path / "gone")},
        "binaries": ["sh", "surely-not-installed-here"],
        "search": {"repo": {"paths": [str(sources)], "patterns": ["*.list", "*.sources"], "excludes": ["mine.sources"],
                            "contains": r"^[^#]*http://mirror/cuda/*(\s.*)?$"}}})
    assert result["commands"]["says"] == {"rc": 3, "stdout": "release 12.8", "stderr": "oops"}
    assert result["commands"]["absent"]["rc"] is None
    assert result["paths"]["home"]["type"] == "link"
    assert result["paths"]["home"]["target"] == str(tmp_path / "cuda-12.8")
    assert result["paths"]["state"]["content"] == '{"a": 1}\n' and result["paths"]["state"]["type"] == "file"
    assert result["paths"]["gone"]["exists"] is False
    assert result["binaries"]["sh"] and result["binaries"]["surely-not-installed-here"] is None
    assert result["search"]["repo"] == [str(sources / "other.list")]


def test_a_command_that_is_not_a_list_is_refused_by_name(probe):
    failed = probe.fail({"commands": {"nvcc": "nvcc --version"}})
    assert "commands.nvcc" in failed["msg"]


def test_units_are_read_in_one_systemctl_call(probe, monkeypatch):
    calls = []

    def run_command(self, argv, **kwargs):
        calls.append(argv)
        return 0, ("Id=nvidia-persistenced.service\nLoadState=loaded\nUnitFileState=enabled\nActiveState=active\n\n"
                   "Id=gone.service\nLoadState=not-found\nUnitFileState=\nActiveState=inactive\n"), ""

    monkeypatch.setattr(probe_module.AnsibleModule, "get_bin_path", lambda self, name, *a, **k: "/bin/" + name)
    monkeypatch.setattr(probe_module.AnsibleModule, "run_command", run_command)
    result = probe.exit({"units": ["nvidia-persistenced.service", "gone.service"]})
    assert len(calls) == 1
    assert result["units"]["nvidia-persistenced.service"] == {"load_state": "loaded", "unit_file_state": "enabled",
                                                              "active_state": "active"}
    assert result["units"]["gone.service"] == {"load_state": "not-found", "unit_file_state": None,
                                              "active_state": "inactive"}


@pytest.mark.skipif(shutil.which("dpkg-query") is None, reason="dpkg is not installed here")
def test_apt_sets_the_package_facts_and_the_apt_answers(probe):
    result = probe.exit({"apt": True}, check_mode=True)
    assert result["ansible_facts"]["packages"]["dpkg"][0]["source"] == "apt"
    assert set(result["apt"]) == {"held", "indexes", "lists_empty", "dpkg_interrupted", "dpkg_pending"}


def test_kernel_commands_run_only_where_the_host_owns_its_kernel(probe, monkeypatch):
    argv = {"headers": ["sh", "-c", "echo linux-headers; exit 0"]}
    for in_container, ran in ((True, False), (False, True)):
        monkeypatch.setattr(probe_module, "driver_facts", lambda module, root, state, c=in_container:
                            ({"in_container": c}, []))
        result = probe.exit({"driver": True, "kernel_commands": argv})
        assert (result["commands"]["headers"] == {"rc": 0, "stdout": "linux-headers", "stderr": ""}) is ran
        assert result["commands"]["headers"].get("skipped", False) is not ran
    # Without the driver's reading nothing says the host owns its kernel: not run.
    assert probe.exit({"kernel_commands": argv})["commands"]["headers"]["skipped"] is True


def test_the_containerd_drop_in_is_planned_and_judged_by_containerd_without_a_write(probe, tmp_path):
    from test_container_runtime import V3_CONFIG, containerd2

    config = tmp_path / "config.toml"
    config.write_text(V3_CONFIG)
    plan = {"containerd_binary": str(containerd2()), "config_path": str(config),
            "drop_in_path": str(tmp_path / "conf.d" / "99-nvidia.toml"), "set_as_default": True}
    result = probe.exit({"containerd": plan}, check_mode=True)["containerd"]
    assert result["config_changed"] and result["drop_in_changed"] and result["dump_checked"]
    assert result["problem"] == "" and result["config_version"] == 3 and result["containerd_major"] == 2
    assert config.read_text() == V3_CONFIG and not (tmp_path / "conf.d").exists()

    config.write_text("version = 3\nimports = 7\n")
    refused = probe.exit({"containerd": plan}, check_mode=True)["containerd"]
    assert "`imports` in %s is not a list of paths" % config in refused["problem"]
    assert refused["config_changed"] is None and refused["dump_checked"] is False

    missing = probe.exit({"containerd": dict(plan, containerd_binary="/nonexistent/containerd")})["containerd"]
    assert missing["problem"].startswith("containerd is not installed here")
