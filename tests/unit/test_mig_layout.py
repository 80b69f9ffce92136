"""MIG layouts in mig-parted's format: form checks, fit and strategy checks, parsing, plans (module_utils/mig_layout)."""

import pytest

from ansible_collections.gpu_ops.cluster.plugins.filter.mig import nvidia_mig_config_problems
from ansible_collections.gpu_ops.cluster.plugins.module_utils import mig_layout as ml

H100 = "NVIDIA H100 80GB HBM3"


def gpu(index, mode="disabled", instances=(), name=H100, pending=None):
    return {"index": index, "name": name, "uuid": f"GPU-{index}", "mig_mode": mode, "mig_mode_raw": (mode or "[N/A]").title(),
            "mig_mode_pending": pending or mode, "mig_capable": mode is not None,
            "instances": [{"profile": p} for p in instances]}


def test_well_formed_configs_pass():
    configs = {"all-1g.10gb": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 7}}],
               "half": [{"devices": [0, 1], "mig-enabled": True, "mig-devices": {"3g.40gb": 2}},
                        {"devices": [2, 3], "mig-enabled": False}]}
    assert ml.configs_problems(configs) == []
    assert nvidia_mig_config_problems(configs, "half", {"all-disabled": []}) == []
    assert nvidia_mig_config_problems(configs, "", {}) == []


