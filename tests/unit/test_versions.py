"""versions.yml is the one list of pinned versions: every role default, vars file, lab go.mod, module_utils constant and
document it names agrees with it, and docs/versions.md is what tests/versions_doc.py writes from it."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest
import yaml

from conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "tests"))
import versions_doc  # noqa: E402  (tests/versions_doc.py, the generator)

from ansible_collections.gpu_ops.cluster.plugins.module_utils import support_matrix  # noqa: E402

VERSIONS = yaml.safe_load((REPO_ROOT / "versions.yml").read_text(encoding="utf-8"))
_ENTRY = re.compile(r"^(?P<file>[^:~]+)(?:(?P<text>~)(?P<form>.+)|:(?P<key>[^=]+)(?:=(?P<value>.+))?)\Z")


def _lookup_yaml(path: Path, key: str) -> Any:
    data: Any = yaml.safe_load(path.read_text(encoding="utf-8"))
    for part in key.split("."):
        if not isinstance(data, dict) or part not in data:
            return "(missing)"
        data = data[part]
    return data


def _lookup_go_mod(path: Path, module: str) -> str:
    match = re.search(rf"^\s*(?:require\s+)?{re.escape(module)}\s+(v\S+)", path.read_text(encoding="utf-8"), re.M)
    return match.group(1) if match else "(missing)"


def _lookup_python(path: Path, name: str) -> str:
    match = re.search(rf'^{re.escape(name)}\s*=\s*"([^"]*)"', path.read_text(encoding="utf-8"), re.M)
    return match.group(1) if match else "(missing)"


def drift(entry: str, values: Dict[str, Any], root: Path = REPO_ROOT) -> List[str]:
    """Where one pinned_in entry disagrees with versions.yml: '<file>: <key> is <actual>, versions.yml says
    <expected>'."""
    match = _ENTRY.match(entry)
    if match is None:
        return [f"versions.yml: pinned_in entry {entry!r} is neither <file>:<key>[=<form>] nor <file>~<text>"]
    path = root / match["file"]
    if not path.is_file():
        return [f"versions.yml: {match['file']} (in {entry!r}) does not exist"]
    if match["text"]:
        text = match["form"].format(**values)
        if text not in path.read_text(encoding="utf-8"):
            return [f"{match['file']}: does not mention {text!r}, which versions.yml pins"]
        return []
    expected: Any = match["value"].format(**values) if match["value"] else values["version"]
    key = match["key"]
    if path.name == "go.mod":
        actual: Any = _lookup_go_mod(path, key)
    elif path.suffix == ".py":
        actual = _lookup_python(path, key)
    else:
        actual = _lookup_yaml(path, key)
    if actual != expected:
        return [f"{match['file']}: {key} is {actual!r}, versions.yml says {expected!r}"]
    return []


def pinned_entries() -> List[tuple]:
    entries = []
    kubernetes = VERSIONS["kubernetes"]
    for entry in kubernetes["pinned_in"]:
        entries.append(("kubernetes", entry, {"minimum": kubernetes["minimum"], "maximum": kubernetes["maximum"],
                                              "version": kubernetes["maximum"]}))
    for component in VERSIONS["components"] + VERSIONS["lab"]:
        for entry in component["pinned_in"]:
            entries.append((component["name"], entry, {"version": component["version"]}))
    return entries


@pytest.mark.parametrize("name, entry, values", pinned_entries(), ids=lambda value: str(value)[:70])
def test_every_pin_agrees_with_versions_yml(name, entry, values):
    assert drift(entry, values) == [], name


def test_drift_names_file_key_and_both_values(tmp_path):
    (tmp_path / "roles" / "x" / "defaults").mkdir(parents=True)
    (tmp_path / "roles" / "x" / "defaults" / "main.yml").write_text("x_image_tag: v0.17.1\n")
    (tmp_path / "go.mod").write_text("module m\n\nrequire (\n\tgithub.com/a/b v1.18.1 // indirect\n)\n")
    (tmp_path / "doc.md").write_text("default `1.18.1`\n")
    (tmp_path / "m.py").write_text('LIMIT = "1.32"\n')
    assert drift("roles/x/defaults/main.yml:x_image_tag", {"version": "v0.20.0"}, tmp_path) == [
        "roles/x/defaults/main.yml: x_image_tag is 'v0.17.1', versions.yml says 'v0.20.0'"]
    assert drift("go.mod:github.com/a/b=v{version}", {"version": "1.20.2"}, tmp_path) == [
        "go.mod: github.com/a/b is 'v1.18.1', versions.yml says 'v1.20.2'"]
    assert drift("doc.md~{version}", {"version": "1.20.2"}, tmp_path) == [
        "doc.md: does not mention '1.20.2', which versions.yml pins"]
    assert drift("m.py:LIMIT={minimum}", {"minimum": "1.33"}, tmp_path) == [
        "m.py: LIMIT is '1.32', versions.yml says '1.33'"]
    assert drift("m.py:OTHER", {"version": "1"}, tmp_path) == ["m.py: OTHER is '(missing)', versions.yml says '1'"]
    assert drift("gone.yml:key", {"version": "1"}, tmp_path) == [
        "versions.yml: gone.yml (in 'gone.yml:key') does not exist"]


