"""plugins/module_utils/container_runtime.py and the nvidia_containerd_runtime module.

The pure parts (TOML out, the imports edit, the drop-in's content) are tested here as functions. The module itself is
run against the real containerd 2.2 (config version 3) and 2.4 (config version 4) that `labctl containerd2` builds from
source (make unit does), whose own `config dump` judges the planned files; containerd 1.6 and 1.7 judge them in the
Molecule scenarios.
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
    containerd_release,
    dropin_document,
    effective_plugin_section,
    import_covers,
    native_config_version,
    set_imports,
    systemd_cgroup_choice,
    toml_dumps,
    without_imports,
)
from ansible_collections.gpu_ops.cluster.plugins.module_utils.support_matrix import CONTAINERD_CONFIG_VERSIONS

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
    assert containerd_release(output)[0] == major


def test_containerd_release_refuses_noise():
    with pytest.raises(ConfigError, match="cannot read a version"):
        containerd_release("bash: containerd: command not found")


def test_every_config_version_of_the_support_matrix_has_its_cri_plugin():
    assert set(CRI_RUNTIME_PLUGIN) == set(CONTAINERD_CONFIG_VERSIONS.values())


@pytest.mark.parametrize(("output", "release", "native"), [
    ("containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+deb12u3", (1, 6), 2),
    ("containerd github.com/containerd/containerd 1.7.24~ds1 1.7.24~ds1-6+deb13u1", (1, 7), 2),
    ("containerd github.com/containerd/containerd/v2 v2.0.7 ", (2, 0), 3),
    ("containerd github.com/containerd/containerd/v2 v2.2.9 ", (2, 2), 3),
    ("containerd github.com/containerd/containerd/v2 v2.3.2 ", (2, 3), 4),
    ("containerd github.com/containerd/containerd/v2 v2.4.2 ", (2, 4), 4),
])
def test_native_config_version_follows_the_release_line(output, release, native):
    assert containerd_release(output) == release
    assert native_config_version(release) == native
    assert config_schema_version({}, exists=False, release=release) == native


def test_schema_version():
    assert config_schema_version({"version": 2}, exists=True, release=(2, 4)) == 2
    assert config_schema_version({"version": 3}, exists=True, release=(2, 4)) == 3
    assert config_schema_version({"version": 4}, exists=True, release=(2, 3)) == 4
    with pytest.raises(ConfigError, match="no `version` line.*containerd config migrate"):
        config_schema_version({"root": "/x"}, exists=True, release=(1, 7))
    with pytest.raises(ConfigError, match=r"containerd is 1\.7, which reads config versions up to 2 \(version 3 needs "
                                          r"containerd 2\.0 or later\)"):
        config_schema_version({"version": 3}, exists=True, release=(1, 7))
    with pytest.raises(ConfigError, match=r"containerd is 2\.2, which reads config versions up to 3 \(version 4 needs "
                                          r"containerd 2\.3 or later\)"):
        config_schema_version({"version": 4}, exists=True, release=(2, 2))
    for unknown in (5, 1, "4", True):
        with pytest.raises(ConfigError, match=r"supported: 2 \(containerd 1\.6 and later\), 3 \(containerd 2\.0 and "
                                              r"later\), 4 \(containerd 2\.3 and later\)"):
            config_schema_version({"version": unknown}, exists=True, release=(2, 4))


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


# -- the module against the real containerd 2.2 and 2.4 -------------------------------------------------------------

# The lab's containerd builds (lab/tools.py CONTAINERD_LINKS): release line -> (link under $GPU_LAB_CACHE/bin, the
# environment variable that overrides it, the config version the line writes itself).
CONTAINERD_LINES = {"2.2": ("containerd2", "CONTAINERD2", 3), "2.3": ("containerd2.3", "CONTAINERD2_3", 4),
                    "2.4": ("containerd2.4", "CONTAINERD2_4", 4)}


def containerd_binary(line: str) -> Path:
    sys.path.insert(0, str(REPO_ROOT / "lab"))
    from _common import cache_root

    link, variable, _ = CONTAINERD_LINES[line]
    path = Path(os.environ.get(variable, "") or cache_root() / "bin" / link)
    if not path.exists():
        pytest.fail(f"containerd {line} not found at {path}: run `lab/labctl.py containerd2` (make unit does)")
    version = subprocess.run([str(path), "--version"], capture_output=True, text=True, check=True).stdout
    assert containerd_release(version) == tuple(int(part) for part in line.split(".")), version
    return path


def containerd2() -> Path:
    return containerd_binary("2.2")


@pytest.fixture(params=sorted(CONTAINERD_LINES), ids=lambda line: f"containerd{line}")
def containerd(request) -> Path:
    """Each containerd line the lab builds, so every test below runs on config version 3's and 4's containerd."""
    return containerd_binary(request.param)


@pytest.fixture
def module(patched_ansible_module) -> ModuleRunner:
    return ModuleRunner(load_ansible_module("nvidia_containerd_runtime"), patched_ansible_module)


def params(tmp_path: Path, containerd: Path, **extra) -> dict:
    return {"containerd_binary": str(containerd), "config_path": str(tmp_path / "config.toml"),
            "drop_in_path": str(tmp_path / "conf.d" / "99-nvidia.toml"), **extra}


def dump(tmp_path: Path, containerd: Path) -> dict:
    out = subprocess.run([str(containerd), "--config", str(tmp_path / "config.toml"), "config", "dump"],
                         capture_output=True, text=True, check=True).stdout
    return tomllib.loads(out)


def native_version(containerd: Path) -> int:
    out = subprocess.run([str(containerd), "config", "default"], capture_output=True, text=True, check=True).stdout
    return tomllib.loads(out)["version"]


def dropin_version(tmp_path: Path) -> int:
    return tomllib.loads((tmp_path / "conf.d" / "99-nvidia.toml").read_text())["version"]


V3_CONFIG = """version = 3
oom_score = -999

