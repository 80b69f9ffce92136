"""The node-label module's decisions (which nodes get a patch, of what) and its result shape, which the drift runner
reads like a kubernetes.core.k8s multi-object result. The lab's integration tests run it against the real API server
(every cluster.yml run labels the GPU nodes through it) and bench/lab_scale.py at a thousand nodes."""

from __future__ import annotations

import json

import pytest

from conftest import REPO_ROOT, ModuleRunner, load_ansible_module, load_source

labels_module = load_ansible_module("k8s_node_labels")
load_source("gpu_ops_run", REPO_ROOT / "runner" / "gpu_ops_run.py")
drift = load_source("gpu_ops_drift", REPO_ROOT / "runner" / "gpu_ops_drift.py")


def test_only_nodes_with_a_differing_label_get_a_patch_of_only_those_labels():
    wanted = {"gpu-0": {"a": "1", "b": "2"}, "gpu-1": {"a": "1", "b": "2"}, "gpu-2": {"a": "1", "gone": None},
              "gpu-3": {"a": "1", "gone": None}, "gpu-9": {"a": "1"}}
    current = {"gpu-0": {"a": "1", "b": "2", "user": "x"}, "gpu-1": {"a": "1", "b": "3"},
               "gpu-2": {"a": "1"}, "gpu-3": {"a": "1", "gone": "yes"}, "cpu-0": {}}
    patches, missing = labels_module.label_patches(wanted, current)
    assert patches == {"gpu-1": {"b": "2"}, "gpu-3": {"gone": None}}
    assert missing == ["gpu-9"]


def test_a_converged_cluster_needs_no_patch_at_any_size():
    wanted = {f"gpu-{i}": {"gpu-ops.dev/device-plugin": "true"} for i in range(1000)}
    current = {name: {"gpu-ops.dev/device-plugin": "true", "kubernetes.io/hostname": name} for name in wanted}
    assert labels_module.label_patches(wanted, current) == ({}, [])


def test_label_values_must_be_strings_or_null_and_the_message_names_the_path():
    problems = labels_module.label_problems({"gpu-0": {"count": 8, "ok": "true", "rm": None}, "gpu-1": "x"})
    assert problems == ["labels.gpu-0.count=8; allowed: a string (quote numbers and booleans) or null",
                        'labels.gpu-1="x"; allowed: a mapping of label key to a string or null']


def test_the_entry_diffs_only_owned_labels_and_keeps_only_the_projects_annotations():
    entry = labels_module.node_entry(
        "gpu-1", {"b": "2", "gone": None}, {"a": "1", "b": "3", "gone": "yes", "user": "x"},
        {"gpu-ops.dev/drift-opt-out-until": "2030-01-01", "node.alpha.kubernetes.io/ttl": "0"},
        owned={"a": "1", "b": "2", "gone": None})
    assert entry["diff"] == {"before": {"metadata": {"labels": {"a": "1", "b": "3", "gone": "yes"}}},
                             "after": {"metadata": {"labels": {"a": "1", "b": "2"}}}}
    assert entry["result"]["metadata"]["annotations"] == {"gpu-ops.dev/drift-opt-out-until": "2030-01-01"}


def test_the_drift_runner_reports_each_relabelled_node_with_its_opt_out():
    entry = labels_module.node_entry("gpu-1", {"b": "2"}, {"b": "3"},
                                     {"gpu-ops.dev/drift-opt-out-until": "2030-01-01"}, owned={"b": "2"})
    res = {"changed": True, "changed_nodes": ["gpu-1"], "result": {"results": [entry]}}
    events = [
        {"event": "playbook_on_task_start", "event_data": {"task": "Label the nodes", "task_uuid": "l1",
                                                           "role": "gpu_ops.cluster.gpu_scheduling"}},
        {"event": "runner_on_ok", "event_data": {"host": "localhost", "task": "Label the nodes", "task_uuid": "l1",
                                                 "resolved_action": "gpu_ops.cluster.k8s_node_labels", "res": res}},
    ]
    (item,) = drift.items_from_events(events).items
    assert item.resource == "Node/gpu-1" and item.role == "gpu_scheduling"
    assert item.diff == [{"path": "metadata.labels.b", "before": "3", "after": "2"}]
    assert item.opt_out_annotations == {"gpu-ops.dev/drift-opt-out-until": "2030-01-01"}


@pytest.fixture
def module(patched_ansible_module) -> ModuleRunner:
    return ModuleRunner(labels_module, patched_ansible_module)


def test_bad_input_is_refused_before_the_cluster_is_asked(module, tmp_path):
    kubeconfig = tmp_path / "missing-kubeconfig"  # never read: the input check comes first
    result = module.fail({"kubeconfig": str(kubeconfig), "labels": {"gpu-0": {"x": True}}, "workers": 0})
    assert result["msg"] == ("labels.gpu-0.x=true; allowed: a string (quote numbers and booleans) or null; "
                             "workers=0; allowed: a positive integer")


def test_an_unreachable_cluster_is_a_clear_failure(module, tmp_path):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {}}], "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    result = module.fail({"kubeconfig": str(kubeconfig), "labels": {"gpu-0": {"x": "1"}}})
    assert result["msg"].startswith("cannot reach the cluster:") and "127.0.0.1" in result["msg"]