@pytest.mark.parametrize("configs, words", [
    ([], "nvidia_mig_configs=[]: must be a mapping"),
    ({"x": []}, "nvidia_mig_configs['x']=[]: must be a non-empty list"),
    ({"x": [{"devices": "some", "mig-enabled": True}]}, "nvidia_mig_configs['x'][0].devices='some': must be 'all'"),
    ({"x": [{"devices": [0, 0], "mig-enabled": True}]}, "names a GPU twice"),
    ({"x": [{"devices": "all", "mig-enabled": "yes"}]}, "nvidia_mig_configs['x'][0].mig-enabled='yes': must be true"),
    ({"x": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": "7"}}]},
     "nvidia_mig_configs['x'][0].mig-devices['1g.10gb']='7': must be a whole number"),
    ({"x": [{"devices": "all", "mig-enabled": False, "mig-devices": {"1g.10gb": 7}}]}, "with mig-enabled false"),
    ({"x": [{"devices": "all", "mig-enabled": True, "mig_devices": {}}]}, "unknown keys mig_devices"),
    ({"x": [{"devices": "all", "mig-enabled": True}]}, "nvidia_mig_configs['x'][0]: mig-enabled true needs mig-devices"),
    ({"Bad Name": [{"devices": "all", "mig-enabled": False}]}, "must be a valid label value"),
])
def test_bad_configs_name_the_path_and_value(configs, words):
    problems = ml.configs_problems(configs)
    assert any(words in p for p in problems), problems


def test_chosen_config_must_exist():
    assert nvidia_mig_config_problems({}, "nope", {"all-disabled": []}) == [
        "nvidia_mig_config='nope' names no config; known: all-disabled"]


def test_desired_per_gpu_later_entries_win_and_indexes_the_node_lacks():
    # mig-parted applies the entries in order: a GPU two entries take ends with the later one's layout.
    entries = [{"devices": "all", "mig-enabled": False},
               {"devices": [0], "mig-enabled": True, "mig-devices": {"MIG 3g.40gb": 2}}]
    wanted, problems = ml.desired_by_gpu(entries, [gpu(0), gpu(1)], "config 'x'")
    assert problems == []
    assert wanted == {0: {"enabled": True, "devices": {"3g.40gb": 2}, "entry": 1},
                      1: {"enabled": False, "devices": {}, "entry": 0}}
    _, problems = ml.desired_by_gpu([{"devices": [5], "mig-enabled": False}], [gpu(0), gpu(1)], "config 'x'")
    assert problems == ["config 'x'[0].devices names GPU 5; the node has GPUs 0, 1"]


def test_fit_refusals_name_node_gpu_and_profile():
    gpus = [gpu(0), gpu(1, mode=None, name="NVIDIA L4")]
    wanted = {0: {"enabled": True, "devices": {"1g.5gb": 1}}, 1: {"enabled": True, "devices": {"1g.10gb": 1}}}
    problems = ml.fit_problems(gpus, wanted, "gpu-h100-0")
    assert problems[0].startswith("node gpu-h100-0, GPU 0 (NVIDIA H100 80GB HBM3): profile '1g.5gb' does not exist")
    assert problems[1].startswith("node gpu-h100-0, GPU 1 (NVIDIA L4): not MIG-capable")


def test_strategies():
    gpus = [gpu(0), gpu(1)]
    same = {0: {"enabled": True, "devices": {"1g.10gb": 7}}, 1: {"enabled": True, "devices": {"1g.10gb": 7}}}
    mixed = {0: {"enabled": True, "devices": {"1g.10gb": 7}}, 1: {"enabled": True, "devices": {"3g.40gb": 2}}}
    assert ml.strategy_problems("single", gpus, same, "n", "c") == []
    assert "use migStrategy mixed" in ml.strategy_problems("single", gpus, mixed, "n", "c")[0]
    # Single also needs the GPUs the config leaves alone to match.
    assert "use migStrategy mixed" in ml.strategy_problems("single", gpus, {0: same[0]}, "n", "c")[0]
    assert ml.strategy_problems("mixed", gpus, mixed, "n", "c") == []
    assert "strategy is none" in ml.strategy_problems("none", gpus, mixed, "n", "c")[0]
    assert ml.strategy_problems("none", gpus, {0: {"enabled": False, "devices": {}}}, "n", "c") == []


def test_parse_lgi_and_list():
    lgi = """+----------------------------------------------------+
| GPU instances:                                     |
| GPU   Name          Profile  Instance   Placement  |
|                       ID       ID       Start:Size |
|====================================================|
|   0  MIG 3g.20gb       9        1          4:4     |
+----------------------------------------------------+
|   0  MIG 3g.20gb       9        2          0:4     |
+----------------------------------------------------+
"""
    assert ml.parse_lgi(lgi) == {0: [
        {"profile": "3g.20gb", "profile_id": 9, "gpu_instance_id": 1, "placement": [4, 4]},
        {"profile": "3g.20gb", "profile_id": 9, "gpu_instance_id": 2, "placement": [0, 4]}]}
    listing = ("GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-5c89852c-d268-c3f3-1b07-005d5ae1dc3f)\n"
               "  MIG 3g.20gb     Device  0: (UUID: MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f)\n"
               "  MIG 3g.20gb     Device  1: (UUID: MIG-cba663e8-9bed-5b25-b243-5985ef7c9beb)\n"
               "GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-1d5b8b2c-0000-0000-0000-000000000000)\n")
    parsed = ml.parse_list(listing)
    assert [g["index"] for g in parsed] == [0, 1]
    assert parsed[0]["mig_devices"][1] == {"profile": "3g.20gb", "device": 1,
                                           "uuid": "MIG-cba663e8-9bed-5b25-b243-5985ef7c9beb"}
    assert parsed[1]["mig_devices"] == []
    assert ml.mode_of("[N/A]") is None and ml.mode_of(" Enabled") == "enabled"


def test_plan_changes_only_what_differs():
    gpus = [gpu(0, "enabled", ["3g.40gb", "3g.40gb"]), gpu(1, "enabled", ["1g.10gb"] * 7), gpu(2), gpu(3, "enabled")]
    wanted = {0: {"enabled": True, "devices": {"3g.40gb": 2}}, 1: {"enabled": True, "devices": {"3g.40gb": 2}},
              2: {"enabled": True, "devices": {"7g.80gb": 1}}, 3: {"enabled": False, "devices": {}}}
    actions = {a["index"]: a for a in ml.plan(gpus, wanted)}
    assert 0 not in actions
    assert actions[1]["mode"] is None and actions[1]["destroy"] and actions[1]["create"]
    assert actions[2]["mode"] == "enable" and not actions[2]["destroy"] and actions[2]["create"]
    assert actions[3]["mode"] == "disable" and not actions[3]["destroy"] and not actions[3]["create"]
    # A mode already switched but pending needs no new switch, only to become effective.
    pending = ml.plan([gpu(0, "disabled", pending="enabled")], {0: {"enabled": True, "devices": {}}})
    assert pending[0]["mode"] is None and pending[0]["after"]["enabled"]


def test_expected_resources_by_strategy():
    layout = {0: {"enabled": True, "devices": {"1g.10gb": 7}}, 1: {"enabled": True, "devices": {"1g.10gb+me": 1}},
              2: {"enabled": False, "devices": {}}}
    assert ml.expected_resources("mixed", layout, 3) == {"nvidia.com/gpu": 1, "nvidia.com/mig-1g.10gb": 7,
                                                         "nvidia.com/mig-1g.10gb.me": 1}
    assert ml.expected_resources("single", {0: layout[0]}, 1) == {"nvidia.com/gpu": 7}
    assert ml.expected_resources("none", layout, 3) == {"nvidia.com/gpu": 3}


def test_report_counts_summarises_and_names_the_problems():
    from ansible_collections.gpu_ops.cluster.plugins.filter.mig import nvidia_mig_report

    report = nvidia_mig_report({
        "gpu-h100-0": {"config": "lab-mixed", "state": "changed", "gpus_changed": [0, 1], "rebooted": True},
        "gpu-h100-1": {"config": "lab-mixed", "state": "unchanged", "gpus_changed": []},
        "gpu-a100-0": {"config": "big", "state": "refused", "step": "Read the GPUs and plan the layout",
                       "reason": "node gpu-a100-0, GPU 0: does not fit", "gpus_changed": []},
    })
    assert report["counts"] == {"unchanged": 1, "changed": 1, "refused": 1, "failed": 0}
    assert report["summary"][1] == "gpu-h100-0: lab-mixed changed on GPUs 0, 1 (rebooted)"
    assert report["problems"] == ['gpu-a100-0: big refused at "Read the GPUs and plan the layout": '
                                  'node gpu-a100-0, GPU 0: does not fit']
    assert report["summary"][-1] == "1 unchanged, 1 changed, 1 refused, 0 failed"
    check = nvidia_mig_report({"n": {"config": "c", "state": "changed", "gpus_changed": [2]}}, True)
    assert check["summary"][0] == "n: c would change on GPUs 2" and check["check_mode"] is True
    failed = nvidia_mig_report({"n": {"config": "c", "state": "failed", "step": "s", "reason": "r"}})
    assert failed["problems"] == ['n: c failed at "s": r (left cordoned, nvidia.com/mig.config.state=failed)']
    with pytest.raises(Exception, match="has state 'odd'"):
        nvidia_mig_report({"n": {"state": "odd"}})