[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = "registry.example.internal/pause:3.10"

[plugins."io.containerd.cri.v1.runtime"]
  max_container_log_line_size = 32768
  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
    SystemdCgroup = true
"""
# An operator's version 4 file (containerd 2.3 and later): the server settings live under plugins now.
V4_CONFIG = V3_CONFIG.replace("version = 3\n", "version = 4\n") + """
[plugins."io.containerd.server.v1.grpc"]
  address = "/run/containerd/containerd.sock"
  max_recv_message_size = 33554432
"""
# The operator's settings each file gives, by their path in containerd 2.x's dump (its own version, 3 or 4: 2.x
# migrates an older file on load, and OPERATOR_CONFIG's version 2 CRI section moves to the cri.v1 plugins).
RUNTIME, IMAGES = "io.containerd.cri.v1.runtime", "io.containerd.cri.v1.images"
OPERATOR_SETTINGS = {
    2: {("oom_score",): -999, ("debug", "level"): "info",
        ("plugins", IMAGES, "pinned_images", "sandbox"): "registry.example.internal/pause:3.9",
        ("plugins", RUNTIME, "containerd", "runtimes", "runc", "options", "SystemdCgroup"): True},
    3: {("oom_score",): -999, ("plugins", IMAGES, "pinned_images", "sandbox"): "registry.example.internal/pause:3.10",
        ("plugins", RUNTIME, "max_container_log_line_size"): 32768,
        ("plugins", RUNTIME, "containerd", "runtimes", "runc", "options", "SystemdCgroup"): True},
}
OPERATOR_SETTINGS[4] = {**OPERATOR_SETTINGS[3],
                        ("plugins", "io.containerd.server.v1.grpc", "max_recv_message_size"): 33554432}
OPERATOR_CONFIGS = {2: OPERATOR_CONFIG, 3: V3_CONFIG, 4: V4_CONFIG}


def leaf(document: dict, path: tuple) -> object:
    for key in path:
        document = document.get(key, {}) if isinstance(document, dict) else {}
    return document


@pytest.mark.parametrize(("line", "version"), [(line, version) for line, (_, _, native) in CONTAINERD_LINES.items()
                                               for version in sorted(OPERATOR_CONFIGS) if version <= native])
def test_module_keeps_the_operators_config_in_its_own_version(module, tmp_path, line, version):
    """Every config version the containerd reads: AKS's version 2 file on containerd 2.3+ (NVIDIA/aicr#1688), an
    older line's version 3, and 2.3's own version 4. The drop-in is written in config.toml's version, never in the
    dump's newer one: containerd 2.3.2 refuses to start on an import newer than config.toml."""
    containerd = containerd_binary(line)
    text = OPERATOR_CONFIGS[version]
    (tmp_path / "config.toml").write_text(text)
    predicted = module.exit(params(tmp_path, containerd, set_as_default=True), check_mode=True)
    assert predicted["changed"] and predicted["dump_checked"] and predicted["config_version"] == version
    assert (tmp_path / "config.toml").read_text() == text and not (tmp_path / "conf.d").exists()

    result = module.exit(params(tmp_path, containerd, set_as_default=True))
    assert result["changed"] and result["config_changed"] and result["drop_in_changed"]
    assert result["containerd_major"] == 2 and result["systemd_cgroup"] is True
    assert dropin_version(tmp_path) == version
    assert CRI_RUNTIME_PLUGIN[version] in tomllib.loads((tmp_path / "conf.d" / "99-nvidia.toml").read_text())["plugins"]
    dumped = dump(tmp_path, containerd)
    assert dumped["version"] == native_version(containerd) == CONTAINERD_LINES[line][2]
    for path, value in OPERATOR_SETTINGS[version].items():
        assert leaf(dumped, path) == value, f"containerd's dump has {'.'.join(path)} = {leaf(dumped, path)!r}"
    runtimes = dumped["plugins"][RUNTIME]["containerd"]
    assert runtimes["default_runtime_name"] == "nvidia"
    assert runtimes["runtimes"]["nvidia"]["options"] == {"BinaryName": "/usr/bin/nvidia-container-runtime",
                                                         "SystemdCgroup": True}

    again = module.exit(params(tmp_path, containerd, set_as_default=True))
    assert not again["changed"]
    assert not module.exit(params(tmp_path, containerd, set_as_default=True), check_mode=True)["changed"]


def test_module_creates_a_config_in_the_containerds_own_version(module, tmp_path, containerd):
    result = module.exit(params(tmp_path, containerd))
    native = native_version(containerd)  # what `containerd config default` writes: 3 on 2.2, 4 on 2.3 and later
    assert result["changed"] and result["config_version"] == native
    text = (tmp_path / "config.toml").read_text()
    assert tomllib.loads(text) == {"version": native, "imports": [str(tmp_path / "conf.d" / "99-nvidia.toml")]}
    assert dropin_version(tmp_path) == native
    assert "nvidia" in dump(tmp_path, containerd)["plugins"][RUNTIME]["containerd"]["runtimes"]


def test_module_refuses_a_config_newer_than_the_containerd_and_changes_nothing(module, tmp_path):
    (tmp_path / "config.toml").write_text(V4_CONFIG)
    old = containerd_binary("2.2")
    failed = module.fail(params(tmp_path, old))
    assert ("has version = 4, but the installed containerd is 2.2, which reads config versions up to 3 (version 4 "
            "needs containerd 2.3 or later)") in failed["msg"]
    assert (tmp_path / "config.toml").read_text() == V4_CONFIG and not (tmp_path / "conf.d").exists()
    # containerd 2.2 itself agrees: it does not read the file at all.
    refused = subprocess.run([str(old), "--config", str(tmp_path / "config.toml"), "config", "dump"],
                             capture_output=True, text=True)
    assert refused.returncode != 0 and "version" in refused.stderr


def test_module_absent_removes_only_its_own(module, tmp_path, containerd):
    other = tmp_path / "other.toml"
    other.write_text("version = 3\n")
    (tmp_path / "config.toml").write_text(f'version = 3\nimports = ["{other}"]\n')
    module.exit(params(tmp_path, containerd))
    removed = module.exit(params(tmp_path, containerd, state="absent"))
    assert removed["changed"] and not (tmp_path / "conf.d" / "99-nvidia.toml").exists()
    assert tomllib.loads((tmp_path / "config.toml").read_text())["imports"] == [str(other)]
    assert not module.exit(params(tmp_path, containerd, state="absent"))["changed"]


def test_module_refuses_a_version_1_config_and_changes_nothing(module, tmp_path, containerd):
    (tmp_path / "config.toml").write_text('root = "/var/lib/containerd"\n')
    failed = module.fail(params(tmp_path, containerd))
    assert "has no `version` line" in failed["msg"]
    assert (tmp_path / "config.toml").read_text() == 'root = "/var/lib/containerd"\n'
    assert not (tmp_path / "conf.d").exists()


def test_module_refuses_invalid_toml(module, tmp_path):
    (tmp_path / "config.toml").write_text("version = 2\n[plugins\n")
    failed = module.fail(params(tmp_path, containerd2()))
    assert "is not valid TOML" in failed["msg"] and "left as it is" in failed["msg"]


# What the GPU Operator's toolkit or a hand-run `nvidia-ctk runtime configure` (1.18) leaves at the same path.
FOREIGN_V3_DROPIN = """version = 3

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia]
  runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia.options]
    BinaryName = "/usr/local/nvidia/toolkit/nvidia-container-runtime"
"""


def test_module_never_overwrites_or_removes_another_owners_drop_in_unless_taken_over(module, tmp_path, containerd):
    (tmp_path / "config.toml").write_text(V3_CONFIG)
    foreign = tmp_path / "conf.d" / "99-nvidia.toml"
    foreign.parent.mkdir()
    foreign.write_text(FOREIGN_V3_DROPIN)
    for extra in ({"_ansible_check_mode": True}, {}):
        failed = module.fail(params(tmp_path, containerd, **extra))
        assert f"{foreign} exists and this role did not write it" in failed["msg"]
        assert "nvidia_container_toolkit_take_over: true" in failed["msg"]
    assert not module.exit(params(tmp_path, containerd, state="absent"))["changed"]
    assert foreign.read_text() == FOREIGN_V3_DROPIN and (tmp_path / "config.toml").read_text() == V3_CONFIG
    taken = module.exit(params(tmp_path, containerd, take_over=True))
    assert taken["drop_in_changed"] and taken["dump_checked"]
    assert dump(tmp_path, containerd)["plugins"][RUNTIME]["containerd"]["runtimes"]["nvidia"]["options"][
        "BinaryName"] == "/usr/bin/nvidia-container-runtime"
    assert not module.exit(params(tmp_path, containerd))["changed"]  # the role's own now: no take-over needed any more


def test_module_names_a_missing_containerd(module, tmp_path):
    failed = module.fail({**params(tmp_path, containerd2()), "containerd_binary": "containerd-not-installed-here"})
    assert "containerd is not installed here" in failed["msg"]
