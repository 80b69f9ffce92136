"""plugins/module_utils/container_runtime.py and the nvidia_containerd_runtime module.

The pure parts (TOML out, the imports edit, the drop-in's content) are tested here as functions. The module itself is
run against the real containerd 2.x that `labctl containerd2` builds from source (make unit does), whose own
`config dump` judges the planned files; containerd 1.6 and 1.7 judge them in the Molecule scenarios.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from ansible_collections.gpu_ops.cluster.plugins.module_utils.container_runtime import (
    CRI_RUNTIME_PLUGIN,
    ConfigError,
    config_schema_version,
    containerd_major,
    dropin_document,
    effective_plugin_section,
    import_covers,
    set_imports,
    systemd_cgroup_choice,
    toml_dumps,
    without_imports,
)

from conftest import REPO_ROOT, ModuleRunner, load_ansible_module, load_filter_plugin

toolkit_filters = load_filter_plugin("container_toolkit")
V2 = CRI_RUNTIME_PLUGIN[2]
OPERATOR_CONFIG = '''# Written by the operator.
version = 2
oom_score = -999   # keep this comment

[debug]
  level = "info"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.example.internal/pause:3.9"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
    SystemdCgroup = true
  [plugins."io.containerd.grpc.v1.cri".registry.mirrors."docker.io"]
    endpoint = ["https://mirror.example.internal"]
'''

# -- TOML out ------------------------------------------------------------------------------------------------------

keys = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=12)
scalars = st.one_of(st.booleans(), st.integers(-2**63, 2**63 - 1), st.text(max_size=20),
                    st.floats(allow_nan=False, allow_infinity=False))
values = st.one_of(scalars, st.lists(st.one_of(st.integers(), st.text(max_size=8)), max_size=4))
tables = st.recursive(st.dictionaries(keys, values, max_size=4),
                      lambda children: st.dictionaries(keys, st.one_of(values, children), max_size=4), max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(tables)
@example({"0\n": False})  # found by hypothesis: `$` matched before the newline, so the key was written bare
def test_toml_dumps_reads_back_equal(document):
    assert tomllib.loads(toml_dumps(document)) == document


def test_toml_dumps_writes_arrays_of_tables():
    document = {"proxy_plugins": {"stargz": {"type": "snapshot"}}, "timeouts": [{"a": 1}, {"a": 2, "b": {"c": "d"}}]}
    assert tomllib.loads(toml_dumps(document)) == document


# -- imports ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", [
    OPERATOR_CONFIG,
    OPERATOR_CONFIG.replace("version = 2\n", ""),  # no version line: imports goes first
    OPERATOR_CONFIG.replace("version = 2\n", 'version = 2\nimports = ["/etc/containerd/other.toml"]\n'),
    OPERATOR_CONFIG.replace("version = 2\n", 'version = 2\nimports = [\n  "/a.toml", # first\n  "/b]c.toml",\n]\n'),
    'imports=["/x.toml"]\nversion = 2\n[plugins."io.containerd.grpc.v1.cri"]\n  imports = "a table key, not ours"\n',
])
def test_set_imports_changes_only_imports(text):
    before = tomllib.loads(text)
    wanted = before.get("imports", []) + ["/etc/containerd/conf.d/99-nvidia.toml"]
    after_text = set_imports(text, wanted)
    after = tomllib.loads(after_text)
    assert after["imports"] == wanted
    assert without_imports(after) == without_imports(before)
    # Comments and layout outside the imports line survive.
    assert [line for line in text.splitlines() if "imports" not in line and line.strip() not in ('"/a.toml", # first', '"/b]c.toml",', "]")] == \
        [line for line in after_text.splitlines() if "imports" not in line]


def test_import_covers_globs():
    assert import_covers(["/etc/containerd/conf.d/*.toml"], "/etc/containerd/conf.d/99-nvidia.toml")
    assert import_covers(["/etc/containerd/conf.d/99-nvidia.toml"], "/etc/containerd/conf.d/99-nvidia.toml")
    assert not import_covers(["/etc/containerd/other/*.toml"], "/etc/containerd/conf.d/99-nvidia.toml")


# -- versions --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("output", "major"), [
    ("containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+deb12u3", 1),
    ("containerd github.com/containerd/containerd 1.7.24~ds1 1.7.24~ds1-6+deb13u1", 1),
    ("containerd github.com/containerd/containerd/v2 v2.2.9 ", 2),
    ("containerd containerd.io 1.7.27 05044ec0a9a75232cad458027ca83437aae3f4da", 1),
])
def test_containerd_major(output, major):
    assert containerd_major(output) == major


def test_containerd_major_refuses_noise():
    with pytest.raises(ConfigError, match="cannot read a version"):
        containerd_major("bash: containerd: command not found")


def test_schema_version():
    assert config_schema_version({}, exists=False, major=1) == 2
    assert config_schema_version({}, exists=False, major=2) == 3
    assert config_schema_version({"version": 2}, exists=True, major=2) == 2
    with pytest.raises(ConfigError, match="no `version` line.*containerd config migrate"):
        config_schema_version({"root": "/x"}, exists=True, major=1)
    with pytest.raises(ConfigError, match="needs 2.x"):
        config_schema_version({"version": 3}, exists=True, major=1)
    with pytest.raises(ConfigError, match="supported: 2"):
        config_schema_version({"version": 4}, exists=True, major=2)


# -- the drop-in -----------------------------------------------------------------------------------------------------


def test_containerd_1_replaces_sections_2_merges_them():
    main = {"plugins": {V2: {"sandbox_image": "a", "containerd": {"snapshotter": "native"}}}}
    other = {"plugins": {V2: {"containerd": {"default_runtime_name": "runc"}}}}
    assert effective_plugin_section([main, other], V2, replace_sections=True) == other["plugins"][V2]
    assert effective_plugin_section([main, other], V2, replace_sections=False) == {
        "sandbox_image": "a", "containerd": {"snapshotter": "native", "default_runtime_name": "runc"}}


def test_dropin_carries_the_operators_section_and_the_runtime():
    base = effective_plugin_section([tomllib.loads(OPERATOR_CONFIG)], V2, replace_sections=True)
    document = dropin_document(2, base, "nvidia", "/usr/bin/nvidia-container-runtime", True, set_as_default=False)
    section = tomllib.loads(toml_dumps(document))["plugins"][V2]
    assert section["sandbox_image"] == "registry.example.internal/pause:3.9"
    assert section["registry"]["mirrors"]["docker.io"]["endpoint"] == ["https://mirror.example.internal"]
    assert section["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"] is True
    assert section["containerd"]["runtimes"]["nvidia"] == {
        "runtime_type": "io.containerd.runc.v2",
        "options": {"BinaryName": "/usr/bin/nvidia-container-runtime", "SystemdCgroup": True},
    }
    assert "default_runtime_name" not in section["containerd"]
    default = dropin_document(3, {}, "nvidia", "/usr/bin/nvidia-container-runtime", False, set_as_default=True)
    assert default["plugins"][CRI_RUNTIME_PLUGIN[3]]["containerd"]["default_runtime_name"] == "nvidia"


def test_dropin_keeps_extra_keys_of_an_existing_nvidia_runtime():
    base = {"containerd": {"runtimes": {"nvidia": {"privileged_without_host_devices": True,
                                                    "options": {"BinaryName": "/old", "Root": "/run/x"}}}}}
    runtime = dropin_document(2, base, "nvidia", "/usr/bin/nvidia-container-runtime", True, False)[
        "plugins"][V2]["containerd"]["runtimes"]["nvidia"]
    assert runtime["privileged_without_host_devices"] is True
    assert runtime["options"] == {"BinaryName": "/usr/bin/nvidia-container-runtime", "Root": "/run/x",
                                  "SystemdCgroup": True}


@pytest.mark.parametrize(("setting", "runc", "pid1", "expected"), [
    ("auto", True, False, True),
    ("auto", False, True, False),
    ("auto", None, True, True),
    ("auto", None, False, False),
    ("false", True, True, False),
    ("true", False, False, True),
])
def test_systemd_cgroup_choice(setting, runc, pid1, expected):
    base = {} if runc is None else {"containerd": {"runtimes": {"runc": {"options": {"SystemdCgroup": runc}}}}}
    assert systemd_cgroup_choice(setting, base, pid1) is expected


# -- Docker's daemon.json --------------------------------------------------------------------------------------------


def test_daemon_json_merge_keeps_every_key():
    user = {"log-driver": "json-file", "log-opts": {"max-size": "10m"}, "runtimes": {"crun": {"path": "/usr/bin/crun"}},
            "data-root": "/srv/docker"}
    merged = toolkit_filters.docker_daemon_config(json.dumps(user), "nvidia", "/usr/bin/nvidia-container-runtime", False)
    assert {k: v for k, v in merged.items() if k != "runtimes"} == {k: v for k, v in user.items() if k != "runtimes"}
    assert merged["runtimes"] == {"crun": {"path": "/usr/bin/crun"},
                                  "nvidia": {"path": "/usr/bin/nvidia-container-runtime", "args": []}}
    assert "default-runtime" not in merged
    assert toolkit_filters.docker_daemon_config("", "nvidia", "/r", True)["default-runtime"] == "nvidia"
    # Merging twice gives the same document, so a re-run writes nothing.
    assert toolkit_filters.docker_daemon_config(json.dumps(merged), "nvidia", "/usr/bin/nvidia-container-runtime",
                                                False) == merged


@pytest.mark.parametrize(("before", "restore", "after"), [
    ({"default-runtime": "nvidia"}, "", {}),  # the role made it the default over none: the key goes
    ({"default-runtime": "nvidia"}, "crun", {"default-runtime": "crun"}),  # over crun: crun comes back
    ({"default-runtime": "crun"}, "", {"default-runtime": "crun"}),  # changed by someone since: theirs, kept
    ({"default-runtime": "nvidia"}, None, {"default-runtime": "nvidia"}),  # never set by the role: kept
])
def test_daemon_json_default_is_undone_only_where_the_role_set_it(before, restore, after):
    merged = toolkit_filters.docker_daemon_config(json.dumps({**before, "log-driver": "local"}), "nvidia", "/r", False,
                                                  restore)
    assert {k: v for k, v in merged.items() if k != "runtimes"} == {**after, "log-driver": "local"}
    assert merged["runtimes"]["nvidia"]["path"] == "/r"


@pytest.mark.parametrize(("text", "problem"), [
    ('{"a": 1}', ""), ("", ""), ("  \n", ""),
    ('{"a": 1,}', "invalid JSON"), ("[1, 2]", "JSON list, not an object"),
])
def test_json_problem(text, problem):
    found = toolkit_filters.json_problem(text)
    assert (problem in found) if problem else found == ""


def test_off_version_names_packages_at_another_version():
    facts = {"nvidia-container-toolkit": [{"version": "1.17.8-1"}], "libnvidia-container1": [{"version": "1.20.2-1"}]}
    names = ["nvidia-container-toolkit", "libnvidia-container1", "nvidia-container-toolkit-base"]
    assert toolkit_filters.off_version(facts, names, "1.20.2") == ["nvidia-container-toolkit"]


# -- the module against the real containerd 2.x ----------------------------------------------------------------------


def containerd2() -> Path:
    sys.path.insert(0, str(REPO_ROOT / "lab"))
    from _common import cache_root

    path = Path(os.environ.get("CONTAINERD2", "") or cache_root() / "bin" / "containerd2")
    if not path.exists():
        pytest.fail(f"containerd 2.x not found at {path}: run `lab/labctl.py containerd2` (make unit does)")
    return path


@pytest.fixture
def module(patched_ansible_module) -> ModuleRunner:
    return ModuleRunner(load_ansible_module("nvidia_containerd_runtime"), patched_ansible_module)


def params(tmp_path: Path, **extra) -> dict:
    return {"containerd_binary": str(containerd2()), "config_path": str(tmp_path / "config.toml"),
            "drop_in_path": str(tmp_path / "conf.d" / "99-nvidia.toml"), **extra}


def dump(tmp_path: Path) -> dict:
    out = subprocess.run([str(containerd2()), "--config", str(tmp_path / "config.toml"), "config", "dump"],
                         capture_output=True, text=True, check=True).stdout
    return tomllib.loads(out)


V3_CONFIG = """version = 3
oom_score = -999

