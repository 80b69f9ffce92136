"""Another owner's NVIDIA runtime configuration on a node (issue 19, "Living beside the GPU Operator"): the containerd
plan (module_utils/containerd_plan.py, shared by nvidia_containerd_runtime and host_probe) never overwrites a drop-in
it did not write, nor silently overrides another file's definition of the runtime, and Docker's runtime entry of
another owner is reported (filter nvidia_container_toolkit_docker_foreign_runtime). Each refusal names the file and
the settings. No containerd is run: plan_present only reads files (containerd's dump is checked elsewhere)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ansible_collections.gpu_ops.cluster.plugins.module_utils.container_runtime import DROPIN_MARKER, ConfigError
from ansible_collections.gpu_ops.cluster.plugins.module_utils.containerd_plan import (
    NVIDIA_CTK_DROP_IN,
    plan_absent,
    plan_present,
)
from conftest import load_filter_plugin

MAIN_V2 = 'version = 2\n\n[plugins."io.containerd.grpc.v1.cri"]\n  sandbox_image = "registry.k8s.io/pause:3.10"\n'
# What `nvidia-ctk runtime configure --runtime=containerd` (toolkit 1.18) writes into its drop-in, in its layout.
NVIDIA_CTK_DROPIN = """version = 2

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    [plugins."io.containerd.grpc.v1.cri".containerd]
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes]
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
          privileged_without_host_devices = false
          runtime_engine = ""
          runtime_root = ""
          runtime_type = "io.containerd.runc.v2"
          [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
            BinaryName = "/usr/bin/nvidia-container-runtime"
"""
NVIDIA_RUNTIME_IN_MAIN = MAIN_V2 + """
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
  runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
    BinaryName = "/usr/bin/nvidia-container-runtime"
"""


def params(tmp_path: Path, **extra) -> dict:
    return {"config_path": str(tmp_path / "config.toml"), "drop_in_path": str(tmp_path / "conf.d" / "99-nvidia.toml"),
            "containerd_binary": "containerd", "runtime_name": "nvidia",
            "runtime_binary": "/usr/bin/nvidia-container-runtime", "set_as_default": False, "systemd_cgroup": "true",
            "take_over": False, **extra}


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_a_drop_in_the_role_did_not_write_is_refused_naming_it_and_the_settings(tmp_path):
    p = params(tmp_path)
    write(tmp_path / "config.toml", MAIN_V2 + "")
    write(Path(p["drop_in_path"]), NVIDIA_CTK_DROPIN)
    with pytest.raises(ConfigError) as refused:
        plan_present(p, (1, 7))
    message = str(refused.value)
    assert message.startswith(f"{p['drop_in_path']} exists and this role did not write it")
    assert DROPIN_MARKER in message and "nothing was changed" in message
    assert "nvidia_container_toolkit_runtimes" in message and "nvidia_container_toolkit_take_over: true" in message


def test_the_nvidia_ctk_default_path_is_named_as_such(tmp_path):
    from ansible_collections.gpu_ops.cluster.plugins.module_utils.containerd_plan import foreign_drop_in_problem

    assert "nvidia-ctk runtime configure` writes there since toolkit 1.18" in foreign_drop_in_problem(
        NVIDIA_CTK_DROP_IN, NVIDIA_CTK_DROPIN)
    assert foreign_drop_in_problem(NVIDIA_CTK_DROP_IN, None) == ""
    assert foreign_drop_in_problem(NVIDIA_CTK_DROP_IN, DROPIN_MARKER + ": the nvidia runtime\n") == ""


def test_the_roles_own_drop_in_is_rewritten_as_before(tmp_path):
    p = params(tmp_path)
    write(tmp_path / "config.toml", MAIN_V2)
    first = plan_present(p, (1, 7))
    write(Path(p["drop_in_path"]), first["drop_in"][1])
    write(tmp_path / "config.toml", first["config"][1])
    again = plan_present(p, (1, 7))
    assert again["drop_in"][0] == again["drop_in"][1] and again["config"][0] == again["config"][1]


def test_take_over_replaces_the_foreign_drop_in_with_the_roles(tmp_path):
    p = params(tmp_path, take_over=True)
    write(tmp_path / "config.toml", MAIN_V2)
    write(Path(p["drop_in_path"]), NVIDIA_CTK_DROPIN)
    plan = plan_present(p, (1, 7))
    assert plan["drop_in"][0] == NVIDIA_CTK_DROPIN and plan["drop_in"][1].startswith(DROPIN_MARKER)


def test_the_runtime_defined_in_config_toml_by_someone_else_is_refused_unless_taken_over(tmp_path):
    write(tmp_path / "config.toml", NVIDIA_RUNTIME_IN_MAIN)
    with pytest.raises(ConfigError) as refused:
        plan_present(params(tmp_path), (1, 7))
    assert f"already defined in {tmp_path / 'config.toml'}" in str(refused.value)
    assert "nvidia_container_toolkit_take_over: true" in str(refused.value)
    plan = plan_present(params(tmp_path, take_over=True), (1, 7))
    assert "BinaryName" in plan["drop_in"][1]


def test_another_drop_in_imported_by_a_glob_is_found(tmp_path):
    # nvidia-ctk 1.18 adds `imports = ["/etc/containerd/conf.d/*.toml"]`; the role writes its own drop-in elsewhere.
    other = write(tmp_path / "conf.d" / "99-nvidia.toml", NVIDIA_CTK_DROPIN)
    write(tmp_path / "config.toml", f'imports = ["{tmp_path}/conf.d/*.toml"]\n' + MAIN_V2)
    p = params(tmp_path, drop_in_path=str(tmp_path / "gpu-cluster" / "nvidia.toml"))
    with pytest.raises(ConfigError) as refused:
        plan_present(p, (1, 7))
    assert f"already defined in {other}" in str(refused.value)


def test_the_roles_own_drop_in_at_an_earlier_path_is_not_another_owners(tmp_path):
    old = tmp_path / "conf.d" / "10-nvidia.toml"
    write(tmp_path / "config.toml", MAIN_V2)
    first = plan_present(params(tmp_path, drop_in_path=str(old)), (1, 7))
    write(old, first["drop_in"][1])
    write(tmp_path / "config.toml", first["config"][1])
    moved = plan_present(params(tmp_path, drop_in_path=str(tmp_path / "conf.d" / "99-nvidia.toml")), (1, 7))
    assert moved["drop_in"][1].startswith(DROPIN_MARKER)


def test_a_definition_imported_after_the_drop_in_is_refused_even_with_take_over(tmp_path):
    ours = tmp_path / "conf.d" / "50-nvidia.toml"
    later = write(tmp_path / "conf.d" / "99-nvidia.toml", NVIDIA_CTK_DROPIN)
    write(tmp_path / "config.toml", f'imports = ["{ours}", "{later}"]\n' + MAIN_V2)
    for take_over in (False, True):
        with pytest.raises(ConfigError) as refused:
            plan_present(params(tmp_path, drop_in_path=str(ours), take_over=take_over), (1, 7))
        assert f"also defined in {later}" in str(refused.value) and "after the role's drop-in" in str(refused.value)


def test_a_version_3_definition_is_found_in_its_own_plugin(tmp_path):
    main = ('version = 3\n\n[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia]\n'
            '  runtime_type = "io.containerd.runc.v2"\n')
    write(tmp_path / "config.toml", main)
    with pytest.raises(ConfigError):
        plan_present(params(tmp_path), (2, 2))


def test_absent_leaves_another_owners_drop_in_and_its_import(tmp_path):
    p = params(tmp_path)
    config = write(tmp_path / "config.toml", f'imports = ["{p["drop_in_path"]}"]\n' + MAIN_V2)
    write(Path(p["drop_in_path"]), NVIDIA_CTK_DROPIN)
    plan = plan_absent(p)
    assert plan["drop_in"] == (NVIDIA_CTK_DROPIN, NVIDIA_CTK_DROPIN)
    assert plan["config"][0] == plan["config"][1] == config.read_text()


@pytest.fixture(scope="module")
def foreign():
    return load_filter_plugin("container_toolkit").docker_foreign_runtime


NVIDIA_CTK_DOCKER = json.dumps({"runtimes": {"nvidia": {"args": [], "path": "nvidia-container-runtime"}},
                                "log-driver": "journald"})


def test_dockers_runtime_entry_of_another_owner_is_named(foreign):
    message = foreign(NVIDIA_CTK_DOCKER, "nvidia", "/usr/bin/nvidia-container-runtime", {}, "/etc/docker/daemon.json")
    assert message.startswith("/etc/docker/daemon.json already has a runtime 'nvidia' that this role did not write")
    assert '"path": "nvidia-container-runtime"' in message
    assert "nvidia_container_toolkit_runtimes" in message and "nvidia_container_toolkit_take_over: true" in message


@pytest.mark.parametrize(("text", "recorded"), [
    ("", {}), ("{}", {}), ('{"runtimes": {"runc-2": {"path": "/usr/bin/runc"}}}', {}),
    ('{"runtimes": {"nvidia": {"path": "/usr/bin/nvidia-container-runtime", "args": []}}}', {}),
    # written by an earlier run of the role (its record says so) with another binary: the role's to change
    (NVIDIA_CTK_DOCKER, {"runtimes": ["containerd", "docker"], "runtime_name": "nvidia"}),
    ("[1]", {}), ("not json", {}),  # reported by nvidia_container_toolkit_json_problem instead
])
def test_dockers_entry_is_not_foreign_when_absent_already_right_or_the_roles(foreign, text, recorded):
    assert foreign(text, "nvidia", "/usr/bin/nvidia-container-runtime", recorded) == ""


def test_a_record_of_containerd_only_does_not_make_dockers_entry_the_roles(foreign):
    recorded = {"runtimes": ["containerd"], "runtime_name": "nvidia"}
    assert foreign(NVIDIA_CTK_DOCKER, "nvidia", "/usr/bin/nvidia-container-runtime", recorded) != ""