def test_default_driver_branches_agree_with_the_driver_role():
    problems = []
    listed = VERSIONS["nvidia_driver_default_branches"]
    for vars_file in sorted((REPO_ROOT / "roles" / "nvidia_driver" / "vars").glob("*-*.yml")):
        catalogs = yaml.safe_load(vars_file.read_text(encoding="utf-8"))["_nvidia_driver_catalogs"]
        for source, catalog in catalogs.items():
            actual = catalog.get("default_branch")
            expected = listed.get(vars_file.stem, {}).get(source)
            if actual != expected:
                problems.append(f"roles/nvidia_driver/vars/{vars_file.name}: _nvidia_driver_catalogs.{source}."
                                f"default_branch is {actual!r}, versions.yml says {expected!r}")
    assert problems == []
    assert set(listed) == {path.stem for path in (REPO_ROOT / "roles" / "nvidia_driver" / "vars").glob("*-*.yml")}


def test_kubernetes_range_is_the_module_utils_range():
    assert (support_matrix.KUBERNETES_MINIMUM, support_matrix.KUBERNETES_MAXIMUM) == (
        VERSIONS["kubernetes"]["minimum"], VERSIONS["kubernetes"]["maximum"])
    lab = next(item for item in VERSIONS["lab"] if item["name"].startswith("Kubernetes"))
    assert support_matrix.kubernetes_version_problems(lab["version"]) == [], "the lab must run a supported version"


def test_containerd_config_versions_are_the_module_utils_table():
    assert dict(support_matrix.CONTAINERD_CONFIG_VERSIONS) == VERSIONS["containerd"]["config_versions"]
    # Each line the lab builds is one the table covers; its real `config default` says which version it writes
    # (tests/unit/test_container_runtime.py runs it).
    lines = [item for item in VERSIONS["lab"] if item["name"].startswith("containerd ")]
    assert [item["name"].split()[1] for item in lines] == ["2.2", "2.3", "2.4"]
    assert all(item["version"].startswith(f"v{item['name'].split()[1]}.") for item in lines)


def test_driver_branch_lifecycle_is_the_module_utils_table():
    listed = VERSIONS["nvidia_driver_branches"]
    assert {int(branch): (entry["kind"], entry["end_of_life"] or "") for branch, entry in listed.items()} == dict(
        support_matrix.DRIVER_BRANCHES)
    for branch, entry in listed.items():
        assert entry["kind"] in ("long-term", "production", "new feature"), branch
        assert entry.get("source"), f"versions.yml: nvidia_driver_branches.{branch} names no source"
        if entry["end_of_life"] is None:
            assert "not confirmed" in entry.get("note", ""), f"nvidia_driver_branches.{branch}: say why no end"
        else:
            assert re.match(r"^20[0-9]{2}-(0[1-9]|1[0-2])\Z", entry["end_of_life"]), branch


def test_every_default_driver_branch_has_a_lifecycle_entry():
    listed = {int(branch) for branch in VERSIONS["nvidia_driver_branches"]}
    defaults = {int(b) for per_os in VERSIONS["nvidia_driver_default_branches"].values() for b in per_os.values()}
    assert sorted(defaults - listed) == []


def test_every_offered_cuda_version_is_in_the_driver_table():
    offered = {version for catalogs in versions_doc.cuda_catalogs().values() for versions in catalogs.values()
               for version in versions}
    offered |= set(next(c for c in VERSIONS["components"] if c["key"] == "cuda_toolkit")["version"])
    assert sorted(offered - set(support_matrix.CUDA_TOOLKIT_DRIVER)) == []


def test_default_cuda_runs_on_every_default_cuda_repo_branch():
    cuda = next(c for c in VERSIONS["components"] if c["key"] == "cuda_toolkit")["version"]
    for os_key, branches in VERSIONS["nvidia_driver_default_branches"].items():
        assert support_matrix.cuda_driver_problems(cuda, branches["cuda_repo"], "cuda_toolkit_versions",
                                                   "nvidia_driver_branch") == [], os_key


def test_committed_doc_is_the_generated_one():
    committed = (REPO_ROOT / "docs" / "versions.md").read_text(encoding="utf-8")
    assert committed == versions_doc.render(), (
        "docs/versions.md differs from what tests/versions_doc.py writes; run .venv/bin/python tests/versions_doc.py")