[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = "registry.example.internal/pause:3.10"

[plugins."io.containerd.cri.v1.runtime"]
  max_container_log_line_size = 32768
  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
    SystemdCgroup = true
"""


def test_module_on_containerd_2_keeps_the_operators_v3_config(module, tmp_path):
    (tmp_path / "config.toml").write_text(V3_CONFIG)
    predicted = module.exit(params(tmp_path, set_as_default=True), check_mode=True)
    assert predicted["changed"] and predicted["dump_checked"] and predicted["config_version"] == 3
    assert (tmp_path / "config.toml").read_text() == V3_CONFIG and not (tmp_path / "conf.d").exists()

    result = module.exit(params(tmp_path, set_as_default=True))
    assert result["changed"] and result["config_changed"] and result["drop_in_changed"]
    assert result["containerd_major"] == 2 and result["systemd_cgroup"] is True
    dumped = dump(tmp_path)
    runtime_plugin = dumped["plugins"]["io.containerd.cri.v1.runtime"]
    assert runtime_plugin["max_container_log_line_size"] == 32768
    assert runtime_plugin["containerd"]["default_runtime_name"] == "nvidia"
    assert runtime_plugin["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"] is True
    assert runtime_plugin["containerd"]["runtimes"]["nvidia"]["options"]["BinaryName"] == \
        "/usr/bin/nvidia-container-runtime"
    assert dumped["plugins"]["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"] == \
        "registry.example.internal/pause:3.10"
    assert dumped["oom_score"] == -999

    again = module.exit(params(tmp_path, set_as_default=True))
    assert not again["changed"]
    assert not module.exit(params(tmp_path, set_as_default=True), check_mode=True)["changed"]


def test_module_creates_a_config_where_none_was(module, tmp_path):
    result = module.exit(params(tmp_path))
    assert result["changed"] and result["config_version"] == 3
    text = (tmp_path / "config.toml").read_text()
    assert tomllib.loads(text) == {"version": 3, "imports": [str(tmp_path / "conf.d" / "99-nvidia.toml")]}
    assert "nvidia" in dump(tmp_path)["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]


def test_module_absent_removes_only_its_own(module, tmp_path):
    other = tmp_path / "other.toml"
    other.write_text("version = 3\n")
    (tmp_path / "config.toml").write_text(f'version = 3\nimports = ["{other}"]\n')
    module.exit(params(tmp_path))
    removed = module.exit(params(tmp_path, state="absent"))
    assert removed["changed"] and not (tmp_path / "conf.d" / "99-nvidia.toml").exists()
    assert tomllib.loads((tmp_path / "config.toml").read_text())["imports"] == [str(other)]
    assert not module.exit(params(tmp_path, state="absent"))["changed"]


def test_module_refuses_a_version_1_config_and_changes_nothing(module, tmp_path):
    (tmp_path / "config.toml").write_text('root = "/var/lib/containerd"\n')
    failed = module.fail(params(tmp_path))
    assert "has no `version` line" in failed["msg"]
    assert (tmp_path / "config.toml").read_text() == 'root = "/var/lib/containerd"\n'
    assert not (tmp_path / "conf.d").exists()


def test_module_refuses_invalid_toml(module, tmp_path):
    (tmp_path / "config.toml").write_text("version = 2\n[plugins\n")
    failed = module.fail(params(tmp_path))
    assert "is not valid TOML" in failed["msg"] and "left as it is" in failed["msg"]


# What the GPU Operator's toolkit or a hand-run `nvidia-ctk runtime configure` (1.18) leaves at the same path.
FOREIGN_V3_DROPIN = """version = 3

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia]
  runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia.options]
    BinaryName = "/usr/local/nvidia/toolkit/nvidia-container-runtime"
