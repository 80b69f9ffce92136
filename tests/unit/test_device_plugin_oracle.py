"""The device plugin config check against the plugin's own loader.

The oracle is lab/go/device-plugin-config: our program around k8s-device-plugin's `api/config/v1` (v0.18.0, the
newest release the Go module proxy serves), which runs what the plugin runs at start before it touches a GPU
(`labctl device-plugin-config` builds it; `make unit` first). It reads the config files with the environment of the
plugin container this project's DaemonSet renders. For every input below, plugins/module_utils/device_plugin_config.py
must refuse exactly what the loader refuses; where it refuses more, each of its problems must name the project's rule
("(project rule: ...").

Inputs: every config the nvidia_device_plugin role renders (its defaults, the lab's and the example inventory's
configs, through the role's own ConfigMap template), the plugin's published examples (its README's config blocks and
its Helm chart's example map, read from the downloaded module in the Go module cache, not copied here), the GPU
Operator docs' time-slicing and MPS examples (fixtures/device_plugin/gpu_operator_docs.yaml, with their source), and a
table of edge cases.
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Mapping, Tuple

import pytest
import yaml

from conftest import REPO_ROOT, load_filter_plugin, render_role_template
from ansible_collections.gpu_ops.cluster.plugins.module_utils.device_plugin_config import config_problems, uses_mps

sys.path.insert(0, str(REPO_ROOT / "lab"))
import gobuild  # noqa: E402  (lab/ on the path above)
from _common import device_plugin_config_check_path  # noqa: E402

PROJECT_RULE = "(project rule:"
FIXTURES = REPO_ROOT / "tests" / "unit" / "fixtures" / "device_plugin"
UUID = "b1028956-cfa2-0990-bf4a-5da9abb51763"


def oracle() -> Path:
    path = device_plugin_config_check_path()
    if path.is_file():
        return path
    message = (f"the device plugin config oracle is not built ({path}): run `lab/labctl.py device-plugin-config` "
               "(make unit does) or set DEVICE_PLUGIN_CONFIG_CHECK")
    if os.environ.get("CI") or os.environ.get("MAKELEVEL"):
        pytest.fail(message)  # under make (CI runs make test) the unit target builds it first: absent is a failure
    pytest.skip(message)


@functools.lru_cache(maxsize=None)
def _role_plugin_env() -> Tuple[Tuple[str, str], ...]:
    daemonset = yaml.safe_load(render_role_template("nvidia_device_plugin", "daemonset.yaml.j2"))
    container = next(c for c in daemonset["spec"]["template"]["spec"]["containers"]
                     if c["name"] == "nvidia-device-plugin")
    return tuple((item["name"], item["value"]) for item in container["env"])


def role_plugin_env() -> Dict[str, str]:
    """The environment of the plugin container in the DaemonSet the role renders (CONFIG_FILE is overridden)."""
    return dict(_role_plugin_env())


def judge(files: Mapping[str, str], tmp_path: Path, env: Mapping[str, str] | None = None) -> Dict[str, dict]:
    """The oracle's verdict on each config text, keyed as given; one run for all of them."""
    paths = []
    for index, (key, text) in enumerate(files.items()):
        path = tmp_path / f"config-{index}.yaml"
        path.write_text(text, encoding="utf-8")
        paths.append((key, path))
    run_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **(role_plugin_env() if env is None else env)}
    result = subprocess.run([str(oracle()), *(str(path) for _, path in paths)], env=run_env, capture_output=True,
                            text=True, check=False, timeout=60)
    assert result.returncode == 0, result.stderr
    verdicts = [json.loads(line) for line in result.stdout.splitlines()]
    assert [v["file"] for v in verdicts] == [str(path) for _, path in paths]
    return {key: verdict for (key, _), verdict in zip(paths, verdicts)}


def role_mps_root() -> str:
    """The MPS_ROOT the role's DaemonSet gives the plugin, which the project's check is told as its mps_root."""
    return role_plugin_env()["MPS_ROOT"]


def disagreement(name: str, config: Any, verdict: Mapping[str, Any], mps_root: str | None = None) -> str | None:
    """None when the project's check agrees with the plugin's verdict (or is stricter by a named project rule)."""
    problems = config_problems(name, config, role_mps_root() if mps_root is None else mps_root)
    if not verdict["accepted"]:
        return None if problems else f"the plugin refuses ({verdict['error']}) but the project's check accepts"
    unnamed = [p for p in problems if PROJECT_RULE not in p]
    if unnamed:
        return f"the plugin accepts (warnings {verdict['warnings']}) but the project refuses {unnamed}"
    return None


