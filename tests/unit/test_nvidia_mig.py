"""The nvidia_mig module's decisions and commands, run against the lab's nvidia-smi double (lab/doubles/nvidia-smi,
which keeps MIG state the way the real tool does: mode, GPU and compute instances, placements, pending modes) in a
state directory of the test's own: read, check, plan, apply, re-read, as on a host."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

from ansible_collections.gpu_ops.cluster.plugins.module_utils.nvidia_gpu import CommandResult, run_with_timeout
from ansible_collections.gpu_ops.cluster.plugins.modules import nvidia_mig as m

ROOT = Path(__file__).resolve().parents[2]
DOUBLE = ROOT / "lab" / "doubles" / "nvidia-smi"
BALANCED = {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}


class Node:
    """One simulated host: its GPU description, its state directory, and the module's Host over the double."""

    def __init__(self, tmp_path: Path, product: str = "NVIDIA H100 80GB HBM3", count: int = 2, **faults) -> None:
        self.description = tmp_path / "gpus.json"
        self.root = tmp_path / "state"
        self.root.mkdir()
        self.describe(product, count, **faults)
        self.calls: list = []
        self.host = m.Host(str(DOUBLE), 30, self.run)

    def describe(self, product: str, count: int, **faults) -> None:
        self.description.write_text(json.dumps({"product": product, "count": count, "driver_version": "580.105.08",
                                                "cuda_version": "13.0", **({"faults": faults} if faults else {})}))

    def run(self, argv, timeout) -> CommandResult:
        import os

        self.calls.append(list(argv[1:]))
        os.environ["GPU_LAB_GPUS"], os.environ["GPU_LAB_STATE_ROOT"] = str(self.description), str(self.root)
        return run_with_timeout([sys.executable] + list(argv), timeout)

    def apply(self, config, strategy="mixed", check=False, gpu_reset=True):
        params = {"config_name": "test", "config": config, "strategy": strategy, "tool": "nvidia-smi",
                  "gpu_reset": gpu_reset, "node": "gpu-test-0"}
        self.host.commands.clear()
        return m.run(types.SimpleNamespace(check_mode=check), self.host, params)

    def devices(self):
        return [[d["profile"] for d in gpu["mig_devices"]] for gpu in self.host.read()]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    monkeypatch.delenv("GPU_LAB_GPUS", raising=False)
    monkeypatch.delenv("GPU_LAB_STATE_ROOT", raising=False)


def everywhere(devices, enabled=True):
    return [{"devices": "all", "mig-enabled": enabled, "mig-devices": devices}]


def test_check_mode_plans_and_changes_nothing_then_apply_converges_once(tmp_path):
    node = Node(tmp_path)
    planned = node.apply(everywhere(BALANCED), check=True)
    assert planned["changed"] and [a["index"] for a in planned["plan"]] == [0, 1]
    assert planned["plan"][0]["mode"] == "enable" and planned["plan"][0]["create"]
    assert node.host.commands == [] and node.devices() == [[], []]

    applied = node.apply(everywhere(BALANCED))
    assert applied["changed"] and applied["reboot_required"] == [] and applied["tool"] == "nvidia-smi"
    assert "nvidia-smi -i 0 -mig 1" in applied["commands"]
    assert [sorted(d) for d in node.devices()] == [sorted(["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"])] * 2
    assert applied["expected_resources"] == {"nvidia.com/mig-1g.10gb": 4, "nvidia.com/mig-2g.20gb": 2,
                                             "nvidia.com/mig-3g.40gb": 2}
    # Each MIG device is reported with its UUID (from -L).
    assert all(d["uuid"].startswith("MIG-") for gpu in applied["gpus"] for d in gpu["mig_devices"])

    again = node.apply(everywhere(BALANCED))
    assert not again["changed"] and again["plan"] == [] and again["commands"] == []


def test_a_new_layout_destroys_only_the_gpus_that_differ(tmp_path):
    node = Node(tmp_path)
    node.apply(everywhere(BALANCED))
    result = node.apply([{"devices": [0], "mig-enabled": True, "mig-devices": BALANCED},
                         {"devices": [1], "mig-enabled": False}])
    assert all(" -i 0" not in command for command in result["commands"]), result["commands"]
    assert result["commands"] == ["nvidia-smi mig -dci -i 1", "nvidia-smi mig -dgi -i 1", "nvidia-smi -i 1 -mig 0"]
    assert [g["mig_mode"] for g in result["gpus"]] == ["enabled", "disabled"]