"""


def test_module_never_overwrites_or_removes_another_owners_drop_in_unless_taken_over(module, tmp_path):
    (tmp_path / "config.toml").write_text(V3_CONFIG)
    foreign = tmp_path / "conf.d" / "99-nvidia.toml"
    foreign.parent.mkdir()
    foreign.write_text(FOREIGN_V3_DROPIN)
    for extra in ({"_ansible_check_mode": True}, {}):
        failed = module.fail(params(tmp_path, **extra))
        assert f"{foreign} exists and this role did not write it" in failed["msg"]
        assert "nvidia_container_toolkit_take_over: true" in failed["msg"]
    assert not module.exit(params(tmp_path, state="absent"))["changed"]
    assert foreign.read_text() == FOREIGN_V3_DROPIN and (tmp_path / "config.toml").read_text() == V3_CONFIG
    taken = module.exit(params(tmp_path, take_over=True))
    assert taken["drop_in_changed"] and taken["dump_checked"]
    assert dump(tmp_path)["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]["nvidia"]["options"][
        "BinaryName"] == "/usr/bin/nvidia-container-runtime"
    assert not module.exit(params(tmp_path))["changed"]  # the role's own now: no take-over needed any more


def test_module_names_a_missing_containerd(module, tmp_path):
    failed = module.fail({**params(tmp_path), "containerd_binary": "containerd-not-installed-here"})
    assert "containerd is not installed here" in failed["msg"]