def assert_agree(cases: Mapping[str, Tuple[str, Any, str]], verdicts: Mapping[str, dict]) -> None:
    found = {key: disagreement(name, config, verdicts[key]) for key, (name, config, _) in cases.items()}
    wrong = {key: reason for key, reason in found.items() if reason}
    assert not wrong, json.dumps(wrong, indent=1)


def dump(config: Any) -> str:
    return yaml.safe_dump(config, sort_keys=False)


# --- every config the role renders ---------------------------------------------------------------------------------


def example_inventory_configs() -> Dict[str, Any]:
    """The example inventory's nvidia_device_plugin_configs, which it shows commented out."""
    text = (REPO_ROOT / "inventories" / "example" / "group_vars" / "cluster_control" / "device_plugin.yml").read_text()
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("# nvidia_device_plugin_configs:"))
    block = [re.sub(r"^# ?", "", line) for line in lines[start:] if line.startswith("#")]
    return yaml.safe_load("\n".join(block))["nvidia_device_plugin_configs"]


def role_config_sets() -> Dict[str, Dict[str, Any]]:
    defaults = yaml.safe_load((REPO_ROOT / "roles" / "nvidia_device_plugin" / "defaults" / "main.yml").read_text())
    lab = yaml.safe_load((REPO_ROOT / "inventories" / "lab" / "group_vars" / "cluster_control" / "device_plugin.yml")
                         .read_text())
    return {"role defaults": defaults["nvidia_device_plugin_configs"],
            "lab inventory": lab["nvidia_device_plugin_configs"],
            "example inventory": example_inventory_configs()}


def test_every_config_the_role_renders_is_judged_alike(tmp_path: Path):
    cases, files = {}, {}
    for source, configs in role_config_sets().items():
        rendered = yaml.safe_load(render_role_template("nvidia_device_plugin", "config-map.yaml.j2",
                                                       nvidia_device_plugin_configs=configs))
        assert sorted(rendered["data"]) == sorted(configs)
        for name, text in rendered["data"].items():
            cases[f"{source}/{name}"] = (name, configs[name], text)
            files[f"{source}/{name}"] = text
    verdicts = judge(files, tmp_path)
    assert_agree(cases, verdicts)
    # What the project ships must start the plugin, with nothing it would ignore.
    assert all(v["accepted"] and not v["warnings"] for v in verdicts.values()), verdicts


# --- the plugin's own published examples, from its Go module -----------------------------------------------------


def module_dir() -> Path:
    oracle()  # built (or skipped) first: the module is then in the cache, and no test reaches the proxy for it
    return gobuild.module_source("device-plugin-config")


def readme_examples(readme: str) -> Dict[str, str]:
    """The README's complete config files: yaml blocks and shell here-documents that start with `version: v1`;
    blocks showing the format with placeholders (<bool>, ...) are not configs."""
    found = {}
    for index, match in enumerate(re.finditer(r"```yaml\n(version: v1\n.*?)```|cat << EOF > (\S+)\n(version: v1\n.*?)EOF",
                                              readme, re.S)):
        text = match.group(1) or match.group(3)
        if "<" in text or "..." in text:
            continue
        found[f"README.md #{index} ({match.group(2) or 'yaml block'})"] = text
    return found


def chart_examples(values: str) -> Dict[str, str]:
    """The Helm chart's commented example `config.map` in values.yaml."""
    lines = values.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "# config:")
    block = []
    for line in lines[start:]:
        if not line.startswith("#"):
            break
        block.append(line[2:] if line.startswith("# ") else line[1:])
    return {f"values.yaml config.map.{name}": text for name, text in yaml.safe_load("\n".join(block))["config"]["map"]
            .items()}


@functools.lru_cache(maxsize=None)
def _published_examples() -> Tuple[Tuple[str, str], ...]:
    root = module_dir()
    examples = readme_examples((root / "README.md").read_text(encoding="utf-8"))
    examples.update(chart_examples((root / "deployments" / "helm" / "nvidia-device-plugin" / "values.yaml")
                                   .read_text(encoding="utf-8")))
    return tuple(examples.items())


def published_examples() -> Dict[str, str]:
    return dict(_published_examples())