@pytest.mark.parametrize("config, strategy, words", [
    (everywhere({"7g.80gb": 1, "1g.10gb": 1}), "mixed",
     "nvidia_mig_config='test': node gpu-test-0, GPU 0 (NVIDIA H100 80GB HBM3): the layout"),
    (everywhere({"1g.5gb": 2}), "mixed", "profile '1g.5gb' does not exist on NVIDIA H100 80GB HBM3"),
    ([{"devices": [0], "mig-enabled": True, "mig-devices": {"1g.10gb": 7}}], "single",
     "with the device plugin's MIG strategy single needs every GPU"),
    (everywhere({"1g.10gb": 7}), "none", "the device plugin's MIG strategy is none"),
    ([{"devices": [3], "mig-enabled": False}], "mixed", "config 'test'[0].devices names GPU 3; the node has GPUs 0, 1"),
])
def test_refusals_come_before_any_change(tmp_path, config, strategy, words):
    node = Node(tmp_path)
    with pytest.raises(m.MigError, match=None) as error:
        node.apply(config, strategy=strategy)
    assert words in str(error.value), str(error.value)
    assert node.host.commands == [] and all(g["mig_mode"] == "disabled" for g in node.host.read())


def test_a_gpu_without_mig_is_refused_by_index_and_skipped_by_all(tmp_path):
    node = Node(tmp_path, product="NVIDIA L4", count=1)
    with pytest.raises(m.MigError,
                       match=r"nvidia_mig_config='test': node gpu-test-0, GPU 0 \(NVIDIA L4\): not MIG-capable"):
        node.apply([{"devices": [0], "mig-enabled": True, "mig-devices": {}}])
    # mig-parted's apply skips a GPU that cannot do MIG under `devices: all`; so does the module.
    assert node.apply(everywhere({"1g.10gb": 7}))["changed"] is False
    assert node.apply([{"devices": "all", "mig-enabled": False}])["changed"] is False


def test_processes_on_a_changing_gpu_stop_the_change(tmp_path):
    node = Node(tmp_path, processes=[{"index": 1, "pid": 4242, "name": "python3", "used_memory_mib": 1000}])
    with pytest.raises(m.MigError, match=r"GPU 1: pid 4242 \(python3\)"):
        node.apply(everywhere(BALANCED))
    assert node.host.commands == [] and node.devices() == [[], []]
    # A GPU the layout leaves alone may be busy.
    assert node.apply([{"devices": [0], "mig-enabled": True, "mig-devices": {"3g.40gb": 2}}])["changed"]


def test_a_pending_mode_is_made_effective_by_a_reset_or_reported_for_a_reboot(tmp_path):
    node = Node(tmp_path, count=1, mig_reset_required=True)
    held = node.apply(everywhere({"3g.40gb": 2}), gpu_reset=False)
    assert held["reboot_required"] == [0] and node.devices() == [[]]
    assert [(g["mig_mode"], g["mig_mode_pending"]) for g in held["gpus"]] == [("disabled", "enabled")]
    reset = node.apply(everywhere({"3g.40gb": 2}))
    assert "nvidia-smi --gpu-reset -i 0" in reset["commands"] and reset["reboot_required"] == []
    assert node.devices() == [["3g.40gb", "3g.40gb"]]


def test_another_creation_order_is_tried_when_the_driver_cannot_place_one(tmp_path):
    node = Node(tmp_path, count=1)
    real = node.run
    refused = []

    def first_creation_fails(argv, timeout):
        if "-cgi" in argv and not refused:
            refused.append(argv)
            return CommandResult(rc=6, stdout="Unable to create a GPU instance on GPU  0 using profile 14: "
                                 "Insufficient Resources\n", stderr="")
        return real(argv, timeout)
    node.host.runner = first_creation_fails
    result = node.apply(everywhere(BALANCED))
    creates = [c for c in result["commands"] if "-cgi" in c]
    assert len(creates) == 2 and creates[0] != creates[1], result["commands"]
    assert sorted(node.devices()[0]) == sorted(["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"])
