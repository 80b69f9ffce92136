"""Outcome checks of the nvidia_container_toolkit role, judged by the runtimes themselves where they can speak.

containerd: its own `config dump` (the merged view of config.toml and every import) must show the nvidia runtime and
every key the operator wrote. Docker: `docker info` from the running daemon must list the runtime. The operator's
files must keep every key they had (config.toml differs only in `imports`).
"""

from __future__ import annotations

import json
import tomllib

TOOLKIT_VERSION = "1.20.2"
PACKAGES = ["nvidia-container-toolkit", "nvidia-container-toolkit-base", "libnvidia-container-tools", "libnvidia-container1"]
DROP_IN = "/etc/containerd/conf.d/99-nvidia.toml"
RUNTIME = "/usr/bin/nvidia-container-runtime"
# Where containerd's dump (in its own config version) keeps the CRI runtimes.
CRI_RUNTIME_PLUGIN = {2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime",
                      4: "io.containerd.cri.v1.runtime"}


def flatten(table: dict, prefix: tuple = ()) -> dict[tuple, object]:
    """Every leaf of a TOML/JSON document by its key path."""
    leaves: dict[tuple, object] = {}
    for key, value in table.items():
        if isinstance(value, dict):
            leaves.update(flatten(value, prefix + (key,)))
        else:
            leaves[prefix + (key,)] = value
    return leaves


def held(host) -> set[str]:
    out = host.check_output("dpkg --get-selections")
    return {fields[0].split(":")[0] for fields in (line.split() for line in out.splitlines()) if fields[1:] == ["hold"]}


def assert_toolkit_installed(host) -> None:
    for name in PACKAGES:
        package = host.package(name)
        assert package.is_installed, f"{name} is not installed"
        assert package.version.startswith(TOOLKIT_VERSION + "-"), f"{name} is {package.version}"
    assert set(PACKAGES) <= held(host), f"not held: {set(PACKAGES) - held(host)}"
    # The real nvidia-ctk, built from NVIDIA's source, reports the pinned version.
    assert TOOLKIT_VERSION in host.check_output("nvidia-ctk --version")
    assert host.file(RUNTIME).is_file and host.file(RUNTIME).mode & 0o111


def containerd_dump(host) -> dict:
    return tomllib.loads(host.check_output("containerd config dump"))


def assert_containerd_keeps_user_and_adds_nvidia(host, version: int, as_default: bool) -> None:
    """version: the config version containerd dumps (its own), which is also the operator's file's here."""
    original = tomllib.loads(host.file("/root/original/config.toml").content_string)
    current = tomllib.loads(host.file("/etc/containerd/config.toml").content_string)
    assert {k: v for k, v in current.items() if k != "imports"} == original, "config.toml changed beyond imports"
    assert DROP_IN in current["imports"]
    # The drop-in is in config.toml's version, never a newer one (containerd 2.3.2 refuses an import newer than
    # config.toml: NVIDIA/aicr#1688).
    assert tomllib.loads(host.file(DROP_IN).content_string)["version"] == original["version"]

    dump = containerd_dump(host)
    assert dump["version"] == version, f"containerd dumps config version {dump['version']}, wanted {version}"
    dumped = flatten(dump)
    # Every setting the operator wrote is what containerd runs with (not replaced by the drop-in's section).
    for path, value in flatten(original).items():
        assert dumped.get(path) == value, f"containerd's dump has {'.'.join(path)} = {dumped.get(path)!r}, wanted {value!r}"
    section = dump["plugins"][CRI_RUNTIME_PLUGIN[version]]["containerd"]
    nvidia = section["runtimes"]["nvidia"]
    assert nvidia["runtime_type"] == "io.containerd.runc.v2"
    assert nvidia["options"]["BinaryName"] == RUNTIME
    # The operator's runc uses the systemd cgroup driver, so the nvidia runtime must too.
    assert nvidia["options"]["SystemdCgroup"] is True
    assert (section["default_runtime_name"] == "nvidia") is as_default, section["default_runtime_name"]
    assert host.service("containerd").is_running
    # The handler restarted containerd after the drop-in was written, so the running daemon has read it.
    started = host.check_output("systemctl show --timestamp=unix -P ExecMainStartTimestamp containerd").lstrip("@")
    written = host.check_output(f"stat -c %Y {DROP_IN}")
    assert int(started) >= int(written), f"containerd started at {started}, before the drop-in was written at {written}"


def assert_docker_keeps_user_and_adds_nvidia(host, as_default: bool) -> None:
    original = json.loads(host.file("/root/original/daemon.json").content_string)
    current = json.loads(host.file("/etc/docker/daemon.json").content_string)
    for key, value in original.items():
        assert current[key] == value, f"daemon.json {key} = {current.get(key)!r}, the operator had {value!r}"
    assert current["runtimes"]["nvidia"]["path"] == RUNTIME
    assert ("default-runtime" in current) is as_default
    # The running daemon's own view.
    info = json.loads(host.check_output("docker info --format '{{json .}}'"))
    assert "nvidia" in info["Runtimes"], info["Runtimes"]
    assert (info["DefaultRuntime"] == "nvidia") is as_default, info["DefaultRuntime"]
    assert info["Driver"] == original["storage-driver"]


def assert_no_cdi_without_gpus(host) -> None:
    assert not host.file("/etc/cdi/nvidia.yaml").exists
    state = json.loads(host.file("/etc/ansible/facts.d/nvidia_container_toolkit.fact").content_string)
    assert state["version"] == TOOLKIT_VERSION and state["cdi_driver_version"] == ""