def test_the_readme_and_chart_examples_are_found():
    examples = published_examples()
    texts = list(examples.values())
    # v0.18.0's README: the flags example, time-slicing, time-slicing renamed, MPS, MPS renamed and the two
    # here-documents; the chart's three-config map. A parser that finds fewer has lost examples.
    assert len([k for k in examples if k.startswith("README")]) >= 5, sorted(examples)
    assert any("timeSlicing" in t for t in texts) and any("mps:" in t for t in texts), texts
    assert {"values.yaml config.map.default", "values.yaml config.map.mig-single", "values.yaml config.map.mig-mixed"} \
        <= set(examples)


def test_the_plugins_published_examples_are_judged_alike(tmp_path: Path):
    examples = published_examples()
    verdicts = judge(examples, tmp_path)
    assert_agree({key: ("example", yaml.safe_load(text), text) for key, text in examples.items()}, verdicts)
    # All of them go in unchanged (the MPS one since the role gives the plugin MPS_ROOT).
    assert [key for key, v in verdicts.items() if not v["accepted"]] == []
    assert {key: config_problems("example", yaml.safe_load(text), role_mps_root()) for key, text in examples.items()} \
        == {key: [] for key in examples}


def test_the_readmes_mps_examples_go_in_unchanged(tmp_path: Path):
    """The README's MPS configs, as published, start the plugin in the role's environment and pass the check."""
    mps = {key: text for key, text in published_examples().items() if uses_mps(yaml.safe_load(text))}
    # v0.18.0's README: one complete MPS config (its renamed one ends in "...", a sketch that readme_examples skips;
    # the edge case "mps renamed" stands for it).
    assert mps, sorted(published_examples())
    verdicts = judge(mps, tmp_path)
    for key, text in mps.items():
        assert verdicts[key]["accepted"] and not verdicts[key]["warnings"], (key, verdicts[key])
        assert config_problems("example", yaml.safe_load(text), role_mps_root()) == [], key


# --- the GPU Operator docs' examples (fixtures) -----------------------------------------------------------------


def gpu_operator_examples() -> Dict[str, str]:
    docs = yaml.safe_load((FIXTURES / "gpu_operator_docs.yaml").read_text())
    return {f"{source}/{name}": text for source, configs in docs.items() for name, text in configs.items()}


def test_the_gpu_operator_docs_examples_are_judged_alike(tmp_path: Path):
    examples = gpu_operator_examples()
    verdicts = judge(examples, tmp_path)
    assert_agree({key: (key.split("/")[1], yaml.safe_load(text), text) for key, text in examples.items()}, verdicts)
    # Every one of them, time-slicing and MPS, goes in unchanged.
    assert [key for key, v in verdicts.items() if v["accepted"]] == list(examples)
    assert {key: config_problems(key.split("/")[1], yaml.safe_load(text), role_mps_root())
            for key, text in examples.items()} == {key: [] for key in examples}


def test_mps_examples_need_the_mps_root_the_role_gives(tmp_path: Path):
    """The docs' MPS examples set no flags.mpsRoot: they rely on the MPS_ROOT NVIDIA's Helm chart and the GPU Operator
    give the plugin, which the role's DaemonSet now gives too. Without it the plugin refuses them, and so does the
    check told of no MPS root: the MPS_ROOT in the role's environment is what makes both accept them."""
    mps = {key: text for key, text in gpu_operator_examples().items() if "mps" in key}
    assert mps and role_mps_root() == "/run/nvidia/mps"
    in_role = judge(mps, tmp_path)
    without_root = judge(mps, tmp_path, {k: v for k, v in role_plugin_env().items() if k != "MPS_ROOT"})
    for key, text in mps.items():
        assert in_role[key]["accepted"], in_role[key]
        assert "using MPS requires --mps-root" in without_root[key]["error"], without_root[key]
        assert any("without flags.mpsRoot" in p for p in config_problems("mps", yaml.safe_load(text), ""))
        assert disagreement("mps", yaml.safe_load(text), without_root[key], mps_root="") is None


# --- edge cases, through both ------------------------------------------------------------------------------------


def ts(resource: Mapping[str, Any], **section: Any) -> Dict[str, Any]:
    return {"version": "v1", "sharing": {"timeSlicing": {**section, "resources": [dict(resource)]}}}


