"""The batched file module of the node roles (one remote task where template/copy/file/uri cost several): it changes
only what differs (content, mode, owner), says which paths, predicts in check mode, removes, refuses what is not an
armoured key before writing anything, and never leaves half a file."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from ansible_collections.gpu_ops.cluster.plugins.module_utils import atomic_file
from conftest import ModuleRunner, load_ansible_module

files_module = load_ansible_module("host_files")
OWNER = {"owner": str(os.getuid()), "group": str(os.getgid())}
KEY = "-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nmQINBF...\n-----END PGP PUBLIC KEY BLOCK-----\n"


@pytest.fixture
def run(patched_ansible_module):
    return ModuleRunner(files_module, patched_ansible_module)


def entry(path: Path, **fields):
    return {"path": str(path), **OWNER, **fields}


def test_a_new_file_is_written_with_its_parents_and_a_second_run_changes_nothing(run, tmp_path):
    target = tmp_path / "facts.d" / "nvidia_driver.fact"
    first = run.exit({"files": [entry(target, content='{"a": 1}\n')]})
    assert first["changed"] and first["changed_paths"] == [str(target)]
    assert target.read_text() == '{"a": 1}\n'
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert stat.S_IMODE(target.parent.stat().st_mode) == 0o755
    again = run.exit({"files": [entry(target, content='{"a": 1}\n')]})
    assert not again["changed"] and again["changed_paths"] == []


def test_only_the_differing_files_change_and_each_says_why(run, tmp_path):
    same, other, loose = tmp_path / "same", tmp_path / "other", tmp_path / "loose"
    for path in (same, other, loose):
        path.write_text("old\n")
        path.chmod(0o644)
    loose.chmod(0o666)
    result = run.exit({"files": [entry(same, content="old\n"), entry(other, content="new\n"),
                                 entry(loose, content="old\n")]})
    assert result["changed_paths"] == [str(other), str(loose)]
    reasons = {item["path"]: item["reason"] for item in result["files"]}
    assert reasons == {str(same): "", str(other): "content differs", str(loose): "mode 0666, wanted 0644"}
    assert other.read_text() == "new\n" and stat.S_IMODE(loose.stat().st_mode) == 0o644


def test_check_mode_predicts_and_writes_nothing_with_a_diff(run, tmp_path):
    target = tmp_path / "blacklist.conf"
    target.write_text("old\n")
    target.chmod(0o644)
    result = run.exit({"files": [entry(target, content="new\n")], "_ansible_diff": True}, check_mode=True)
    assert result["changed"] and target.read_text() == "old\n"
    assert result["diff"] == [{"before_header": str(target), "after_header": str(target),
                               "before": "old\n", "after": "new\n"}]


def test_absent_removes_and_a_missing_file_is_no_change(run, tmp_path):
    target = tmp_path / "cuda.sources"
    target.write_text("x")
    assert run.exit({"files": [entry(target, state="absent")]})["changed_paths"] == [str(target)]
    assert not target.exists()
    assert not run.exit({"files": [entry(target, state="absent")]})["changed"]


def test_a_key_that_is_not_armoured_is_refused_before_any_file_is_written(run, tmp_path):
    source, key = tmp_path / "repo.sources", tmp_path / "key.asc"
    failed = run.fail({"files": [entry(source, content="Types: deb\n"),
                                 entry(key, content="<html>404</html>", expect="openpgp_armored_key",
                                       inputs=["nvidia_driver_mirror_key_url"])]})
    assert "not an ASCII-armoured OpenPGP public key" in failed["msg"]
    assert "'<html>404</html>'" in failed["msg"] and "nvidia_driver_mirror_key_url" in failed["msg"]
    assert not source.exists() and not key.exists()
    assert run.exit({"files": [entry(key, content=KEY, expect="openpgp_armored_key")]})["changed"]


def test_a_key_fetched_from_a_url_is_compared_by_content(run, tmp_path):
    served = tmp_path / "served.asc"
    served.write_text(KEY)
    key = tmp_path / "keyrings" / "nvidia.asc"
    args = {"files": [entry(key, url=served.as_uri(), expect="openpgp_armored_key")]}
    assert run.exit(args)["changed"] and key.read_text() == KEY
    assert not run.exit(args)["changed"]
    served.write_text(KEY.replace("mQINBF", "mQINBG"))  # the mirror rotated its key
    assert run.exit(args)["changed"] and "mQINBG" in key.read_text()


def test_an_unreachable_url_names_the_inputs(run, tmp_path):
    failed = run.fail({"files": [entry(tmp_path / "k.asc", url=(tmp_path / "missing.asc").as_uri(),
                                       inputs=["cuda_toolkit_mirror_key_url"])]})
    assert failed["msg"].startswith("Could not fetch file://") and "cuda_toolkit_mirror_key_url" in failed["msg"]


def test_a_failed_write_leaves_the_old_file_whole(tmp_path, monkeypatch):
    target = tmp_path / "99-nvidia.toml"
    target.write_text("old content\n")

    def interrupted(*_args):
        raise KeyboardInterrupt  # SIGINT between the write and the rename

    monkeypatch.setattr(atomic_file.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        atomic_file.write_atomically(str(target), b"new content\n", 0o644, (os.getuid(), os.getgid()))
    assert target.read_text() == "old content\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["99-nvidia.toml"]


def test_the_drift_runner_names_the_files_the_task_changed(run, tmp_path):
    from conftest import REPO_ROOT, load_source

    load_source("gpu_ops_run", REPO_ROOT / "runner" / "gpu_ops_run.py")
    drift = load_source("gpu_ops_drift", REPO_ROOT / "runner" / "gpu_ops_drift.py")
    same, other = tmp_path / "same", tmp_path / "other"
    same.write_text("x\n")
    same.chmod(0o644)
    result = run.exit({"files": [entry(same, content="x\n"), entry(other, content="y\n")]}, check_mode=True)
    result["invocation"] = {"module_args": {"files": [{"path": str(same)}, {"path": str(other)}]}}
    assert drift.resource_of(result) == str(other)