GPU2 = {"name": "nvidia.com/gpu", "replicas": 2}
MPS_ROOT = {"mpsRoot": "/run/nvidia/mps"}
EDGE_CASES: List[Tuple[str, Any]] = [
    ("empty", {}),
    ("version empty", {"version": ""}),
    ("version v2", {"version": "v2"}),
    ("imex channel 0", {"version": "v1", "imex": {"channelIDs": [0], "required": True}}),
    ("imex no channel", {"version": "v1", "imex": {"channelIDs": []}}),
    ("imex channel 1", {"version": "v1", "imex": {"channelIDs": [1]}}),
    ("imex channels 0 1", {"version": "v1", "imex": {"channelIDs": [0, 1]}}),
    ("imex required not bool", {"version": "v1", "imex": {"required": "yes"}}),
    ("imex unknown key", {"version": "v1", "imex": {"channels": [0]}}),
    ("unknown top key", {"version": "v1", "flag": {}}),
    ("migStrategy bad", {"version": "v1", "flags": {"migStrategy": "all"}}),
    ("migStrategy null", {"version": "v1", "flags": {"migStrategy": None}}),
    ("failOnInitError string", {"version": "v1", "flags": {"failOnInitError": "yes"}}),
    ("deviceListStrategy list", {"version": "v1", "flags": {"plugin": {"deviceListStrategy": ["envvar",
                                                                                              "cdi-cri"]}}}),
    ("deviceListStrategy bad", {"version": "v1", "flags": {"plugin": {"deviceListStrategy": "mounts"}}}),
    ("deviceIDStrategy bad", {"version": "v1", "flags": {"plugin": {"deviceIDStrategy": "serial"}}}),
    ("sharedDevicesAllocationPolicy packed", {"version": "v1", "flags": {"plugin": {
        "sharedDevicesAllocationPolicy": "packed"}}}),
    ("deviceDiscoveryStrategy tegra", {"version": "v1", "flags": {"deviceDiscoveryStrategy": "tegra"}}),
    ("deviceDiscoveryStrategy bad", {"version": "v1", "flags": {"deviceDiscoveryStrategy": "pci"}}),
    ("gfd sleepInterval", {"version": "v1", "flags": {"gfd": {"sleepInterval": "60s", "oneshot": False}}}),
    ("gfd sleepInterval bad", {"version": "v1", "flags": {"gfd": {"sleepInterval": "a minute"}}}),
    ("replicas 2", ts(GPU2)),
    ("replicas 1", ts({"name": "nvidia.com/gpu", "replicas": 1})),
    ("replicas string", ts({"name": "nvidia.com/gpu", "replicas": "4"})),
    ("replicas missing", ts({"name": "nvidia.com/gpu"})),
    ("name without prefix", ts({"name": "gpu", "replicas": 2})),
    ("name other domain", ts({"name": "example.com/gpu", "replicas": 2})),
    ("name double dot", ts({"name": "nvidia.com/mig..1g", "replicas": 2})),
    ("name upper case", ts({"name": "nvidia.com/GPU", "replicas": 2})),
    ("name too long", ts({"name": "nvidia.com/" + "g" * 53, "replicas": 2})),
    ("name longest", ts({"name": "nvidia.com/" + "g" * 52, "replicas": 2})),
    ("name missing", ts({"replicas": 2})),
    ("resources empty", {"version": "v1", "sharing": {"timeSlicing": {"resources": []}}}),
    ("timeSlicing empty", {"version": "v1", "sharing": {"timeSlicing": {}}}),
    ("timeSlicing null", {"version": "v1", "sharing": {"timeSlicing": None}}),
    ("mps null", {"version": "v1", "sharing": {"mps": None}}),
    ("sharing unknown kind", {"version": "v1", "sharing": {"slicing": {}}}),
    ("renameByDefault string", ts(GPU2, renameByDefault="yes")),
    ("renameByDefault true", ts(GPU2, renameByDefault=True)),
    ("failRequestsGreaterThanOne true", ts(GPU2, failRequestsGreaterThanOne=True)),
    ("devices all", ts({**GPU2, "devices": "all"})),
    ("devices some", ts({**GPU2, "devices": "some"})),
    ("devices count", ts({**GPU2, "devices": 2})),
    ("devices count 0", ts({**GPU2, "devices": 0})),
    ("devices indexes", ts({**GPU2, "devices": [0, 1]})),
    ("devices index strings", ts({**GPU2, "devices": ["0", "1"]})),
    ("devices negative index", ts({**GPU2, "devices": [-1]})),
    ("devices mig indexes", ts({**GPU2, "devices": ["0:1"]})),
    ("devices gpu uuid", ts({**GPU2, "devices": ["GPU-" + UUID]})),
    ("devices mig uuid", ts({**GPU2, "devices": ["MIG-" + UUID]})),
    ("devices mig gpu uuid", ts({**GPU2, "devices": ["MIG-GPU-" + UUID + "/3/0"]})),
    ("devices bad uuid", ts({**GPU2, "devices": ["GPU-x"]})),
    ("devices product name", ts({**GPU2, "devices": ["A100"]})),
    ("devices null", ts({**GPU2, "devices": None})),
    ("devices true", ts({**GPU2, "devices": True})),
    ("rename", ts({**GPU2, "rename": "gpu-shared"})),
    ("rename bad", ts({**GPU2, "rename": "Shared GPU"})),
    ("rename default", ts({**GPU2, "rename": "nvidia.com/gpu.shared"}, renameByDefault=True)),
    ("resource unknown key", ts({**GPU2, "replica": 4})),
    ("top resources", {"version": "v1", "resources": {"gpus": [{"pattern": "*", "name": "gpu"}]}}),
    ("top resources without pattern", {"version": "v1", "resources": {"gpus": [{"name": "gpu"}]}}),
    ("mps", {"version": "v1", "sharing": {"mps": {"resources": [GPU2]}}}),
    ("mps with root", {"version": "v1", "flags": MPS_ROOT, "sharing": {"mps": {"resources": [GPU2]}}}),
    ("mps mixed", {"version": "v1", "flags": {**MPS_ROOT, "migStrategy": "mixed"},
                   "sharing": {"mps": {"resources": [GPU2]}}}),
    ("mps single", {"version": "v1", "flags": {**MPS_ROOT, "migStrategy": "single"},
                    "sharing": {"mps": {"resources": [GPU2]}}}),
    ("mps mig resource", {"version": "v1", "flags": MPS_ROOT,
                          "sharing": {"mps": {"resources": [{"name": "nvidia.com/mig-1g.10gb", "replicas": 2}]}}}),
    ("mps and timeSlicing", {"version": "v1", "flags": MPS_ROOT, "sharing": {"mps": {"resources": [GPU2]},
                                                                             "timeSlicing": {"resources": [GPU2]}}}),
    ("mps other root", {"version": "v1", "flags": {"mpsRoot": "/var/lib/mps"}, "sharing": {"mps": {
        "resources": [GPU2]}}}),
    ("mps root not a string", {"version": "v1", "flags": {"mpsRoot": 5}, "sharing": {"mps": {"resources": [GPU2]}}}),
    ("mps renamed", {"version": "v1", "sharing": {"mps": {"renameByDefault": True, "resources": [GPU2]}}}),
]


@pytest.fixture(scope="module")
def edge_verdicts(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, dict]:
    return judge({name: dump(config) for name, config in EDGE_CASES}, tmp_path_factory.mktemp("edge"))


def test_edge_cases_are_judged_alike(edge_verdicts: Dict[str, dict]):
    assert_agree({name: ("edge", config, "") for name, config in EDGE_CASES}, edge_verdicts)


@pytest.mark.parametrize(("name", "accepted", "project_rule"), [
    # What the project refuses that the plugin accepts, each by a rule it names; and what both refuse.
    ("imex channel 0", True, False),
    ("imex channel 1", False, False),
    ("devices product name", False, False),
    ("devices indexes", True, True),  # the plugin ignores a devices selection
    ("rename", True, True),  # ... and a custom rename
    ("rename bad", False, False),
    ("name without prefix", True, False),
    ("mps single", True, True),
    ("mps and timeSlicing", True, True),
    ("mps", True, False),  # the role's DaemonSet gives the plugin MPS_ROOT
    ("mps with root", True, False),  # flags.mpsRoot repeating the role's root
    ("mps other root", True, True),  # MPS_ROOT overrides it: the file's root would silently not apply
    ("mps renamed", True, False),
    ("unknown top key", True, True),
])
def test_the_table_holds_both_kinds_of_rule(edge_verdicts: Dict[str, dict], name: str, accepted: bool,
                                           project_rule: bool):
    """The comparison above can fail both ways: these cases pin the plugin's verdict and the project's reason."""
    config = dict(EDGE_CASES)[name]
    verdict = edge_verdicts[name]
    assert verdict["accepted"] is accepted, verdict
    problems = config_problems("edge", config)
    if accepted and not project_rule:
        assert problems == []
    else:
        assert problems and all((PROJECT_RULE in p) is project_rule for p in problems), problems


def test_the_filter_uses_the_same_check():
    problems = load_filter_plugin("device_plugin").device_plugin_config_problems
    config = dict(EDGE_CASES)["devices product name"]
    assert problems({"default": config}, "default") == config_problems("default", config)
